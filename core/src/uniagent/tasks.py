"""Loading task sets (JSONL or Parquet) and checking their rows.

A row is a task (an object with an id and the fields the prompt template uses),
or a row of a file ``uniagent data prepare`` wrote (verl's columns): then the task
is the row's ``extra_info.task``, its id ``extra_info.task_id``, its overrides of the
agent config ``extra_info.tools_kwargs`` (verl's name; a task row's own is
``config_overrides``) and its first messages the ``prompt`` column, exactly what verl
trains on.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from uniagent.errors import ConfigError

ID_FIELDS = ("instance_id", "task_id", "id")
#: Where a row keeps its overrides of the agent config (``uniagent run``'s name, verl's).
OVERRIDE_KEYS = ("config_overrides", "tools_kwargs")


@dataclass(frozen=True)
class Task:
    """One task row, with a stable id used for resuming."""

    id: str
    row: Mapping[str, Any]
    #: The first messages, when the row brings them (a prepared file's ``prompt``).
    messages: tuple[Mapping[str, Any], ...] | None = None
    #: The overrides, when the row brings them apart from the task (a prepared file).
    tools_kwargs: Mapping[str, Any] | None = None

    def overrides(self) -> dict[str, Any]:
        """The task's overrides of the agent config: the row's ``config_overrides``, or
        ``tools_kwargs`` (verl's name for them, kept because verl's dataset reads it),
        at the top level or in ``extra_info``; a row with both is refused."""
        if self.tools_kwargs is not None:
            return dict(self.tools_kwargs)
        extra = self.row.get("extra_info")
        found: dict[str, Any] = {}
        for key in OVERRIDE_KEYS:
            value = self.row.get(key)
            if value is None and isinstance(extra, Mapping):
                value = extra.get(key)
            if isinstance(value, str):  # Parquet files often hold nested data as JSON text
                value = json.loads(value) if value.strip() else None
            if value is None:
                continue
            if not isinstance(value, Mapping):
                raise ConfigError(f"task {self.id}: {key} must be a mapping, got {value!r}")
            found[key] = value
        if len(found) > 1:
            raise ConfigError(
                f"task {self.id}: give config_overrides (tools_kwargs is verl's name for "
                "them), not both"
            )
        return dict(next(iter(found.values()), {}))


@dataclass(frozen=True)
class BadRow:
    """A row that cannot run, with the reason (reported, then skipped); ``task_id`` where
    the row's id is known (a Harbor task folder's name), so an exclude list can name it."""

    line: int
    reason: str
    task_id: str | None = None


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
        try:
            task = prepared_task(row) if is_prepared(row) else None
        except ValueError as exc:
            bad.append(BadRow(line, str(exc)))
            continue
        if task is None:
            task_id = next((str(row[f]) for f in ID_FIELDS if row.get(f) not in (None, "")), None)
            if task_id is None:
                bad.append(BadRow(line, f"no id: a task needs one of {', '.join(ID_FIELDS)}"))
                continue
            task = Task(task_id, row)
        if task.id in seen:
            bad.append(BadRow(line, f"duplicate task id {task.id!r}"))
            continue
        seen.add(task.id)
        tasks.append(task)
    if not tasks and not bad:
        raise ConfigError(f"task file {path} holds no tasks")
    return tasks, bad


def is_prepared(row: Mapping[str, Any]) -> bool:
    """Whether a row is one ``uniagent data prepare`` wrote (verl's columns)."""
    extra = row.get("extra_info")
    return isinstance(extra, Mapping) and "task" in extra and "prompt" in row


def prepared_task(row: Mapping[str, Any]) -> Task:
    """The task of a prepared row; :class:`ValueError` says what is wrong with it."""
    extra = row["extra_info"]
    task_row = _json_field(extra.get("task"), "extra_info.task")
    if not isinstance(task_row, Mapping):
        raise ValueError("extra_info.task must be a task object (or its JSON)")
    task_id = extra.get("task_id") or next(
        (task_row[f] for f in ID_FIELDS if task_row.get(f) not in (None, "")), None
    )
    if task_id in (None, ""):
        raise ValueError("no id: a prepared row needs extra_info.task_id")
    kwargs = _json_field(extra.get("tools_kwargs"), "extra_info.tools_kwargs")
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise ValueError("extra_info.tools_kwargs must be a mapping (or its JSON)")
    prompt = row.get("prompt")
    if not isinstance(prompt, list | tuple) or not all(
        isinstance(m, Mapping) and "role" in m for m in prompt
    ):
        raise ValueError("prompt must be a list of chat messages (role, content)")
    messages = tuple({"role": str(m["role"]), "content": m.get("content")} for m in prompt)
    return Task(str(task_id), task_row, messages=messages or None, tools_kwargs=kwargs)


def _json_field(value: Any, name: str) -> Any:
    if isinstance(value, str):
        if not value.strip():
            return None
        try:
            return json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{name} is not valid JSON: {exc.msg}") from None
    return value


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
