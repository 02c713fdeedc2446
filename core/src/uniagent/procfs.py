"""What ``/proc`` says about processes: children, states, CPU time, signals, file locks.

Used on the rare interrupt path to decide whether a signal is still on its way,
being handled, or ignored (see :meth:`uniagent.env.bash_session.BashSession.interrupt`),
and to find the foreground programs of a session, including ones that left its
process group (``setsid``); and to tell whether the process that owns a run folder still
runs (its start time, its folder lock). Only the standard library is imported: readers
of run folders (``uniagent view``) use it without loading the sandboxes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class ProcInfo:
    """One process: scheduler state, group, CPU seconds, start time, signal masks."""

    pid: int
    state: str
    pgid: int
    cpu: float
    start_ticks: int
    pending: int
    ignored: int

    def ignores(self, sig: int) -> bool:
        """Whether the process ignores ``sig``."""
        return bool(self.ignored >> (sig - 1) & 1)

    def has_pending(self, sig: int) -> bool:
        """Whether ``sig`` was sent and not delivered yet (the process has not run since)."""
        return bool(self.pending >> (sig - 1) & 1)


def info(pid: int) -> ProcInfo | None:
    """The process ``pid``, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        with open(f"/proc/{pid}/status", "rb") as f:
            status = f.read()
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2 :].split()
    pending = ignored = 0
    for line in status.splitlines():
        key, _, value = line.partition(b":")
        if key in (b"SigPnd", b"ShdPnd"):
            pending |= int(value, 16)
        elif key == b"SigIgn":
            ignored = int(value, 16)
    return ProcInfo(
        pid=pid,
        state=fields[0].decode(),
        pgid=int(fields[2]),
        cpu=(int(fields[11]) + int(fields[12])) / CLOCK_TICKS,
        start_ticks=int(fields[19]),
        pending=pending,
        ignored=ignored,
    )


def children(pid: int) -> list[int]:
    """Direct children of ``pid`` (of all its threads)."""
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                found += [int(p) for p in f.read().split()]
        except OSError:
            continue
    return found


def subtree(pid: int) -> list[int]:
    """``pid`` and all its descendants."""
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        out.append(current)
        todo += children(current)
    return out


def boot_ticks() -> int:
    """Now, in the clock ticks since boot that ``/proc/PID/stat`` start times use."""
    with open("/proc/uptime") as f:
        return int(float(f.read().split()[0]) * CLOCK_TICKS)


def reading_stdin(pid: int) -> bool | None:
    """Whether ``pid`` is blocked in ``read(0, ...)``; None when the kernel does not say."""
    try:
        with open(f"/proc/{pid}/syscall") as f:
            fields = f.read().split()
    except OSError:
        return None
    if not fields or fields[0] == "running":
        return False
    return fields[0] == "0" and len(fields) > 1 and int(fields[1], 16) == 0


def fd_target(pid: int, fd: int) -> str | None:
    """What descriptor ``fd`` of ``pid`` points to (``socket:[N]``, a path), None if closed."""
    try:
        return os.readlink(f"/proc/{pid}/fd/{fd}")
    except OSError:
        return None


def comm(pid: int) -> str:
    """The process's command name."""
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def group_members(pgid: int) -> list[int]:
    """PIDs whose process group is ``pgid`` (a scan of /proc)."""
    members = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 2 and int(fields[2]) == pgid:
            members.append(int(entry.name))
    return members


def flock_held(device: int, inode: int, pid: int | None = None) -> bool | None:
    """Whether some process holds a ``flock`` on the file ``(device, inode)``; None when
    ``/proc/locks`` cannot be read.

    A lock also counts when only its inode and holder (``pid``) match: on an overlay
    filesystem ``/proc/locks`` names the underlying device, not the one ``stat`` gives.
    """
    try:
        with open("/proc/locks", "rb") as f:
            table = f.read()
    except OSError:
        return None
    wanted = f"{os.major(device):02x}:{os.minor(device):02x}:{inode}".encode()
    suffix = f":{inode}".encode()
    for line in table.splitlines():
        fields = line.split()
        # "1: FLOCK  ADVISORY  WRITE 1234 fe:00:5678 0 EOF"; a waiter's line: "1: -> FLOCK ..."
        if len(fields) < 6 or fields[1] != b"FLOCK":
            continue
        where, holder = fields[5], fields[4]
        if where == wanted:
            return True
        if pid is not None and where.endswith(suffix) and holder == str(pid).encode():
            return True
    return False
