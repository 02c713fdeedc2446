"""``uniagent_grpo``: GRPO group statistics without masked samples, through verl's own code.

The batch comes from verl's real AgentLoopWorker on the CPU (real sandboxes, a scripted
token server); advantages come from verl's real ``compute_advantage`` with the estimator
name a recipe sets, found through verl's estimator registry.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from verl_helpers import (
    AGENT,
    SCRIPTS,
    make_batch,
    make_worker,
    task,
    trainer_config,
    write_loop_yaml,
)

from uniagent.verl.output import extras_record
from uniagent.verl.testing import ScriptedTokenServer

BROKEN = {"tools_kwargs": {"env": {"post_setup": ["false"]}}}  # env_error: masked, reward 0.0
#: (group, task) per row: group "a" has a masked sample among trained ones, "b" only masked
#: ones, "c" none.
ROWS = [
    ("a", task("a-fin", "[script:finish]")),
    ("a", task("a-loop", "[script:loop]")),
    ("a", task("a-fin2", "[script:finish]")),
    ("a", task("a-broken", "[script:finish]", **BROKEN)),
    ("b", task("b-broken", "[script:finish]", **BROKEN)),
    ("b", task("b-broken2", "[script:finish]", **BROKEN)),
    ("c", task("c-fin", "[script:finish]")),
    ("c", task("c-garbage", "[script:garbage]")),
]


@pytest.fixture(scope="module")
def rollout(tmp_path_factory: pytest.TempPathFactory, verl_model_dir: Path) -> Any:
    """The batch of :data:`ROWS` after verl's AgentLoopWorker, ready for the advantage step."""
    import asyncio

    from uniagent.testing.tokenizers import load_qwen3_tokenizer

    tmp_path = tmp_path_factory.mktemp("advantage")
    loop_yaml = write_loop_yaml(tmp_path, AGENT)
    batch = make_batch(tmp_path, load_qwen3_tokenizer(), [t for _, t in ROWS])
    server = ScriptedTokenServer(str(verl_model_dir), SCRIPTS)
    worker = make_worker(trainer_config(verl_model_dir, loop_yaml), server)
    out = asyncio.run(worker.generate_sequences(batch))
    out.non_tensor_batch["uid"] = np.array([group for group, _ in ROWS], dtype=object)
    out.batch["token_level_rewards"] = out.batch["rm_scores"]
    return out


def advantages(data: Any, estimator: str, **algo: Any) -> torch.Tensor:
    """verl's compute_advantage (both of verl's trainers call it) on a copy of ``data``."""
    from verl.trainer.config import AlgoConfig
    from verl.trainer.ppo.ray_trainer import compute_advantage

    config = AlgoConfig(adv_estimator=estimator, **algo)
    result = compute_advantage(
        data.select_idxs(list(range(len(data)))),
        adv_estimator=estimator,
        norm_adv_by_std_in_grpo=config.norm_adv_by_std_in_grpo,
        config=config,
    )
    return result.batch["advantages"]


def test_the_batch_has_masked_samples_with_reward_zero(rollout: Any) -> None:
    """The premise, from the real worker: rows 3-5 are masked (all-zero mask, reward 0.0)."""
    masked = [extras_record(e)["traj_masked"] for e in rollout.non_tensor_batch["extras"]]
    assert masked == [False, False, False, True, True, True, False, False]
    assert rollout.batch["rm_scores"].sum(dim=1).tolist() == [1, 0, 1, 0, 0, 0, 1, 0]
    assert (rollout.batch["response_mask"].sum(dim=1) == 0).tolist() == masked


@pytest.mark.parametrize("norm_by_std", [True, False])
def test_masked_sample_leaves_its_group_as_if_absent(rollout: Any, norm_by_std: bool) -> None:
    """Exactly verl's GRPO on the batch without the masked samples; they get 0."""
    ours = advantages(rollout, "uniagent_grpo", norm_adv_by_std_in_grpo=norm_by_std)
    kept = [0, 1, 2, 6, 7]
    without = advantages(rollout.select_idxs(kept), "grpo", norm_adv_by_std_in_grpo=norm_by_std)
    assert torch.equal(ours[kept], without)
    assert torch.count_nonzero(ours[[3, 4, 5]]) == 0  # masked, and group "b" contributes nothing
    # Plain GRPO lets the masked 0.0 in: group "a"'s other samples shift.
    plain = advantages(rollout, "grpo", norm_adv_by_std_in_grpo=norm_by_std)
    assert not torch.equal(plain[[0, 1, 2]], ours[[0, 1, 2]])
    assert torch.equal(plain[[6, 7]], ours[[6, 7]])  # group "c" had nothing masked


def test_estimator_is_registered_by_installing_uniagent(tmp_path: Path) -> None:
    """verl's own plugin loading (the ``verl.plugins`` entry point) registers it in a fresh
    process, as in verl's driver; with verl's plugin loading off, nothing does."""
    code = (
        "import verl.trainer.ppo.core_algos as c; "
        "f = c.ADV_ESTIMATOR_REGISTRY.get('uniagent_grpo'); "
        "print(f.__module__ if f else None)"
    )

    def registered_by(**env: str) -> str:
        clean = {k: v for k, v in os.environ.items() if not k.startswith("VERL_USE_EXTERNAL")}
        done = subprocess.run(
            [sys.executable, "-c", code],
            cwd=tmp_path,
            env={**clean, **env},
            capture_output=True,
            text=True,
            check=True,
        )
        return done.stdout.strip().splitlines()[-1]

    assert registered_by() == "uniagent.verl.advantage"
    assert registered_by(VERL_USE_EXTERNAL_PLUGINS="none") == "None"
