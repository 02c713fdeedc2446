"""verl 0.9.1's fully async trainer on the CPU: the agent metrics reach its step metrics.

Real parts: Ray; verl's ``FullyAsyncAgentLoopManager`` with ``AgentLoopWorker`` actors
running ``UniAgentLoop`` on single-prompt batches exactly as the rollouter makes them
(``prepare_single_generation_data``, n sessions each); verl's ``MessageQueue`` actor the
samples go through, pickled as the rollouter pickles them; the trainer's own
``_fit_generate`` (queue → ``assemble_batch_from_rollout_samples`` → the step's metrics),
called on a stand-in trainer object that holds only what that method reads (building the
trainer starts actor and critic workers, which need GPUs); verl's ``MetricsAggregator``.
A scripted token server plays the model.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from verl_helpers import AGENT, SCRIPTS, make_batch, task, trainer_config, write_loop_yaml

from uniagent.verl.metrics import agent_metrics
from uniagent.verl.testing import ScriptedTokenServer

N = 2  # sessions per prompt (rollout.n)


def rows_as_loaded(batch: Any) -> list[dict[str, Any]]:
    """The batch's rows one by one, as the rollouter's data loader yields them (size 1)."""
    rows = []
    for i in range(len(batch)):
        row = batch[i : i + 1]
        rows.append({**dict(row.batch.items()), **row.non_tensor_batch})
    return rows


@pytest.mark.slow
async def test_the_fully_async_trainers_step_metrics_hold_the_agent_metrics(
    tmp_path: Path, verl_model_dir: Path, qwen3_tokenizer: Any, ray_cluster: None
) -> None:
    import ray
    from verl.experimental.fully_async_policy.detach_utils import (
        MetricsAggregator,
        RolloutSample,
        prepare_single_generation_data,
    )
    from verl.experimental.fully_async_policy.fully_async_rollouter import (
        FullyAsyncAgentLoopManager,
    )
    from verl.experimental.fully_async_policy.message_queue import (
        MessageQueue,
        MessageQueueClient,
    )

    from uniagent.verl.fully_async import AgentMetricsTrainer

    loop_yaml = write_loop_yaml(tmp_path, AGENT)
    broken = {"env": {"post_setup": ["false"]}}  # env_error: masked
    tasks = [task("fin", "[script:finish]"), task("broken", "[script:finish]", tools_kwargs=broken)]
    batch = make_batch(tmp_path, qwen3_tokenizer, tasks)
    server = ScriptedTokenServer(str(verl_model_dir), SCRIPTS, global_steps=3)
    config = trainer_config(
        verl_model_dir,
        loop_yaml,
        overrides={"actor_rollout_ref.rollout.n": N, "trainer.balance_batch": False},
    )
    manager = await FullyAsyncAgentLoopManager.create(config, llm_client=server)
    queue = MessageQueue.remote(config, 10)
    client = MessageQueueClient(queue)
    try:
        # What FullyAsyncRollouter._feed_samples and _process_single_sample_streaming do.
        for step, row in enumerate(rows_as_loaded(batch)):
            full = prepare_single_generation_data(row, config)
            uid = np.array([f"uid_sample_0_{step}"] * len(full), dtype=object)
            full.non_tensor_batch["uid"] = uid
            out = await manager.generate_sequences_single(full)
            out.non_tensor_batch["uid"] = uid
            sample = RolloutSample(out, f"sample_0_{step}", 0, {"count/step": step})
            assert await client.put_sample(ray.cloudpickle.dumps(sample))

        trainer = object.__new__(AgentMetricsTrainer)  # what _fit_generate reads, only
        trainer.__dict__.update(
            config=config,
            tokenizer=qwen3_tokenizer,
            required_samples=len(tasks),
            message_queue_client=client,
            dynamic_schedule_enabled=False,
            _step_wait_times=[],
            _step_wait_samples=[],
            current_param_version=3,
            stale_trajectory_processed=0,
            metrics={"training/global_step": 1},
            timing_raw={},
            metrics_aggregator=MetricsAggregator(total_gpus=1),
        )
        assembled = await trainer._fit_generate()
    finally:
        for actor in [*manager.agent_loop_workers, queue]:
            ray.kill(actor)

    metrics = trainer.metrics
    assert len(assembled) == N * len(tasks)
    assert "fully_async/count/current_param_version" in metrics  # verl's own, still there
    expected = agent_metrics(assembled.non_tensor_batch["extras"].tolist())
    ours = {k: v for k, v in metrics.items() if k.startswith(("agent/", "integrity/"))}
    assert ours == expected and "integrity/tampered" in ours  # the probing counters too
    assert metrics["agent/samples"] == N * len(tasks)
    assert metrics["agent/exit_reason/finished"] == 0.5
    assert metrics["agent/exit_reason/env_error"] == 0.5
    assert metrics["agent/masked_share"] == 0.5
    assert metrics["agent/tool_calls/execute_bash/mean"] == 0.5

    # A sync cycle of two steps, logged once: shares averaged, samples summed, and
    # exit_reason/max_step_limit not reduced by max because of its name.
    aggregator = trainer.metrics_aggregator
    second = {**metrics, "agent/exit_reason/max_step_limit": 1.0, "agent/exit_reason/finished": 0.0}
    for step_metrics in (metrics, second):
        aggregator.add_step_metrics(metrics=step_metrics, sample_count=len(tasks))
    logged = aggregator.get_aggregated_metrics()
    assert logged["agent/samples"] == 2 * N * len(tasks)
    assert logged["agent/exit_reason/finished"] == 0.25
    assert logged["agent/exit_reason/max_step_limit"] == 0.5
    assert logged["agent/turns/max"] == metrics["agent/turns/max"]


def test_the_entry_point_composes_verls_fully_async_config(tmp_path: Path) -> None:
    """``python -m uniagent.verl.fully_async`` is verl's Hydra main: same config, same
    overrides (``--cfg job`` prints the composed config instead of training)."""
    proc = subprocess.run(
        [
            sys.executable, "-m", "uniagent.verl.fully_async", "--cfg", "job",
            "async_training.trigger_parameter_sync_step=4", "actor_rollout_ref.rollout.n=3",
        ],
        capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "HYDRA_FULL_ERROR": "1"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    import yaml

    config = yaml.safe_load(proc.stdout)
    assert config["async_training"]["trigger_parameter_sync_step"] == 4
    assert config["actor_rollout_ref"]["rollout"]["n"] == 3
