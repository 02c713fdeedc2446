"""The output folder of a run: its lock, its episode directories and their files.

Layout::

    OUT/.lock                          held (flock) while a run uses the folder
    OUT/manifest.json                  what the run is (see uniagent.run.manifest)
    OUT/results.jsonl                  one line per finished (task, sample)
    OUT/summary.json                   written when a run ends
    OUT/episodes/<task>/<sample>/      messages.json, rollout.json, result.json, log.txt of
                                       the latest attempt; attempt-<n>.log: earlier ones
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from uniagent.errors import ConfigError

LOCK = ".lock"
LOG = "log.txt"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_MAX_NAME = 96


def safe_name(task_id: str) -> str:
    """A directory name for a task id, different for different ids.

    Ids made only of letters, digits, ``.``, ``_`` and ``-`` (and not starting with
    ``.``) are used as they are; any other id is sanitised and gets ``+`` and a
    digest of the id, a character no id used as it is contains, so ``proj/issue-1``
    and ``proj_issue-1`` never share a directory.
    """
    cleaned = _UNSAFE.sub("_", task_id).strip("._")
    if cleaned == task_id and 0 < len(task_id) <= _MAX_NAME:
        return task_id
    digest = hashlib.sha256(task_id.encode("utf-8")).hexdigest()[:10]
    return f"{cleaned[:_MAX_NAME] or 'task'}+{digest}"


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
    ``log.txt`` is always the latest attempt's.
    """
    directory.mkdir(parents=True, exist_ok=True)
    earlier = 0
    for path in directory.glob("attempt-*.log"):
        with contextlib.suppress(ValueError):
            earlier = max(earlier, int(path.stem.removeprefix("attempt-")))
    log = directory / LOG
    if log.exists():
        earlier += 1
        log.replace(directory / f"attempt-{earlier}.log")
    return earlier + 1


def write_episode(
    directory: Path, payload: Mapping[str, Any], extra: Mapping[str, Any]
) -> dict[str, Any]:
    """Save an attempt's messages, rollout cache and result; return its results record."""
    directory.mkdir(parents=True, exist_ok=True)
    record = {**payload["record"], **extra, "episode_dir": str(directory)}
    # Compact: the C encoder (indentation would take the pure-Python one, ~10x the CPU).
    write_json(directory / "messages.json", payload["messages"], indent=None)
    rollout = directory / "rollout.json"
    if payload["rollout"] is not None:
        write_json(rollout, payload["rollout"], indent=None)
    else:  # not an earlier attempt's
        rollout.unlink(missing_ok=True)
    write_json(directory / "result.json", record)
    return record


def write_json(path: Path, data: Any, *, indent: int | None = 1) -> None:
    """Write JSON atomically (a reader never sees half a file)."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, ensure_ascii=False, indent=indent), encoding="utf-8")
    tmp.replace(path)
