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


def is_infra_failure(record: Mapping[str, Any]) -> bool:
    """Whether an episode record ended for the infrastructure's reasons."""
    return record.get("exit_reason") in INFRA_REASONS


def latest(records: Iterable[Mapping[str, Any]]) -> dict[Key, dict[str, Any]]:
    """The latest record of each (task, sample), in first-seen order."""
    found: dict[Key, dict[str, Any]] = {}
    for record in records:
        key = (record["task_id"], record["sample"])
        found.pop(key, None)
        found[key] = dict(record)
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
        """Append one line and make it durable before returning (thread-safe)."""
        with self._lock, self.path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
