"""What ``/proc`` says about processes: now :mod:`uniagent.procfs` (importable without the
sandboxes, for readers of run folders); this name stays for the sandbox code and plugins."""

from __future__ import annotations

from uniagent.procfs import (
    CLOCK_TICKS,
    ProcInfo,
    boot_ticks,
    children,
    comm,
    fd_target,
    group_members,
    info,
    reading_stdin,
    subtree,
)

__all__ = [
    "CLOCK_TICKS",
    "ProcInfo",
    "boot_ticks",
    "children",
    "comm",
    "fd_target",
    "group_members",
    "info",
    "reading_stdin",
    "subtree",
]
