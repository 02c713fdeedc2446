"""Per-turn credit (``reward.credit``) in verl 0.9.1's real AgentLoopWorker on the CPU: each
turn's score on that turn's last generated token of ``rm_scores``, in a batch that mixes
rows with turn scores and outcome-only rows; positions checked against the batch's mask."""

from __future__ import annotations

import copy
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from verl_helpers import (
    AGENT,
    SCRIPTS,
    agent_field,
    make_batch,
    make_worker,
    task,
    trainer_config,
    write_loop_yaml,
)

from uniagent import RewardSpec, hookimpl
from uniagent.plugins import load_plugins, reset_plugins
from uniagent.reward import RewardContext, RewardResult
from uniagent.verl.credit import credits
from uniagent.verl.metrics import place_token_scores
from uniagent.verl.testing import ScriptedTokenServer


async def turn_reward(ctx: RewardContext[None]) -> RewardResult:
    """1.0 when marker.txt exists; the task's ``credit_turns`` ("0:0.5,1:0.25") per turn."""
    done = await ctx.require_sandbox().run("test -f marker.txt", timeout=30)
    spec = str(ctx.task.get("credit_turns") or "")
    turns = {int(k): float(v) for k, v in (p.split(":") for p in spec.split(",") if p)}
    return RewardResult(1.0 if done.exit_code == 0 else 0.0, turn_scores=turns)


@pytest.fixture(autouse=True)
def turn_plugin() -> Iterator[None]:
    reset_plugins()

    @hookimpl
    def uniagent_rewards() -> list[RewardSpec[Any]]:
        return [RewardSpec(name="turns", fn=turn_reward)]

    load_plugins().register(types.SimpleNamespace(uniagent_rewards=uniagent_rewards), "turns")
    yield
    reset_plugins()


def mask_runs(mask: list[int]) -> list[int]:
    """The last index of each run of 1s in a response mask (one run per model turn)."""
    return [i for i, m in enumerate(mask) if m and (i + 1 == len(mask) or not mask[i + 1])]


def test_discounted_credit_is_the_return_from_each_turn() -> None:
    assert credits({0: 1.0, 2: 4.0}, 3, "turn", 0.5) == [1.0, 0.0, 4.0]
    assert credits({0: 1.0, 2: 4.0}, 3, "discounted", 0.5) == [2.0, 2.0, 4.0]
    assert credits({0: 1.0}, 2, "outcome", 0.5) == [0.0, 0.0]


async def test_turn_scores_reach_rm_scores_at_each_turns_last_generated_token(
    tmp_path: Path, verl_model_dir: Path, qwen3_tokenizer: Any
) -> None:
    agent = {**AGENT, "reward": {"name": "turns", "credit": "turn"}}
    loop_yaml = write_loop_yaml(tmp_path, agent)
    tasks = [
        task("fin", "[script:finish]", credit_turns="0:0.5,1:0.25"),
        task("plain", "[script:finish]"),  # outcome only: no turn scores
        task("loop", "[script:loop]", credit_turns="0:0.1,2:-0.3,7:9"),  # turn 7 never ran
    ]
    batch = make_batch(tmp_path, qwen3_tokenizer, tasks)
    server = ScriptedTokenServer(str(verl_model_dir), SCRIPTS, global_steps=1)
    config = trainer_config(verl_model_dir, loop_yaml, response_length=512)
    out = await make_worker(config, server).generate_sequences(batch)
    outcome_only = out.batch["rm_scores"].clone()
    # The fully async trainer places them as it takes a batch from its queue (before its
    # reward step), on a copy here: the same positions as the classic trainers' manager.
    from uniagent.verl.fully_async import AgentMetricsTrainer

    taken = copy.deepcopy(out)
    taken.meta_info["trajectory_param_versions"] = [1] * len(taken)
    trainer = object.__new__(AgentMetricsTrainer)  # what the method reads, only
    trainer.__dict__.update(current_param_version=1, stale_trajectory_processed=0)
    trainer.metrics_aggregator = types.SimpleNamespace(aggregation_rules={})
    step_metrics: dict[str, Any] = {}
    trainer._collect_metrics_from_samples(taken, step_metrics)
    assert step_metrics["agent/samples"] == 3
    assert place_token_scores(out) == 4
    assert place_token_scores(out) == 0, "placed once per batch"
    assert torch.equal(taken.batch["rm_scores"], out.batch["rm_scores"])

    assert agent_field(out, "exit_reason") == ["finished", "finished", "max_step_limit"]
    assert list(out.non_tensor_batch["turn_scores"]) == [[0.5, 0.25], [], [0.1, 0.0, -0.3]]
    expected_turns = [{0: 0.5, 1: 0.25}, {}, {0: 0.1, 2: -0.3}]
    outcomes = [1.0, 1.0, 0.0]
    prompt_length = out.batch["prompts"].shape[1]
    for i, (turns, outcome) in enumerate(zip(expected_turns, outcomes, strict=True)):
        n = int(out.batch["attention_mask"][i][prompt_length:].sum())
        mask = out.batch["response_mask"][i][:n].tolist()
        ends = mask_runs(mask)
        assert len(ends) == agent_field(out, "turns")[i]  # one run of generated tokens a turn
        want = [0.0] * out.batch["rm_scores"].shape[1]
        want[n - 1] += outcome  # the episode's reward on the last token, as before
        for turn, score in turns.items():
            want[ends[turn]] += score
            assert mask[ends[turn]] == 1
        assert out.batch["rm_scores"][i].tolist() == pytest.approx(want)
        # Without placing, the batch is today's: the outcome on the last token only.
        today = [0.0] * (n - 1) + [outcome] + [0.0] * (512 - n)
        assert outcome_only[i].tolist() == pytest.approx(today)
