"""The results file of a run and what counts as done.

``results.jsonl`` gets one line per (task, sample) each time a run finishes it:
with a policy outcome, or with an infrastructure failure its retries did not
cure. A later run re-runs the infrastructure failures (unless told to keep
them) and appends the new outcome, so the latest line of a pair is its result.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from uniagent.exit import ExitReason

#: Exit reasons that are the infrastructure's doing, never the policy's: retried within a
#: run and re-run on resume. (The exit policy masks them by default; a user's exit policy
#: may mask more reasons for training, which does not make those infrastructure.)
INFRA_REASONS = frozenset(
    {
        ExitReason.ENV_ERROR.value,
        ExitReason.MODEL_ERROR.value,
        ExitReason.TERMINAL_NOT_ALIVE.value,
        ExitReason.REWARD_ERROR.value,
        ExitReason.UNKNOWN_ERROR.value,
    }
)

Key = tuple[str, int]

#: A tree rollout's record (``interaction.branching``) holds its leaves' rows under this
#: key; the results file gets one line per leaf (``leaf``, ``leaf_index``, ``leaves``), and
#: :func:`latest` puts an attempt's lines together again.
LEAF_ROWS = "leaf_rows"
#: What a leaf's line takes from its episode's record (where and how it ran).
_SHARED = (
    "episode_dir",
    "attempt",
    "previous_attempts",
    "outcome",
    "timings",
    "wall_seconds",
    "log",
    "model_server",
)


def is_infra_failure(record: Mapping[str, Any]) -> bool:
    """Whether an episode record ended for the infrastructure's reasons (a tree rollout's:
    any of its leaves; the whole tree is run again, so that a task's leaves are one try's)."""
    if record.get("exit_reason") in INFRA_REASONS:
        return True
    rows = record.get(LEAF_ROWS) or ()
    if any(r.get("leaves") not in (None, len(rows)) for r in rows):
        return True  # a write cut short by a crash: fewer leaf lines than the tree had
    return any(r.get("exit_reason") in INFRA_REASONS for r in rows)


def lines_of(record: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The results-file lines of one record: itself, or a tree rollout's leaf rows."""
    leaves = record.get(LEAF_ROWS)
    if not leaves:
        return [dict(record)]
    shared = {k: record[k] for k in _SHARED if k in record}
    return [
        {**row, **shared, "leaf_index": i, "leaves": len(leaves)} for i, row in enumerate(leaves)
    ]


def episodes_of(records: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per episode, a tree rollout's leaves each counted as one (the summary's)."""
    return [row for record in records for row in lines_of(record)]


def latest(records: Iterable[Mapping[str, Any]]) -> dict[Key, dict[str, Any]]:
    """The latest record of each (task, sample), in first-seen order. A tree rollout's
    lines come back as one record: its first leaf's, the rows under :data:`LEAF_ROWS`."""
    found: dict[Key, dict[str, Any]] = {}
    for record in records:
        key = (record["task_id"], record["sample"])
        index = record.get("leaf_index")
        group = found.get(key)
        if isinstance(index, int) and index > 0 and group is not None and LEAF_ROWS in group:
            group[LEAF_ROWS].append(dict(record))  # the same attempt's next leaf
            continue
        found.pop(key, None)
        found[key] = dict(record)
        if index == 0:
            found[key][LEAF_ROWS] = [dict(record)]
    return found


def done_keys(records: Mapping[Key, Mapping[str, Any]], *, keep_failures: bool) -> set[Key]:
    """Pairs a resumed run skips: policy outcomes, and infrastructure failures if kept."""
    return {k for k, r in records.items() if keep_failures or not is_infra_failure(r)}


class ResultsFile:
    """The append-only results file: one JSON line per finished episode."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()  # appends come from worker threads

    def load(self) -> list[dict[str, Any]]:
        """Every record; a line cut short by a crash is ignored (that episode reruns)."""
        if not self.path.exists():
            return []
        records = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(record, dict) and "task_id" in record and "sample" in record:
                records.append(record)
        return records

    def repair(self) -> None:
        """Drop a partial last line so appends start on a fresh line."""
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        if data and not data.endswith(b"\n"):
            self.path.write_bytes(data[: data.rfind(b"\n") + 1])

    def append(self, record: Mapping[str, Any]) -> None:
        """Append its line (a tree rollout's: one per leaf, in one write) and make it
        durable before returning (thread-safe)."""
        text = "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines_of(record))
        with self._lock, self.path.open("a", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
