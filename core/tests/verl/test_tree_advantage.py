"""Tree advantages (``tree_advantage: tree``): node values, per-token advantages, the
scores that deliver them to verl, and the ``uniagent_tree`` estimator."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from uniagent.errors import ConfigError
from uniagent.verl.branches import TreeSettings
from uniagent.verl.tree_advantage import leaf_advantages, tree_token_scores

P = [1, 2]  # the prompt (mask 0)
OBS = [5]  # a tool's output (mask 0)


def run(*parts: tuple[list[int], int]) -> tuple[list[int], list[int]]:
    ids: list[int] = []
    mask: list[int] = []
    for tokens, m in parts:
        ids += tokens
        mask += [m] * len(tokens)
    return ids, mask


#: Two branch points: after the prompt (first reply [3, 4] or [8]) and, under [3, 4],
#: after the tool's output (second reply [6] or [7]).
A = run((P, 0), ([3, 4], 1), (OBS, 0), ([6], 1))
B = run((P, 0), ([3, 4], 1), (OBS, 0), ([7], 1))
C = run((P, 0), ([8], 1), (OBS, 0), ([9], 1))
D = run((P, 0), ([8], 1), (OBS, 0), ([10], 1))


def test_a_nodes_advantage_is_its_value_minus_its_parents() -> None:
    """V(root) = mean(1, 0, 1, 0) = 0.5; V([3,4,5]) = 0.5, V([8,5]) = 0.5; leaves: own."""
    out = leaf_advantages([A, B, C, D], [1.0, 0.0, 1.0, 0.0], [True] * 4)
    assert out[0] == [0, 0, 0.0, 0.0, 0, 0.5]
    assert out[1] == [0, 0, 0.0, 0.0, 0, -0.5]
    assert out[2] == [0, 0, 0.0, 0, 0.5]
    assert out[3] == [0, 0, 0.0, 0, -0.5]
    # Along a path the advantages of its segments add up to its reward minus the mean.
    rewards = [1.0, 0.5, 0.0, 0.0]
    out = leaf_advantages([A, B, C, D], rewards, [True] * 4)
    root = sum(rewards) / 4  # 0.375
    first = 0.75 - root  # V([3,4,5]) = mean(1, 0.5)
    assert out[0] == pytest.approx([0, 0, first, first, 0, 1.0 - 0.75])
    assert out[1] == pytest.approx([0, 0, first, first, 0, 0.5 - 0.75])
    assert out[2] == pytest.approx([0, 0, 0.0 - root, 0, 0.0])
    for adv, reward, (_, mask) in zip(out, rewards, [A, B, C, D], strict=True):
        per_segment = {a for a, m in zip(adv, mask, strict=True) if m}
        assert sum(per_segment) == pytest.approx(reward - root) or reward == 0.0


def test_observed_tokens_get_nothing_and_a_node_spans_its_generated_tokens() -> None:
    out = leaf_advantages([A, C], [1.0, 0.0], [True, True])
    assert out[0] == [0, 0, 0.5, 0.5, 0, 0.5]  # [3,4,5,6] is one node: leaf A's own
    assert out[1] == [0, 0, -0.5, 0, -0.5]


def test_masked_leaves_count_for_no_value() -> None:
    """D is masked: the others get exactly what the tree without D gives them (the root's
    mean is over A, B, C; [8,5,9] is one node, C's own); D's advantages are 0."""
    rewards = [1.0, 0.0, 1.0, 0.0]
    out = leaf_advantages([A, B, C, D], rewards, [True, True, True, False])
    alone = leaf_advantages([A, B, C], rewards[:3], [True] * 3)
    assert out[:3] == alone
    root = 2 / 3
    assert out[0] == pytest.approx([0, 0, 0.5 - root, 0.5 - root, 0, 0.5])
    assert out[2] == pytest.approx([0, 0, 1 - root, 0, 1 - root])
    assert out[3] == [0.0] * 5
    # A leaf without a reward or without tokens counts for nothing either.
    assert leaf_advantages([A, B, C, None], [*rewards[:3], 1.0], [True] * 4)[:3] == alone
    assert leaf_advantages([A, B, C, D], [*rewards[:3], None], [True] * 4)[:3] == alone
    # Every leaf masked: nothing anywhere.
    assert all(not any(a) for a in leaf_advantages([A, B], [1.0, 0.0], [False, False]))


def test_identical_leaves_share_their_node() -> None:
    out = leaf_advantages([A, A, C], [1.0, 0.0, 1.0], [True] * 3)
    root = 2 / 3
    assert out[0] == out[1] == pytest.approx([0, 0, 0.5 - root, 0.5 - root, 0, 0.5 - root])
    assert out[2] == pytest.approx([0, 0, 1 - root, 0, 1 - root])


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="2 runs, 1 rewards"):
        leaf_advantages([A, B], [1.0], [True, True])
    with pytest.raises(ValueError, match="mask entries"):
        leaf_advantages([([1, 2], [0])], [1.0], [True])
    with pytest.raises(ValueError, match="advantages for a response"):
        tree_token_scores([0.1], [1, 1], 1.0)


def test_token_scores_make_each_trained_token_its_advantage_and_the_row_its_reward() -> None:
    mask = [1, 1, 0, 0, 1]
    adv = [0.25, 0.25, 0.0, 0.0, -0.5]
    additions, balanced = tree_token_scores(adv, mask, 1.0)
    row = [0.0, 0.0, 0.0, 0.0, 1.0]  # verl puts the reward on the last response token
    for position, value in additions:
        row[int(position)] += value
    assert balanced and row == [0.25, 0.25, 0.0, 1.0, -0.5]  # the rest on the last mask 0
    assert sum(row) == pytest.approx(1.0)
    # The last token under mask 0 (the reward's own position): it holds the rest.
    additions, _ = tree_token_scores([0.5, 0.0], [1, 0], 1.0)
    assert additions == [[0, 0.5], [1, -0.5]]
    # No untrained token: the row is its advantages.
    additions, balanced = tree_token_scores([0.5, 0.5], [1, 1], 1.0)
    assert not balanced and additions == [[0, 0.5], [1, -0.5]]
    # A masked sample (mask all 0, reward 0.0): nothing to add.
    assert tree_token_scores([0.3, 0.0], [0, 0], 0.0) == ([], True)


def test_the_tree_estimator_reads_trained_tokens_scores_as_advantages() -> None:
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn

    from uniagent.verl.advantage import TREE_ESTIMATOR_NAME, compute_tree_advantage

    assert get_adv_estimator_fn(TREE_ESTIMATOR_NAME) is compute_tree_advantage
    rewards = torch.tensor([[0.25, 0.25, 1.0, -0.5, 0.0], [0.0, 0.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0, 1, 0], [0, 0, 0, 0, 0]])
    advantages, returns = compute_tree_advantage(
        token_level_rewards=rewards, response_mask=mask, index=np.array(["u", "u"])
    )
    assert advantages.tolist() == [[0.25, 0.25, 0.0, -0.5, 0.0], [0.0] * 5]
    assert torch.equal(advantages, returns)


def test_tree_advantage_setting() -> None:
    assert TreeSettings().tree_advantage == "plain"
    kwargs = {"tree_advantage": "tree", "tools": ["x"]}
    assert TreeSettings.pop_from(kwargs, source="s").tree_advantage == "tree"
    assert kwargs == {"tools": ["x"]}
    with pytest.raises(ConfigError, match=r"agent loop 'u': tree_advantage must be one of "
                                          r"'plain', 'tree', not 'treerl'"):  # fmt: skip
        TreeSettings.pop_from({"tree_advantage": "treerl"}, source="agent loop 'u'")
