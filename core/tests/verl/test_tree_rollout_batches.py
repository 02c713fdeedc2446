"""Tree rollouts (``interaction.branching``) in verl batches: one sample per leaf, each with
its own reward, all in the row's GRPO group; ``tree_advantage`` says what the loss sees.

Real parts: verl 0.9.1's ``AgentLoopWorker`` on the CPU (:class:`TreeAgentLoopWorker`, the
worker taking several outputs of one ``run``), the real Qwen3 tokenizer, host sandboxes and
their forks, the ``command`` reward, verl's own ``compute_advantage``. The policy is a
scripted token server whose turn-2 replies differ per branch. Masks are checked against the
server's own record of what it generated, not against the tree.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from verl_helpers import (
    AGENT,
    agent_field,
    make_batch,
    make_loop,
    task,
    trainer_config,
    unpad,
    write_loop_yaml,
)

from uniagent.testing.scripted import hermes_call
from uniagent.verl.metrics import place_token_scores
from uniagent.verl.testing import ScriptedTokenServer

#: The branch's turn-2 command and the reward it earns (the task: create marker.txt).
BRANCHES = {
    "echo a > marker.txt": 1.0,
    "echo b > other.txt": 0.0,
    "echo c > marker.txt": 1.0,
    "echo d > other.txt": 0.0,
}
FIRST = hermes_call("execute_bash", {"command": "echo start > notes.txt"}, "Let me start.")
FINISH = hermes_call("finish", {"answer": "done"})
TREE_AGENT = {**AGENT, "interaction": {**AGENT["interaction"], "branching": {
    "at_turns": [2], "width": 4}}}  # fmt: skip


class BranchingServer(ScriptedTokenServer):
    """Turn 1 is shared; each request for turn 2 gets the next command of ``BRANCHES`` (the
    order the branches ask in does not change which ones there are); then ``finish``."""

    def __init__(self, tokenizer_path: str) -> None:
        super().__init__(tokenizer_path, {})
        self.pending = list(BRANCHES)

    def reply(self, prompt_text: str) -> tuple[int, str]:
        turn = max(0, prompt_text.count(self.assistant_marker) - 1)
        if turn == 0:
            return turn, FIRST
        if turn == 1:
            return turn, hermes_call("execute_bash", {"command": self.pending.pop(0)})
        return turn, FINISH


def generated(prompt: list[int], response: list[int], calls: Sequence[Any]) -> tuple[list, list]:
    """Mask and log-probs over ``response`` of what the server generated on this sequence."""
    full = prompt + response
    mask, logprobs = [0] * len(full), [0.0] * len(full)
    for call in calls:
        start, end = len(call.prompt_ids), len(call.prompt_ids) + len(call.token_ids)
        if full[:start] == call.prompt_ids and full[start:end] == call.token_ids:
            mask[start:end] = [1] * len(call.token_ids)
            logprobs[start:end] = call.log_probs
    return mask[len(prompt) :], logprobs[len(prompt) :]


def prefix_advantages(rows: Sequence[tuple], rewards: Sequence[float]) -> list[list[float]]:
    """The tree advantage by its definition, from the samples alone: the leaves sharing a
    sample's tokens up to position p are the node's; its value is their mean reward, its
    parent's the mean of the leaves sharing the tokens before the node (all: the root)."""
    seqs = [(r[0] + r[1], [0] * len(r[0]) + r[2]) for r in rows]

    def sharing(i: int, p: int) -> frozenset[int]:
        ids, mask = seqs[i]
        return frozenset(
            j
            for j, (other, other_mask) in enumerate(seqs)
            if other[: p + 1] == ids[: p + 1] and other_mask[: p + 1] == mask[: p + 1]
        )

    def mean(leaves: frozenset[int]) -> float:
        return sum(rewards[j] for j in leaves) / len(leaves)

    out = []
    for i, row in enumerate(rows):
        start = len(row[0])
        sets = [sharing(i, p) for p in range(len(seqs[i][0]))]
        advantages = []
        for p in range(start, len(seqs[i][0])):
            parent = next(
                (sets[q] for q in range(p - 1, -1, -1) if sets[q] != sets[p]),
                frozenset(range(len(rows))),
            )
            advantages.append(mean(sets[p]) - mean(parent) if seqs[i][1][p] else 0.0)
        out.append(advantages)
    return out


async def tree_batch(
    folder: Path, model_dir: Path, tokenizer: Any, mode: str, estimator: str
) -> tuple[Any, Any, BranchingServer, Any, Any]:
    """One task, one tree rollout (split at turn 2, width 4), through the worker."""
    from uniagent.verl.worker import TreeAgentLoopWorker

    folder.mkdir()
    loop_yaml = write_loop_yaml(folder, TREE_AGENT, tree_advantage=mode)
    config = trainer_config(model_dir, loop_yaml, overrides={"algorithm.adv_estimator": estimator})
    batch = make_batch(folder, tokenizer, [task("tree", "[tree]")])
    batch.non_tensor_batch["uid"] = np.array(["u-tree"], dtype=object)
    server = BranchingServer(str(model_dir))
    worker = TreeAgentLoopWorker(config, llm_client=server)
    out = await worker.generate_sequences(batch)
    place_token_scores(out)  # what UniAgentLoopManager does with the worker's batch
    return out, config, server, worker, batch


def check_leaves(out: Any, server: BranchingServer, tokenizer: Any) -> tuple[list, list]:
    """Four samples of one group, each with its own reward, token-exact, one prefix."""
    assert len(out) == 4
    assert list(out.non_tensor_batch["uid"]) == ["u-tree"] * 4
    assert agent_field(out, "exit_reason") == ["finished"] * 4, agent_field(out, "error")
    assert agent_field(out, "traj_masked") == [False] * 4
    assert agent_field(out, "branch") == [0, 1, 2, 3]
    assert agent_field(out, "branches") == [4] * 4
    rows = [unpad(out, i) for i in range(4)]
    rewards = []
    for i, (prompt, response, mask, logprobs, scores) in enumerate(rows):
        text = tokenizer.decode(response)
        (command,) = [c for c in BRANCHES if c in text]
        rewards.append(BRANCHES[command])
        assert sum(scores) == pytest.approx(BRANCHES[command]), i  # the leaf's own reward
        want_mask, want_logprobs = generated(prompt, response, server.calls)
        assert mask == want_mask, i  # exactly the generated tokens
        assert logprobs == pytest.approx(want_logprobs), i
    assert sorted(rewards) == [0.0, 0.0, 1.0, 1.0]
    # The shared prefix (turn 1, its output, turn 2's header) is the same in every sample;
    # turn 2's generation starts at the second run of mask 1.
    assert all(r[0] == rows[0][0] for r in rows)
    second = [next(p for p in range(1, len(r[2])) if r[2][p] and not r[2][p - 1]) for r in rows]
    assert len(set(second)) == 1
    start = second[0]
    assert all(r[1][:start] == rows[0][1][:start] for r in rows)
    assert all(r[2][:start] == rows[0][2][:start] for r in rows)
    first = [*tokenizer.encode(FIRST, add_special_tokens=False)]
    assert rows[0][1][: len(first)] == first
    return rows, rewards


async def test_a_tree_rollout_gives_a_sample_per_leaf_with_its_tree_advantages(
    tmp_path: Path, verl_model_dir: Path, qwen3_tokenizer: Any
) -> None:
    from verl.trainer.ppo.ray_trainer import compute_advantage

    out, config, server, worker, batch = await tree_batch(
        tmp_path / "tree", verl_model_dir, qwen3_tokenizer, "tree", "uniagent_tree"
    )
    rows, rewards = check_leaves(out, server, qwen3_tokenizer)

    out.batch["token_level_rewards"] = out.batch["rm_scores"]
    data = compute_advantage(out, adv_estimator="uniagent_tree", config=config.algorithm)
    want = prefix_advantages(rows, rewards)
    for i, row in enumerate(rows):
        n = len(row[1])
        got = data.batch["advantages"][i][:n].tolist()
        assert got == pytest.approx(want[i], abs=1e-6), i
        assert not any(data.batch["advantages"][i][n:].tolist())
        # By hand: turn 1 (shared by all: the tree's mean) gets 0; the leaf's own tokens at
        # the end get its reward minus the mean; nothing under mask 0.
        mask = row[2]
        assert got[: mask.index(0)] == [0.0] * mask.index(0)
        assert got[n - 1] == pytest.approx(rewards[i] - 0.5)  # the finish reply's last token
        assert all(a == 0.0 for a, m in zip(got, mask, strict=True) if not m)
        # The row still sums to the leaf's reward (verl's score metrics see it).
        assert sum(row[4]) == pytest.approx(rewards[i])

    # verl's v1 worker calls run with the row's uid and session_id: it gets the leaves as a
    # list, each output's rm_scores (as_dict: what it stores) holding the same advantages.
    server = BranchingServer(str(verl_model_dir))
    loop = make_loop(worker, config, server)
    kwargs = {k: v[0] for k, v in batch.non_tensor_batch.items() if k != "agent_name"}
    kwargs.update(uid="u-tree", session_id=0, global_steps=1)
    sampling = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": True}
    outputs = [o.as_dict() for o in await loop.run(sampling, **kwargs)]
    assert len(outputs) == 4
    v1_rows = [
        (o["prompts"].tolist(), o["responses"].tolist(), o["response_mask"].tolist())
        for o in outputs
    ]
    v1_rewards = [
        next(r for c, r in BRANCHES.items() if c in qwen3_tokenizer.decode(row[1]))
        for row in v1_rows
    ]
    assert sorted(v1_rewards) == [0.0, 0.0, 1.0, 1.0]
    for o, want_row, reward in zip(outputs, prefix_advantages(v1_rows, v1_rewards), v1_rewards,
                                   strict=True):  # fmt: skip
        scores = o["rm_scores"]
        assert (scores * o["response_mask"]).tolist() == pytest.approx(want_row, abs=1e-6)
        assert float(scores.sum()) == pytest.approx(reward)


async def test_plain_gives_each_leaf_its_reward_against_its_group(
    tmp_path: Path, verl_model_dir: Path, qwen3_tokenizer: Any
) -> None:
    from verl.trainer.ppo.ray_trainer import compute_advantage

    out, config, server, _, _ = await tree_batch(
        tmp_path / "plain", verl_model_dir, qwen3_tokenizer, "plain", "uniagent_grpo"
    )
    rows, rewards = check_leaves(out, server, qwen3_tokenizer)
    for row, reward in zip(rows, rewards, strict=True):
        assert row[4][len(row[1]) - 1] == reward  # the reward on the last token, only
    out.batch["token_level_rewards"] = out.batch["rm_scores"]
    data = compute_advantage(out, adv_estimator="uniagent_grpo", config=config.algorithm)
    std = float(np.std([1.0, 0.0, 1.0, 0.0], ddof=1))
    for i, row in enumerate(rows):
        got = data.batch["advantages"][i][: len(row[1])].tolist()
        want = (rewards[i] - 0.5) / (std + 1e-6)
        assert got == pytest.approx([want * m for m in row[2]], abs=1e-5), i


async def test_the_classic_worker_gets_the_roots_branch_and_bad_settings_are_refused(
    tmp_path: Path, verl_model_dir: Path, qwen3_tokenizer: Any
) -> None:
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    loop_yaml = write_loop_yaml(tmp_path, TREE_AGENT)
    config = trainer_config(
        verl_model_dir, loop_yaml, overrides={"algorithm.adv_estimator": "uniagent_grpo"}
    )
    batch = make_batch(tmp_path, qwen3_tokenizer, [task("tree", "[tree]")])
    server = BranchingServer(str(verl_model_dir))
    worker = AgentLoopWorker(config, llm_client=server)
    one = await worker.generate_sequences(batch)
    # One output per row: the root's own branch (the first turn-2 reply generated), with
    # its own reward.
    assert len(one) == 1 and agent_field(one, "branch") == [0]
    assert agent_field(one, "branches") == [1]
    prompt, response, mask, _, scores = unpad(one, 0)
    text = qwen3_tokenizer.decode(response)
    assert list(BRANCHES)[0] in text and sum(scores) == BRANCHES[list(BRANCHES)[0]]
    assert mask == generated(prompt, response, server.calls)[0]

    def refused(estimator: str, message: str, **entry: Any) -> None:
        folder = tmp_path / f"{estimator}-{len(entry)}-{sorted(entry)}"
        folder.mkdir()
        path = write_loop_yaml(folder, TREE_AGENT, **entry)
        bad = trainer_config(verl_model_dir, path, overrides={"algorithm.adv_estimator": estimator})
        AgentLoopWorker(bad, llm_client=server)  # loads the entry into verl's registry
        with pytest.raises(Exception, match=message):
            make_loop(worker, bad, server)

    refused("grpo", "need algorithm.adv_estimator=uniagent_grpo")  # v1: last leaf's for all
    refused("uniagent_grpo", "needs algorithm.adv_estimator=uniagent_tree, not 'uniagent_grpo'",
            tree_advantage="tree")  # fmt: skip
    refused("uniagent_tree", "it needs tree_advantage: tree")
    refused("uniagent_tree", "tree_advantage must be one of 'plain', 'tree', not 'treerl'",
            tree_advantage="treerl")  # fmt: skip
