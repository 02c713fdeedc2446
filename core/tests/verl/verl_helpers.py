"""Helpers of the verl suite: verl's trainer config and the agent-loop YAML, as users write them."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import verl

from uniagent.testing import hermes_call
from uniagent.verl.output import extras_record
from uniagent.verl.testing import ScriptedTokenServer

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


AGENT = {
    "tool_parser": "hermes",
    "tools": ["execute_bash", "finish"],
    "system_prompt": "You are a test agent in a sandbox. Use the tools.",
    "instance_template": "{problem_statement}",
    "interaction": {"max_turns": 3, "action_timeout": 30, "max_format_errors": 2},
    # These tests share host paths with their sandboxes (markers, repositories).
    "env": {"deployment": {"type": "host", "isolation": "none"}},
    "reward": {"name": "command", "settings": {"timeout": 30}},
    "concurrency": 8,
}

SCRIPTS = {
    "[script:finish]": [
        hermes_call("execute_bash", {"command": "echo done > marker.txt"}),
        hermes_call("finish", {"answer": "done"}),
    ],
    "[script:loop]": [hermes_call("execute_bash", {"command": "echo again"})],
    "[script:garbage]": ["I would rather not call any tool."],
    "[script:long]": [hermes_call("execute_bash", {"command": "seq 1 3000"})],
}


def task(task_id: str, script: str, **extra: Any) -> dict[str, Any]:
    """A task whose problem statement selects the server's script."""
    return {
        "instance_id": task_id,
        "problem_statement": f"{script} Task {task_id}: create marker.txt, then finish.",
        "test_command": "test -f marker.txt",
        **extra,
    }


def make_batch(
    tmp_path: Path,
    tokenizer: Any,
    tasks: Sequence[Mapping[str, Any]],
    other_rows: Sequence[Mapping[str, Any]] = (),
    agent_names: Mapping[str, str] | None = None,
) -> Any:
    """Tasks → ``uniagent data prepare`` → RLHFDataset → collate_fn → DataProto.

    ``other_rows`` (e.g. :func:`gsm8k_row`, for verl's own loops) are appended to the
    prepared Parquet file: one dataset, one schema, as a user mixing tasks builds it.
    ``agent_names`` gives a task (by id) another agent-loop entry than ``uniagent``.
    """
    from omegaconf import OmegaConf
    from verl.protocol import DataProto
    from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn

    from uniagent.cli import main

    tasks_file = tmp_path / "tasks.jsonl"
    tasks_file.write_text("".join(json.dumps(t) + "\n" for t in tasks))
    out = tmp_path / "train.parquet"
    code = main(
        [
            "data",
            "prepare",
            str(tasks_file),
            "--out",
            str(out),
            "--config",
            str(tmp_path / "agent.yaml"),
            "--data-source",
            "unit",
        ]
    )
    assert code == 0
    if other_rows or agent_names:
        import pyarrow.parquet as pq

        from uniagent.data import write_parquet

        rows = pq.read_table(out).to_pylist()
        for row in rows:
            row["agent_name"] = (agent_names or {}).get(row["extra_info"]["task_id"], "uniagent")
        rows += [dict(row, index=len(rows) + i) for i, row in enumerate(other_rows)]
        write_parquet(rows, out)
    dataset = RLHFDataset(
        str(out),
        tokenizer,
        OmegaConf.create(
            {
                "max_prompt_length": 2048,
                "filter_overlong_prompts": False,
                "cache_dir": str(tmp_path / "verl-cache"),
            }
        ),
    )
    return DataProto.from_single_dict(collate_fn([dataset[i] for i in range(len(dataset))]))


def gsm8k_row(question: str, answer: str) -> dict[str, Any]:
    """A row for verl's ``single_turn_agent`` scored by verl's own GSM8K reward."""
    return {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": question}],
        "agent_name": "single_turn_agent",
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": {"index": None, "task_id": None, "tools_kwargs": None, "task": None},
    }


def make_worker(config: Any, server: ScriptedTokenServer) -> Any:
    """verl's real AgentLoopWorker, in this process."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    return AgentLoopWorker(config, llm_client=server)


def agent_field(out: Any, key: str) -> list[Any]:
    """One key of every row's uniagent record (``extras["uniagent"]``)."""
    records = [extras_record(e) for e in out.non_tensor_batch["extras"]]
    assert all(r is not None for r in records), "every row is a uniagent row"
    return [r[key] for r in records]  # type: ignore[index]


def unpad(out: Any, i: int) -> tuple[list[int], list[int], list[int], list[float], list[float]]:
    """Sample ``i`` without padding: prompt, response, mask, log-probs, rm_scores."""
    prompt_len = out.batch["prompts"].shape[1]
    attention = out.batch["attention_mask"][i]
    prompt = out.batch["prompts"][i][attention[:prompt_len].bool()].tolist()
    n = int(attention[prompt_len:].sum())
    return (
        prompt,
        out.batch["responses"][i][:n].tolist(),
        out.batch["response_mask"][i][:n].tolist(),
        out.batch["rollout_log_probs"][i][:n].tolist(),
        out.batch["rm_scores"][i].tolist(),
    )


def make_loop(worker: Any, config: Any, server: Any, name: str = "uniagent") -> Any:
    """The agent loop of entry ``name``, built as verl's workers build one per sample."""
    import hydra
    from verl.experimental.agent_loop.agent_loop import (
        DictConfigWrap,
        ToolListWrap,
        _agent_loop_registry,
    )

    return hydra.utils.instantiate(
        _agent_loop_registry[name],
        trainer_config=DictConfigWrap(config=config),
        server_manager=server,
        tokenizer=worker.tokenizer,
        processor=worker.processor,
        hf_model_type=worker.hf_model_type,
        dataset_cls=worker.dataset_cls,
        data_config=DictConfigWrap(config.data),
        tools=ToolListWrap(worker.tools),
    )
