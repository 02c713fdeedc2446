"""Batches mixing uniagent rows with verl's own ``single_turn_agent`` rows.

verl's ``AgentLoopManager`` splits a batch over its workers and joins the chunks with
``DataProto.concat``, which needs every chunk to have the same columns. Here verl's real
manager code runs with in-process workers (the Ray ``.remote`` dispatch is the one seam;
``test_through_ray_agent_loop_manager`` below uses real Ray actors), verl's real reward
loop scores the GSM8K rows as in training (``main_ppo`` streams rewards in the agent-loop
workers), and every order of two uniagent and two single-turn rows runs with 1, 2 and 4
workers.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from verl_helpers import (
    AGENT,
    SCRIPTS,
    gsm8k_row,
    make_batch,
    task,
    trainer_config,
    write_loop_yaml,
)

from uniagent.verl.output import extras_record
from uniagent.verl.testing import ScriptedTokenServer

GSM8K_SCRIPT = {"[script:gsm8k]": ["Six times seven. #### 42"]}


class InProcessActor:
    """A real verl worker object behind Ray's ``handle.method.remote(...)`` call syntax."""

    def __init__(self, target: Any) -> None:
        self._target = target

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._target, name)

        class _Remote:
            @staticmethod
            def remote(*args: Any, **kwargs: Any) -> Any:
                return method(*args, **kwargs)  # a coroutine: the caller awaits it

        return _Remote


def mixed_batch(tmp_path: Path, tokenizer: Any) -> Any:
    """Rows 0-1: uniagent (one finishes, one fails its setup); rows 2-3: GSM8K single turn."""
    loop_yaml = write_loop_yaml(tmp_path, AGENT)
    tasks = [
        task("fin", "[script:finish]"),
        task("broken", "[script:finish]", tools_kwargs={"env": {"post_setup": ["false"]}}),
    ]
    others = [
        gsm8k_row("[script:gsm8k] What is six times seven?", "42"),
        gsm8k_row("[script:gsm8k] Six times seven, please.", "41"),  # wrong ground truth: 0.0
    ]
    return loop_yaml, make_batch(tmp_path, tokenizer, tasks, others)


#: (agent loop, reward, masked) of rows 0..3 of :func:`mixed_batch`.
EXPECTED = [
    ("uniagent", 1.0, False),
    ("uniagent", 0.0, True),
    ("single", 1.0, None),
    ("single", 0.0, None),
]


def manager_in_process(config: Any, server: Any, workers: Sequence[Any], reward: Any) -> Any:
    """verl's AgentLoopManager over the given in-process workers."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopManager

    manager = AgentLoopManager(config, llm_client=server, reward_loop_worker_handles=[reward])
    manager.agent_loop_workers = [InProcessActor(w) for w in workers]
    return manager


def check_rows(out: Any, order: Sequence[int], case: str) -> None:
    """Row i of the output is input row order[i], with its loop's fields, reward and mask."""
    scores = out.batch["rm_scores"].sum(dim=1).tolist()
    trained = out.batch["response_mask"].sum(dim=1).tolist()
    for i, row in enumerate(order):
        loop, reward, masked = EXPECTED[row]
        record = extras_record(out.non_tensor_batch["extras"][i])
        assert scores[i] == reward, case
        if loop == "uniagent":
            assert record is not None, case
            assert record["traj_masked"] is masked, case
            assert (trained[i] == 0) is masked, case
        else:
            assert record is None, case
            assert trained[i] > 0, case
        assert out.non_tensor_batch["reward_extra_info"][i] == {"acc": reward}, case
    assert out.meta_info["reward_extra_keys"] == ["acc"], case
    assert out.non_tensor_batch["acc"].tolist() == [EXPECTED[r][1] for r in order], case


async def test_every_order_and_worker_split_concatenates(
    tmp_path: Path, verl_model_dir: Path, qwen3_tokenizer: Any
) -> None:
    """Two uniagent and two single-turn rows in every order, over 1, 2 and 4 workers."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
    from verl.experimental.reward_loop.reward_loop import RewardLoopWorker

    loop_yaml, batch = mixed_batch(tmp_path, qwen3_tokenizer)
    server = ScriptedTokenServer(str(verl_model_dir), {**SCRIPTS, **GSM8K_SCRIPT}, global_steps=2)
    config = trainer_config(verl_model_dir, loop_yaml)
    reward = InProcessActor(RewardLoopWorker(config))
    # One worker object behind every chunk: verl keeps no state between a worker's calls,
    # and making one costs seconds (tokenizer and model config).
    worker = AgentLoopWorker(config, llm_client=server, reward_loop_worker_handles=[reward])

    columns: set[str] | None = None
    orders = sorted(itertools.permutations(range(4)), key=lambda o: [EXPECTED[r][0] for r in o])
    kinds_seen = set()
    for order in orders:
        kinds = tuple(EXPECTED[r][0] for r in order)
        if kinds in kinds_seen:  # the same layout of loops with the rows swapped adds nothing
            continue
        kinds_seen.add(kinds)
        for num_workers in (1, 2, 4):
            case = f"loops {kinds}, {num_workers} workers"
            manager = manager_in_process(config, server, [worker] * num_workers, reward)
            out = await manager.generate_sequences(batch.select_idxs(list(order)))
            assert len(out) == 4, case
            check_rows(out, order, case)
            for i, row in enumerate(order):
                expected_prompt = batch.non_tensor_batch["raw_prompt"][row]
                assert list(out.non_tensor_batch["raw_prompt"][i]) == list(expected_prompt), case
            keys = set(out.non_tensor_batch)
            columns = keys if columns is None else columns
            assert keys == columns, case
            assert "agent_loop/generate_sequences/mean" in out.meta_info["timing"], case
    assert len(kinds_seen) == 6  # C(4, 2) layouts of two loops over four rows
    assert columns is not None
    assert {
        "extras",
        "turn_scores",
        "tool_rewards",
        "min_global_steps",
        "max_global_steps",
        "global_steps",
        "reward_extra_info",
        "raw_prompt",
    } <= columns
    # No uniagent field leaks into a column of its own (that is what broke mixed batches).
    assert not {"exit_reason", "traj_masked", "agent_turns"} & columns


async def test_pure_single_turn_chunk_beside_pure_uniagent_chunk(
    tmp_path: Path, verl_model_dir: Path, qwen3_tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reported crash: rows [uniagent, uniagent, single, single] over two workers, both
    ways round, with verl's own concat of the two chunks."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
    from verl.experimental.reward_loop.reward_loop import RewardLoopWorker
    from verl.protocol import DataProto

    from uniagent.verl.agent_loop import UniAgentLoop

    # A fresh worker process: what an earlier test's episodes left in the class is not seen.
    monkeypatch.setattr(UniAgentLoop, "_last_global_steps", None)
    loop_yaml, batch = mixed_batch(tmp_path, qwen3_tokenizer)
    server = ScriptedTokenServer(str(verl_model_dir), {**SCRIPTS, **GSM8K_SCRIPT}, global_steps=2)
    config = trainer_config(verl_model_dir, loop_yaml, num_workers=2)
    reward = InProcessActor(RewardLoopWorker(config))
    worker = AgentLoopWorker(config, llm_client=server, reward_loop_worker_handles=[reward])
    ours = await worker.generate_sequences(batch.select_idxs([0, 1]))
    theirs = await worker.generate_sequences(batch.select_idxs([2, 3]))
    assert set(ours.non_tensor_batch) == set(theirs.non_tensor_batch)
    for chunks, order in (([ours, theirs], [0, 1, 2, 3]), ([theirs, ours], [2, 3, 0, 1])):
        joined = DataProto.concat(chunks)
        check_rows(joined, order, f"chunks in order {order}")
    # Weight versions as verl's trainers read them: integers, for every row; the server's for
    # the rows that generated. Row 1 (no generation) takes the latest this worker saw, which
    # depends on whether row 0's first reply came before row 1's set-up failed.
    steps = DataProto.concat([ours, theirs]).non_tensor_batch["max_global_steps"]
    np.array(steps, dtype=int)
    assert [steps[i] for i in (0, 2, 3)] == [2, 2, 2]


@pytest.mark.slow
def test_through_ray_agent_loop_manager(
    tmp_path: Path, verl_model_dir: Path, qwen3_tokenizer: Any, ray_cluster: None
) -> None:
    """Real Ray actors: two AgentLoopWorkers (one gets only uniagent rows, the other only
    single-turn rows) and verl's reward loop workers, under uniagent's loop manager, whose
    agent metrics reach verl's step metrics as the classic trainer computes them."""
    import ray
    from verl.experimental.reward_loop.reward_loop import RewardLoopWorker
    from verl.trainer.ppo.metric_utils import compute_data_metrics, compute_timing_metrics

    from uniagent.verl.metrics import UniAgentLoopManager

    loop_yaml, batch = mixed_batch(tmp_path, qwen3_tokenizer)
    server = ScriptedTokenServer(str(verl_model_dir), {**SCRIPTS, **GSM8K_SCRIPT}, global_steps=2)
    config = trainer_config(verl_model_dir, loop_yaml, num_workers=2)
    rewards = [ray.remote(RewardLoopWorker).remote(config)]
    manager = UniAgentLoopManager.create(
        config, llm_client=server, reward_loop_worker_handles=rewards
    )
    out = manager.generate_sequences(batch)
    for actor in [*manager.agent_loop_workers, *rewards]:
        ray.kill(actor)
    check_rows(out, [0, 1, 2, 3], "Ray, 2 workers")
    assert np.isfinite(out.batch["rollout_log_probs"].numpy()).all()

    # What verl's classic trainer does with a rollout's output (ray_trainer.fit):
    timing_raw = {"gen": 1.0, **out.meta_info["timing"]}
    out.batch["token_level_scores"] = out.batch["rm_scores"]
    out.batch["token_level_rewards"] = out.batch["rm_scores"]
    out.batch["advantages"] = out.batch["rm_scores"]
    out.batch["returns"] = out.batch["rm_scores"]
    metrics = {
        **compute_data_metrics(batch=out, use_critic=False),
        **compute_timing_metrics(batch=out, timing_raw=timing_raw),
    }
    assert metrics["timing_s/agent/samples"] == 2.0  # the two uniagent rows only
    assert metrics["timing_s/agent/exit_reason/finished"] == 0.5
    assert metrics["timing_s/agent/exit_reason/env_error"] == 0.5
    assert metrics["timing_s/agent/masked_share"] == 0.5
    assert metrics["timing_s/agent/tool_calls/execute_bash/mean"] == 0.5
    assert metrics["timing_s/agent/time/setup/mean"] > 0
    assert "timing_s/agent_loop/tool_calls/mean" in metrics
    assert metrics["critic/score/mean"] == 0.5
