"""Helpers of the verl suite: verl's trainer config and the agent-loop YAML, as users write them."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import verl

#: verl's trainer configs (``_generated_ppo_trainer.yaml`` and friends).
VERL_CONFIG_DIR = Path(verl.__file__).parent / "trainer" / "config"


def trainer_config(
    model_dir: Path,
    loop_yaml: Path,
    *,
    prompt_length: int = 2048,
    response_length: int = 512,
    num_workers: int = 1,
    overrides: Mapping[str, Any] | None = None,
) -> Any:
    """verl's generated PPO trainer config, pointed at ``model_dir`` and the agent-loop YAML."""
    from omegaconf import OmegaConf

    config = OmegaConf.load(VERL_CONFIG_DIR / "_generated_ppo_trainer.yaml")
    rollout = config.actor_rollout_ref.rollout
    config.actor_rollout_ref.model.path = str(model_dir)
    rollout.name = "vllm"
    rollout.prompt_length = prompt_length
    rollout.response_length = response_length
    rollout.calculate_log_probs = True
    rollout.multi_turn.enable = True
    rollout.agent.num_workers = num_workers
    rollout.agent.agent_loop_config_path = str(loop_yaml)
    for key, value in (overrides or {}).items():
        OmegaConf.update(config, key, value, merge=False)
    return config


def write_loop_yaml(folder: Path, agent_config: Mapping[str, Any], **inline: Any) -> Path:
    """An agent-loop YAML (as a user writes it) plus the agent config file it names."""
    import yaml

    (folder / "agent.yaml").write_text(yaml.safe_dump(dict(agent_config)))
    entry = {
        "name": "uniagent",
        "_target_": "uniagent.verl.agent_loop.UniAgentLoop",
        "agent_config": "agent.yaml",  # relative: resolved beside this YAML
        **inline,
    }
    path = folder / "agent_loop.yaml"
    path.write_text(yaml.safe_dump([entry], sort_keys=False))
    return path
