"""Writing the output folder of a run: its lock, its episode directories and their files.

What goes where is :mod:`uniagent.run.layout`'s to say; this module writes it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from uniagent.errors import ConfigError
from uniagent.run.layout import (
    LOCK,
    LOG,
    MESSAGES,
    RESULT,
    ROLLOUT,
    TASK_ERROR,
    attempt_log,
    attempt_of_log,
    safe_name,
)

__all__ = [
    "LOCK",
    "LOG",
    "FolderLock",
    "safe_name",
    "start_attempt",
    "write_episode",
    "write_json",
    "write_task_error",
]


class FolderLock:
    """An exclusive ``flock`` on ``OUT/.lock``: one run per output folder at a time.

    The kernel drops the lock when the process ends, however it ends, so a killed
    run never leaves a stale lock behind.
    """

    def __init__(self, out: Path) -> None:
        self.path = out / LOCK
        self._handle: IO[str] | None = None

    def acquire(self) -> None:
        """Take the lock or raise :class:`ConfigError` naming the process that holds it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle = self.path.open("a+", encoding="utf-8")
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            handle.close()
            raise ConfigError(
                f"{self.path.parent} is in use by another `uniagent run` (pid {holder}); "
                "wait for it to finish, or use another --out"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        self._handle = handle

    def release(self) -> None:
        """Release the lock (the file stays: removing it would race a waiting run)."""
        if self._handle is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._handle.fileno(), fcntl.LOCK_UN)
            self._handle.close()
            self._handle = None


def start_attempt(directory: Path) -> int:
    """Number the attempt about to start in an episode directory (1 for a new one).

    The previous attempt's ``log.txt`` (finished, failed or cut short by a crash) is
    moved to ``attempt-<n>.log`` first, so every attempt keeps exactly one log and
    ``log.txt`` is always the latest attempt's. A new, empty ``log.txt`` marks the
    attempt as started, whichever backend runs it (a Ray worker's log comes at its end);
    a task error of an earlier attempt is removed.
    """
    directory.mkdir(parents=True, exist_ok=True)
    earlier = 0
    with os.scandir(directory) as entries:
        for entry in entries:
            earlier = max(earlier, attempt_of_log(entry.name) or 0)
    log = directory / LOG
    if log.exists():
        earlier += 1
        log.replace(directory / attempt_log(earlier))
    (directory / TASK_ERROR).unlink(missing_ok=True)
    log.touch()
    return earlier + 1


def write_task_error(directory: Path, task_id: str, sample: int, error: str) -> None:
    """Record in its episode directory that a task could not start (bad input), and why."""
    directory.mkdir(parents=True, exist_ok=True)
    write_json(directory / TASK_ERROR, {"task_id": task_id, "sample": sample, "error": error})


def write_episode(
    directory: Path, payload: Mapping[str, Any], extra: Mapping[str, Any]
) -> dict[str, Any]:
    """Save an attempt's messages, rollout and result; return its results record."""
    directory.mkdir(parents=True, exist_ok=True)
    record = {**payload["record"], **extra, "episode_dir": str(directory)}
    # Compact: the C encoder (indentation would take the pure-Python one, ~10x the CPU).
    write_json(directory / MESSAGES, payload["messages"], indent=None)
    rollout = directory / ROLLOUT
    if payload["rollout"] is not None:
        write_json(rollout, payload["rollout"], indent=None)
    else:  # not an earlier attempt's
        rollout.unlink(missing_ok=True)
    write_json(directory / RESULT, record)
    return record


def write_json(path: Path, data: Any, *, indent: int | None = 1) -> None:
    """Write JSON atomically (a reader never sees half a file)."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, ensure_ascii=False, indent=indent), encoding="utf-8")
    tmp.replace(path)
