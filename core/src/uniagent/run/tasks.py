"""Loading task sets (JSONL or Parquet) and checking their rows."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from uniagent.errors import ConfigError

ID_FIELDS = ("instance_id", "task_id", "id")


@dataclass(frozen=True)
class Task:
    """One task row, with a stable id used for resuming."""

    id: str
    row: Mapping[str, Any]

    def overrides(self) -> dict[str, Any]:
        """Per-task config overrides: ``tools_kwargs`` or verl's ``extra_info.tools_kwargs``."""
        found = self.row.get("tools_kwargs")
        extra = self.row.get("extra_info")
        if found is None and isinstance(extra, Mapping):
            found = extra.get("tools_kwargs")
        if isinstance(found, str):  # Parquet files often hold nested data as JSON text
            found = json.loads(found) if found.strip() else None
        if found is not None and not isinstance(found, Mapping):
            raise ConfigError(f"task {self.id}: tools_kwargs must be a mapping, got {found!r}")
        return dict(found or {})


@dataclass(frozen=True)
class BadRow:
    """A row that cannot run, with the reason (reported, then skipped)."""

    line: int
    reason: str


def load_tasks(path: str | Path) -> tuple[list[Task], list[BadRow]]:
    """Read a task file; rows that are not objects or lack an id are returned as bad rows."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"task file {path} does not exist")
    if path.suffix == ".parquet":
        rows = list(_parquet_rows(path))
    elif path.suffix in {".jsonl", ".json"}:
        rows = list(_jsonl_rows(path))
    else:
        raise ConfigError(f"task file {path} must be .jsonl or .parquet")
    tasks: list[Task] = []
    bad: list[BadRow] = []
    seen: set[str] = set()
    for line, row in rows:
        if isinstance(row, BadRow):
            bad.append(row)
            continue
        if not isinstance(row, Mapping):
            bad.append(BadRow(line, f"a task must be a JSON object, got {type(row).__name__}"))
            continue
        task_id = next((str(row[f]) for f in ID_FIELDS if row.get(f) not in (None, "")), None)
        if task_id is None:
            bad.append(BadRow(line, f"no id: a task needs one of {', '.join(ID_FIELDS)}"))
            continue
        if task_id in seen:
            bad.append(BadRow(line, f"duplicate task id {task_id!r}"))
            continue
        seen.add(task_id)
        tasks.append(Task(task_id, row))
    if not tasks and not bad:
        raise ConfigError(f"task file {path} holds no tasks")
    return tasks, bad


def _jsonl_rows(path: Path) -> Iterator[tuple[int, Any]]:
    with path.open(encoding="utf-8") as handle:
        for number, text in enumerate(handle, 1):
            if not text.strip():
                continue
            try:
                yield number, json.loads(text)
            except json.JSONDecodeError as exc:
                yield number, BadRow(number, f"not valid JSON: {exc.msg} (column {exc.colno})")


def _parquet_rows(path: Path) -> Iterator[tuple[int, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ConfigError("reading .parquet needs pyarrow: pip install 'uniagent[data]'") from None
    try:
        table = pq.read_table(path)
    except Exception as exc:
        raise ConfigError(f"task file {path} is not a readable Parquet file: {exc}") from None
    yield from enumerate(table.to_pylist(), 1)
