"""Whether a run is still going, and which of its episode folders the current invocation
wrote: from the folder's lock, the manifest's pid, its start time and its (re)start times,
and file times.
"""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path
from typing import Any

from uniagent import procfs
from uniagent.view.files import open_regular

_SINCE_WINDOW_NS = 60 * 10**9  # a manifest written this long after its start is its own


def started_ns(manifest: dict[str, Any] | None, sig: tuple[int, ...] | None) -> int | None:
    """When the invocation that wrote the manifest began (ns since the epoch), or None.

    ``started_at`` is whole seconds; the manifest's own modification time is exact, and
    used when it agrees with ``started_at`` (a copied or edited manifest does not).
    """
    mtime = sig[2] if sig else None
    manifest = manifest or {}
    # A resumed run keeps its first start; this invocation's is the last resume.
    resumed = manifest.get("resumed_at")
    starts = [manifest.get("started_at"), *(resumed if isinstance(resumed, list) else [])]
    known = [t for t in (_epoch_ns(s) for s in starts) if t is not None]
    if not known:
        return mtime
    started = max(known)
    if mtime is not None and started <= mtime < started + _SINCE_WINDOW_NS:
        return mtime
    return started


def _epoch_ns(value: Any) -> int | None:
    if not isinstance(value, str):
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return None
    if moment.tzinfo is None:
        return None  # a time without its zone cannot be compared with file times
    return int(moment.timestamp()) * 10**9


def touched_since(folder: Path, since_ns: int | None) -> bool:
    """Whether ``folder`` or a file in it was written at or after ``since_ns``."""
    if since_ns is None:
        return True
    try:
        if folder.stat().st_mtime_ns >= since_ns:
            return True
        with os.scandir(folder) as entries:
            return any(e.stat(follow_symlinks=False).st_mtime_ns >= since_ns for e in entries)
    except OSError:
        return False


def lock_held(path: Path) -> bool:
    """Whether a process holds the run folder's lock ``path`` now (``uniagent run`` takes it
    before anything else, and keeps it to the end); False where ``/proc/locks`` is missing.

    Only looked at, never taken: a reader must not make a starting run find it in use.
    """
    handle = open_regular(path)
    if handle is None:
        return False
    with handle:
        try:
            st = os.fstat(handle.fileno())
            text = handle.read(64).decode("ascii", errors="replace").strip()
        except OSError:
            return False
    pid = int(text) if text.isascii() and text.isdigit() else None
    return bool(procfs.flock_held(st.st_dev, st.st_ino, pid))


def owner_alive(pid: int, start: Any) -> bool:
    """Whether the process that wrote the manifest runs: ``pid``, started at ``start``
    (clock ticks since boot, as ``/proc`` gives them), so a reused pid does not count."""
    if isinstance(start, int) and not isinstance(start, bool):
        proc = procfs.info(pid)
        if proc is not None:
            return proc.start_ticks == start and proc.state not in ("Z", "X")
    return pid_is_uniagent(pid)


def pid_is_uniagent(pid: int) -> bool:
    """Whether process ``pid`` exists and (where /proc tells) is a uniagent command."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True  # no /proc here: the process exists, trust it
    return b"uniagent" in cmdline
