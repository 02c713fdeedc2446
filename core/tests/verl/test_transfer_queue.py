"""verl 0.9.1's v1 trainer path (``trainer.use_v1=True``, ``main_ppo``'s default) on the CPU.

Real parts: Ray, TransferQueue (controller and storage actors), verl's
``AgentLoopManagerTQ`` with ``AgentLoopWorkerTQ`` actors running ``UniAgentLoop`` (n
sessions per prompt), the replay buffer verl builds from the recipe's
``custom_sampler`` setting, verl's ``MetricsAggregator``, and the trainer's own
``_compute_advantage`` and ``_compute_metrics`` (called on a stand-in trainer object that
holds only the config: the actor and critic workers they do not use need GPUs). A
scripted token server plays the model.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from verl_helpers import AGENT, SCRIPTS, task, trainer_config, write_loop_yaml

from uniagent.run.runner import RESULTS, ResultsFile
from uniagent.verl.output import extras_record
from uniagent.verl.testing import ScriptedTokenServer

N = 3  # sessions per prompt (rollout.n)


def v1_config(model_dir: Path, loop_yaml: Path) -> Any:
    """The trainer config with the recipe's v1 settings (estimator, agent-metrics sampler)."""
    return trainer_config(
        model_dir,
        loop_yaml,
        overrides={
            "actor_rollout_ref.rollout.n": N,
            "algorithm.adv_estimator": "uniagent_grpo",
            "algorithm.rollout_correction.bypass_mode": True,  # no actor to recompute log-probs
            "trainer.v1.sampler.custom_sampler.path": "pkg://uniagent.verl.replay_buffer",
            "trainer.v1.sampler.custom_sampler.name": "UniAgentReplayBuffer",
            "transfer_queue.backend.SimpleStorage.num_data_storage_units": 1,
        },
    )


def prompts(tmp_path: Path, tokenizer: Any, shared: Path) -> Any:
    """Two prompts as verl's v1 trainer submits them (a TensorDict with uid and step).

    ``race``: of its three sessions the third to set up fails (``mkdir`` is atomic: env_error,
    masked) and only the first to be graded passes: rewards {1.0, 0.0, masked 0.0}.
    ``broken``: every session fails its setup: a group with only masked samples.
    """
    import verl.utils.tensordict_utils as tu
    from omegaconf import OmegaConf
    from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn

    from uniagent.cli import main

    tasks = [
        task(
            "race",
            "[script:finish]",
            tools_kwargs={"env": {"post_setup": [f"mkdir {shared}/a || mkdir {shared}/b"]}},
            test_command=f"mkdir {shared}/graded",
        ),
        task("broken", "[script:finish]", tools_kwargs={"env": {"post_setup": ["false"]}}),
    ]
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
    out = tmp_path / "train.parquet"
    args = ["data", "prepare", str(tmp_path / "tasks.jsonl"), "--out", str(out)]
    assert main([*args, "--config", str(tmp_path / "agent.yaml")]) == 0
    dataset = RLHFDataset(
        str(out),
        tokenizer,
        OmegaConf.create({"filter_overlong_prompts": False, "cache_dir": str(tmp_path / "c")}),
    )
    batch = collate_fn([dataset[i] for i in range(len(dataset))])
    batch["uid"] = np.array([str(uuid.uuid4()) for _ in range(len(dataset))], dtype=object)
    batch = tu.get_tensordict(batch)
    tu.assign_non_tensor_data(batch, "global_steps", 1)
    return batch


@pytest.mark.slow
def test_v1_step_with_agent_metrics_and_masked_grpo(
    tmp_path: Path, verl_model_dir: Path, qwen3_tokenizer: Any, ray_cluster: None
) -> None:
    """Rollout through TransferQueue workers, then verl's sampling, advantage and metrics."""
    import ray
    import transfer_queue as tq
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage
    from verl.trainer.ppo.metric_utils import RolloutMoELoadBalanceMetricsAccumulator
    from verl.trainer.ppo.v1 import AgentLoopManagerTQ
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer
    from verl.trainer.ppo.v1.utils import MetricsAggregator

    from uniagent.verl.replay_buffer import UniAgentSyncReplayBuffer

    shared = tmp_path / "shared"
    shared.mkdir()
    dumps = tmp_path / "dumps"
    loop_yaml = write_loop_yaml(tmp_path, AGENT, trajectory_dir=str(dumps), trajectory_rate=1.0)
    config = v1_config(verl_model_dir, loop_yaml)
    batch = prompts(tmp_path, qwen3_tokenizer, shared)
    server = ScriptedTokenServer(str(verl_model_dir), SCRIPTS, global_steps=0)
    tq.init(config.transfer_queue)
    manager = None
    try:
        manager = AgentLoopManagerTQ.create(config=config, llm_client=server)
        # What PPOTrainer._submit_batch_to_rollout does in sync mode:
        tags = [{"is_prompt": True, "status": "pending", "global_steps": 1}] * len(batch)
        tq.kv_batch_put(keys=list(batch["uid"]), partition_id="train", tags=tags)
        manager.generate_sequences(batch)

        trainer = SimpleNamespace(
            config=config,
            trainer_mode="sync",
            _add_prompts_to_generate=None,
            kl_ctrl_in_reward=None,
            use_critic=False,
            _rollout_moe_lb_metrics_accumulator=RolloutMoELoadBalanceMetricsAccumulator(
                model_config=config.actor_rollout_ref.model
            ),
            _get_n_gpus_for_throughput=lambda: 1,
        )
        buffer = PPOTrainer._build_replay_buffer(trainer)  # loads the recipe's custom sampler
        assert isinstance(buffer, UniAgentSyncReplayBuffer)
        sampled, sample_metrics = buffer.sample(global_steps=1, partition_id="train", batch_size=2)
        aggregator = MetricsAggregator()  # what PPOTrainer.step does with each update's metrics
        aggregator.add_step_metrics(sample_metrics, sample_count=len(sampled.keys))
        metrics = aggregator.get_aggregated_metrics()
        PPOTrainer._compute_advantage(trainer, sampled, metrics)
        timing = {"gen": 1.0, "step": 2.0}
        PPOTrainer._compute_metrics(trainer, sampled, metrics, timing, global_steps=1, epoch=0)
        data = tq.kv_batch_get(
            keys=sampled.keys,
            partition_id="train",
            select_fields=["advantages", "response_mask", "rm_scores", "extra_fields"],
        )
    finally:
        if manager is not None:
            for worker in manager.agent_loop_workers:
                ray.kill(worker)
        tq.close()

    assert len(sampled.keys) == 2 * N
    records = [extras_record(getattr(f, "data", f)["extras"]) for f in data["extra_fields"]]
    uid_of = [key.rsplit("_", 2)[0] for key in sampled.keys]
    race = [i for i, uid in enumerate(uid_of) if uid == batch["uid"][0]]
    broken = [i for i, uid in enumerate(uid_of) if uid == batch["uid"][1]]
    assert sorted(records[i]["exit_reason"] for i in race) == ["env_error", "finished", "finished"]
    assert all(records[i]["exit_reason"] == "env_error" for i in broken)
    for tag in sampled.tags:  # the weight versions verl's v1 trainer reads as integers
        assert isinstance(tag["min_global_steps"], int) and isinstance(tag["max_global_steps"], int)

    # Advantages: verl's GRPO over the two trained samples of "race"; 0 for masked ones.
    scores = [float(s.sum()) for s in data["rm_scores"]]
    advantage = [a.tolist() for a in data["advantages"]]
    trained = [i for i in race if records[i]["exit_reason"] == "finished"]
    expected, _ = compute_grpo_outcome_advantage(
        token_level_rewards=torch.tensor([[scores[i]] for i in trained]),
        response_mask=torch.ones(len(trained), 1),
        index=np.array(["race"] * len(trained), dtype=object),
    )
    assert sorted(scores[i] for i in trained) == [0.0, 1.0]
    for i, value in zip(trained, expected[:, 0].tolist(), strict=True):
        assert all(a == 0.0 or a == pytest.approx(value) for a in advantage[i])  # 0: mask 0
        assert any(a == pytest.approx(value) for a in advantage[i])
    for i in [*broken, *(set(race) - set(trained))]:
        assert not any(advantage[i])

    # The step's metric dict: verl's own metrics and the agent metrics side by side.
    assert metrics["agent/samples"] == 2 * N
    assert metrics["agent/exit_reason/finished"] == pytest.approx(2 / 6)
    assert metrics["agent/exit_reason/env_error"] == pytest.approx(4 / 6)
    assert metrics["agent/masked_share"] == pytest.approx(4 / 6)
    assert metrics["agent/tool_calls/finish/mean"] == pytest.approx(2 / 6)
    assert metrics["agent/time/setup/mean"] > 0
    assert metrics["critic/score/mean"] == pytest.approx(1 / 6)
    assert "training/global_step" in metrics and "response_length/mean" in metrics

    # Episode dumps: the trainer's step comes with each v1 row, and so do uid and session.
    dumped = ResultsFile(dumps / "step_000001" / RESULTS).load()
    assert sorted((r["task_id"], r["sample"]) for r in dumped) == sorted(
        [(t, s) for t in ("race", "broken") for s in range(N)]
    )
    assert {r["verl"]["global_step"] for r in dumped} == {1}
    assert sorted(r["verl"]["session_id"] for r in dumped) == sorted(list(range(N)) * 2)
    assert {r["verl"]["uid"] for r in dumped} == set(batch["uid"])
