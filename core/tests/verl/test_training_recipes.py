"""The example training scripts: every flag they pass exists in verl 0.9.1's config.

Each script is run for real by bash with ``python3`` replaced by a recorder on ``PATH``;
the recorded Hydra overrides are then composed against verl's own config (struct mode:
an unknown key fails), and the values that matter for agent training are checked.
"""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from verl_helpers import VERL_CONFIG_DIR

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "verl"
FULLY_ASYNC_CONFIG_DIR = (
    VERL_CONFIG_DIR.parents[1] / "experimental" / "fully_async_policy" / "config"
)

RECORDER = """#!/usr/bin/env bash
n=$(ls "$ARGS_DIR" | wc -l)
printf '%s\\0' "$@" > "$ARGS_DIR/$n"
"""


def recorded_calls(script: str, tmp_path: Path, **env_vars: str) -> list[list[str]]:
    """Run ``script`` with a recording ``python3``; return the arguments of each call."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "python3"
    fake.write_text(RECORDER)
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    args_dir = tmp_path / "calls"
    args_dir.mkdir()
    train = tmp_path / "train.parquet"
    train.write_bytes(b"")  # present: the data step is skipped
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "ARGS_DIR": str(args_dir),
        "TRAIN_FILE": str(train),
        "MODEL": "/models/qwen3",
        **env_vars,
    }
    subprocess.run(["bash", str(EXAMPLES / script), "trainer.total_epochs=1"], env=env, check=True)
    calls = sorted(args_dir.iterdir(), key=lambda f: int(f.name))
    return [f.read_bytes().decode().split("\0")[:-1] for f in calls]


def recorded_args(script: str, tmp_path: Path) -> list[str]:
    """The arguments of the script's one ``python3`` call."""
    (call,) = recorded_calls(script, tmp_path)
    return call


def compose(config_dir: Path, name: str, overrides: list[str]) -> Any:
    """verl's config with the overrides, as ``hydra.main`` would build it."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        return hydra_compose(name, overrides=overrides)


def check_agent_settings(config: Any) -> None:
    """The settings every uniagent training run needs."""
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn

    from uniagent.verl.advantage import compute_masked_grpo_advantage

    rollout = config.actor_rollout_ref.rollout
    assert config.algorithm.adv_estimator == "uniagent_grpo"
    assert get_adv_estimator_fn(config.algorithm.adv_estimator) is compute_masked_grpo_advantage
    assert rollout.multi_turn.enable is True
    assert rollout.calculate_log_probs is True
    assert rollout.n > 1
    assert config.data.return_raw_chat is True
    loop_yaml = Path(rollout.agent.agent_loop_config_path)
    assert loop_yaml == EXAMPLES / "agent_loop.yaml"
    assert config.actor_rollout_ref.model.path == "/models/qwen3"
    assert config.trainer.total_epochs == 1  # extra arguments reach verl


@pytest.mark.parametrize(
    ("script", "module", "config_dir", "name"),
    [
        ("train_grpo.sh", "verl.trainer.main_ppo", VERL_CONFIG_DIR, "ppo_trainer"),
        (
            "train_grpo_fully_async.sh",
            "uniagent.verl.fully_async",
            FULLY_ASYNC_CONFIG_DIR,
            "fully_async_ppo_trainer",
        ),
    ],
)
def test_script_flags_exist_in_verl_config(
    script: str, module: str, config_dir: Path, name: str, tmp_path: Path
) -> None:
    """The script runs the right module, and verl's Hydra config accepts every flag."""
    args = recorded_args(script, tmp_path)
    assert args[:2] == ["-m", module]
    config = compose(config_dir, name, args[2:])
    check_agent_settings(config)
    if "fully_async" not in script:
        from verl.utils.import_utils import load_extern_object

        from uniagent.verl.replay_buffer import UniAgentReplayBuffer

        assert config.trainer.use_v1 is True
        sampler = config.trainer.v1.sampler.custom_sampler
        assert load_extern_object(sampler.path, sampler.name) is UniAgentReplayBuffer
    if "fully_async" in script:
        from uniagent.verl.fully_async import CONFIG_NAME, CONFIG_PATH

        assert (Path(CONFIG_PATH), CONFIG_NAME) == (config_dir, name)  # verl's own config
        assert config.async_training.partial_rollout is True
        assert config.async_training.staleness_threshold > 0
        assert config.actor_rollout_ref.actor.use_rollout_log_probs is True


def test_agent_loop_yaml_names_the_loop_and_a_valid_agent_config() -> None:
    """The example agent-loop YAML targets UniAgentLoop; its agent config validates."""
    from uniagent.config import AgentConfig
    from uniagent.verl.agent_loop import UniAgentLoop
    from uniagent.verl.settings import LoopSettings, base_config_dict

    (entry,) = yaml.safe_load((EXAMPLES / "agent_loop.yaml").read_text())
    module, _, cls = entry["_target_"].rpartition(".")
    assert (module, cls) == (UniAgentLoop.__module__, UniAgentLoop.__name__)
    settings = LoopSettings(
        prompt_length=4096,
        response_length=16384,
        num_workers=8,
        agent_loop_config_path=str(EXAMPLES / "agent_loop.yaml"),
    )
    kwargs = {k: v for k, v in entry.items() if k != "_target_"}
    config = AgentConfig.from_dict(base_config_dict(settings, kwargs))
    assert config.reward is not None and config.reward.name == "command"
    assert config.concurrency // settings.num_workers == 8


async def test_example_config_trains_on_the_swe_tiny_tasks(
    tmp_path: Path, verl_model_dir: Path, qwen3_tokenizer: Any
) -> None:
    """The example YAMLs as shipped, on the swe_tiny tasks: a scripted fix earns reward 1.0."""
    import sys

    from omegaconf import OmegaConf
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
    from verl.protocol import DataProto
    from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn
    from verl_helpers import trainer_config

    from uniagent.cli import main
    from uniagent.testing import hermes_call
    from uniagent.verl.output import extras_record
    from uniagent.verl.testing import ScriptedTokenServer

    subprocess.run(
        [sys.executable, str(EXAMPLES.parent / "swe_tiny" / "make_tasks.py"), str(tmp_path)],
        check=True,
        capture_output=True,
    )
    out = tmp_path / "train.parquet"
    assert (
        main(
            [
                "data",
                "prepare",
                str(tmp_path / "tasks.jsonl"),
                "--out",
                str(out),
                "--config",
                str(EXAMPLES / "agent.yaml"),
                "--limit",
                "2",
            ]
        )
        == 0
    )
    dataset = RLHFDataset(
        str(out),
        qwen3_tokenizer,
        OmegaConf.create({"filter_overlong_prompts": False, "cache_dir": str(tmp_path / "c")}),
    )
    batch = DataProto.from_single_dict(collate_fn([dataset[0], dataset[1]]))
    fix = "s|return sum(values) / len(values)|return sum(values) / len(values) if values else 0.0|"
    server = ScriptedTokenServer(
        str(verl_model_dir),
        {
            "stats.mean([])": [
                hermes_call("execute_bash", {"command": f"sed -i '{fix}' stats.py"}),
                hermes_call("submit", {}),
            ]
        },
        default=[hermes_call("submit", {})],  # the other task: give up at once
    )
    config = trainer_config(
        verl_model_dir, EXAMPLES / "agent_loop.yaml", prompt_length=4096, response_length=1024
    )
    result = await AgentLoopWorker(config, llm_client=server).generate_sequences(batch)
    records = [extras_record(e) or {} for e in result.non_tensor_batch["extras"]]
    assert [r["exit_reason"] for r in records] == ["finished", "finished"], records
    assert result.batch["rm_scores"].sum(dim=1).tolist() == [1.0, 0.0]
    assert records[0]["tool_calls"] == {"execute_bash": 1, "submit": 1}


def test_gpu_smoke_script_flags_exist_and_steps_run_in_order(tmp_path: Path) -> None:
    """gpu_smoke.sh (not run in CI: no GPU): prepare, a CPU dry run, main_ppo, then the
    check; every main_ppo flag exists in verl's config, with the settings the check needs."""
    out = tmp_path / "smoke"
    calls = recorded_calls("gpu_smoke.sh", tmp_path, OUT=str(out))
    smoke = str(EXAMPLES / "gpu_smoke.py")
    assert [c[:3] for c in calls if c[0] != "-m"] == [
        [smoke, "prepare", str(out)],
        [smoke, "dry-run", str(out)],
        [smoke, "check", str(out)],
    ]
    (train,) = [c for c in calls if c[0] == "-m"]
    assert train[1] == "verl.trainer.main_ppo"
    config = compose(VERL_CONFIG_DIR, "ppo_trainer", train[2:])
    assert config.algorithm.adv_estimator == "uniagent_grpo"
    assert config.trainer.use_v1 is True
    assert config.trainer.n_gpus_per_node == 1 and config.trainer.total_training_steps == 1 + 1
    assert config.actor_rollout_ref.rollout.n == 2  # gpu_smoke.py's SAMPLES_PER_PROMPT
    assert config.actor_rollout_ref.model.path == str(out / "model")
    assert "file" in config.trainer.logger
    sampler = config.trainer.v1.sampler.custom_sampler
    assert (sampler.path, sampler.name) == (
        "pkg://uniagent.verl.replay_buffer",
        "UniAgentReplayBuffer",
    )
