"""Data preparation: task sets (JSONL/Parquet) to the Parquet files verl trains on.

Each task becomes one row with the columns verl's ``RLHFDataset`` reads:

- ``prompt``: the system prompt and the first user message, rendered from the agent
  config's templates (with the task's own ``config_overrides`` applied);
- ``agent_name``: the agent-loop YAML entry that runs the row (``uniagent``);
- ``data_source`` and ``reward_model`` (``{"style": "uniagent", "ground_truth": ...}``);
- ``extra_info``: ``index``, ``task_id``, ``tools_kwargs`` and ``task`` (the task row),
  the last two as JSON text so the Parquet schema is the same whatever the tasks hold;
- ``index``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from uniagent.config import AgentConfig
from uniagent.episode import first_messages
from uniagent.errors import ConfigError
from uniagent.harbor.folders import load_task_set
from uniagent.harbor.images import ImageBuilder
from uniagent.resolver import ResolvedAgent, resolve
from uniagent.tasks import BadRow, Task

#: ``reward_model.style`` of prepared rows: the reward runs inside the agent loop.
REWARD_STYLE = "uniagent"
#: Task fields used as ``reward_model.ground_truth`` when present (first match).
GROUND_TRUTH_FIELDS = ("ground_truth", "answer", "solution")


@dataclass(frozen=True)
class PrepareReport:
    """What ``uniagent data prepare`` wrote and what it skipped."""

    out: Path
    rows: int
    bad_rows: tuple[BadRow, ...]


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)


def _ground_truth(row: Mapping[str, Any]) -> str:
    for name in GROUND_TRUTH_FIELDS:
        value = row.get(name)
        if value not in (None, ""):
            return value if isinstance(value, str) else _json(value)
    return ""


def prepare_row(
    task: Task,
    agent: ResolvedAgent,
    index: int,
    *,
    agent_name: str = "uniagent",
    data_source: str = "uniagent",
) -> dict[str, Any]:
    """One verl row for ``task`` (``agent`` supplies the prompt templates)."""
    overrides = task.overrides()
    source = f"task {task.id}: config_overrides"
    try:
        messages = first_messages(agent.for_task(overrides, source=source), task.row)
    except ConfigError as exc:
        raise ConfigError(f"task {task.id}: {exc}") from None
    prompt = [{"role": str(m["role"]), "content": str(m["content"])} for m in messages]
    return {
        "data_source": data_source,
        "prompt": prompt,
        "agent_name": agent_name,
        "reward_model": {"style": REWARD_STYLE, "ground_truth": _ground_truth(task.row)},
        "extra_info": {
            "index": index,
            "task_id": task.id,
            "tools_kwargs": _json(overrides),
            "task": _json(dict(task.row)),
        },
        "index": index,
    }


def prepare_rows(
    tasks: Sequence[Task],
    config: AgentConfig | ResolvedAgent,
    *,
    agent_name: str = "uniagent",
    data_source: str = "uniagent",
) -> list[dict[str, Any]]:
    """verl rows for every task, indexed in order (the config is resolved once)."""
    agent = resolve(config) if isinstance(config, AgentConfig) else config
    return [
        prepare_row(task, agent, i, agent_name=agent_name, data_source=data_source)
        for i, task in enumerate(tasks)
    ]


def parquet_schema() -> Any:
    """The fixed Arrow schema of prepared files."""
    import pyarrow as pa

    text = pa.string()
    return pa.schema(
        [
            ("data_source", text),
            ("prompt", pa.list_(pa.struct([("role", text), ("content", text)]))),
            ("agent_name", text),
            ("reward_model", pa.struct([("style", text), ("ground_truth", text)])),
            (
                "extra_info",
                pa.struct(
                    [
                        ("index", pa.int64()),
                        ("task_id", text),
                        ("tools_kwargs", text),
                        ("task", text),
                    ]
                ),
            ),
            ("index", pa.int64()),
        ]
    )


def write_parquet(rows: Sequence[Mapping[str, Any]], out: str | Path) -> Path:
    """Write prepared rows with :func:`parquet_schema`; parent folders are created."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise ConfigError("writing Parquet needs pyarrow: pip install 'uniagent[data]'") from None
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pylist([dict(r) for r in rows], schema=parquet_schema())
    pq.write_table(table, out)
    return out


def prepare(
    tasks_path: str | Path,
    out: str | Path,
    *,
    config: AgentConfig | None = None,
    agent_name: str = "uniagent",
    data_source: str | None = None,
    limit: int | None = None,
) -> PrepareReport:
    """Load a task file, turn its tasks into verl rows and write them to ``out`` (Parquet)."""
    out = Path(out)
    if out.suffix != ".parquet":
        raise ConfigError(f"--out {out} must end in .parquet")
    # Harbor tasks get the config_overrides that run them on the config's deployment.
    deployment = dict(config.env.deployment) if config is not None else None
    build = ImageBuilder(deployment.get("engine", "auto")) if deployment else None
    tasks, bad = load_task_set(tasks_path, deployment, build=build)
    if limit is not None:
        tasks = tasks[:limit]
    if not tasks:
        raise ConfigError(f"task file {tasks_path} holds no usable task ({len(bad)} bad rows)")
    rows = prepare_rows(
        tasks,
        config if config is not None else AgentConfig.from_dict({}, source="default config"),
        agent_name=agent_name,
        data_source=data_source or Path(tasks_path).stem,
    )
    write_parquet(rows, out)
    return PrepareReport(out=out, rows=len(rows), bad_rows=tuple(bad))
