"""A saved tree as verl samples (``uniagent.verl.branches``): order, masks, weights, settings."""

from __future__ import annotations

import pytest

from uniagent.errors import ConfigError
from uniagent.gateway.tree import TrajectoryTree, Turn
from uniagent.verl.branches import (
    TAKES_LISTS,
    TreeSettings,
    branch_samples,
    worker_takes_lists,
)

PROMPT, FIRST, OBS, OBS_FORK, REPLY, REPLY_FORK = [1, 2], [3, 4], [5], [6, 7], [8], [9, 10]


def forked_tree() -> dict:
    """prompt → first reply (generated) → two observations, each answered; the branch
    that ``leaves()`` lists first is the one served last (it goes on after the fork)."""
    tree = TrajectoryTree()
    served = 0

    def serve(ids: list[int], mask: list[int], prompt_len: int) -> None:
        nonlocal served
        node = tree.insert(ids, mask, [-0.5 if m else 0.0 for m in mask])
        turn = Turn(served, "chat", {}, prompt_len, sum(mask[prompt_len:]), "render", "stop")
        tree.record(node, turn)
        served += 1

    serve(PROMPT + FIRST, [0, 0, 1, 1], 2)
    serve(PROMPT + FIRST + OBS + REPLY, [0, 0, 1, 1, 0, 1], 5)
    serve(PROMPT + FIRST + OBS_FORK + REPLY_FORK, [0, 0, 1, 1, 0, 0, 1, 1], 6)
    serve(PROMPT + FIRST + OBS + REPLY + [11, 12], [0, 0, 1, 1, 0, 1, 0, 1], 7)
    return tree.to_dict()


MAIN = FIRST + OBS + REPLY + [11, 12]
FORK = FIRST + OBS_FORK + REPLY_FORK


def test_one_sample_per_branch_the_last_served_last() -> None:
    tree = forked_tree()
    leaves = TrajectoryTree.from_dict(tree).leaves()
    assert [leaf.ids[-1] for leaf in leaves] == [12, 10]  # the main branch is listed first
    samples = branch_samples(tree)
    assert [s.prompt_ids for s in samples] == [PROMPT, PROMPT]
    assert [s.response_ids for s in samples] == [FORK, MAIN]
    assert samples[0].response_mask == [1, 1, 0, 0, 1, 1]
    assert samples[1].response_mask == [1, 1, 0, 1, 0, 1]
    assert [s.turns for s in samples] == [2, 3]  # the first reply's turn is on both paths
    assert samples[0].response_logprobs == [-0.5, -0.5, 0.0, 0.0, -0.5, -0.5]
    assert [s.response_weights for s in samples] == [[1.0] * 6, [1.0] * 6]


def test_one_over_k_trains_a_shared_token_once_in_the_last_sample() -> None:
    plain = branch_samples(forked_tree())
    samples = branch_samples(forked_tree(), shared_weight="1/k")
    assert samples[1].response_mask == plain[1].response_mask
    assert samples[0].response_mask == [0, 0, 0, 0, 1, 1]  # the shared first reply: not here
    assert samples[0].response_weights == [0.5, 0.5, 1.0, 1.0, 1.0, 1.0]
    assert samples[1].response_weights == [0.5, 0.5, 1.0, 1.0, 1.0, 1.0]
    # Every generated token (a token with its context) is trained as often as its 1/k
    # weights add up to over the samples: once.
    trained: dict[tuple[int, ...], int] = {}
    weight: dict[tuple[int, ...], float] = {}
    for s, p in zip(samples, plain, strict=True):
        for pos, (m, w) in enumerate(zip(s.response_mask, s.response_weights, strict=True)):
            if p.response_mask[pos]:
                key = tuple(s.prompt_ids + s.response_ids[: pos + 1])
                trained[key] = trained.get(key, 0) + m
                weight[key] = weight.get(key, 0.0) + w
    assert len(trained) == 2 + 2 + 2  # the first reply, the fork's reply, the main two
    assert set(trained.values()) == {1} and set(weight.values()) == {1.0}


def test_the_policy_cannot_choose_how_many_samples_its_episode_gives() -> None:
    """A harness's commands can reach its gateway session and make branches: at most
    ``max_branches`` samples, the last-served ones, the last-served branch last; under
    "1/k" the shared tokens stay trained in a sample that is kept."""
    assert [s.response_ids for s in branch_samples(forked_tree(), limit=1)] == [MAIN]
    capped = branch_samples(forked_tree(), shared_weight="1/k", limit=1)
    assert capped[0].response_mask == branch_samples(forked_tree())[1].response_mask
    assert len(branch_samples(forked_tree(), limit=8)) == 2
    assert TreeSettings.pop_from({"max_branches": 3}, source="s").max_branches == 3
    assert TreeSettings().max_branches == 8
    for bad in (0, True, "2"):
        with pytest.raises(ConfigError, match=r"s: max_branches must be a whole number >= 1"):
            TreeSettings.pop_from({"max_branches": bad}, source="s")


def test_settings_come_from_the_loop_entry_and_bad_values_name_the_key() -> None:
    kwargs = {"shared_weight": "1/k", "branches": "last", "tools": ["x"]}
    assert TreeSettings.pop_from(kwargs, source="agent loop 'u'") == TreeSettings("last", "1/k")
    assert kwargs == {"tools": ["x"]}  # the rest is the agent config's
    assert TreeSettings.pop_from({"shared_weight": 1}, source="s").shared_weight == "1"
    assert TreeSettings.pop_from({}, source="s") == TreeSettings("all", "1")
    with pytest.raises(ConfigError, match=r"agent loop 'u': shared_weight must be one of"):
        TreeSettings.pop_from({"shared_weight": "half"}, source="agent loop 'u'")
    with pytest.raises(ConfigError, match=r"branches must be one of 'all', 'last', not True"):
        TreeSettings.pop_from({"branches": True}, source="s")


def test_which_workers_take_several_outputs() -> None:
    assert not worker_takes_lists({"uid": "u", "index": 0})  # verl's classic worker
    assert worker_takes_lists({"uid": "u", "session_id": 0})  # verl's v1 worker
    token = TAKES_LISTS.set(True)  # TreeAgentLoopWorker
    try:
        assert worker_takes_lists({})
    finally:
        TAKES_LISTS.reset(token)
