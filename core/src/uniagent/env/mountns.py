"""A small mount namespace for each bubblewrap sandbox to start in.

``bwrap`` copies the mount namespace it starts in and reads that namespace's whole mount
table once per mount it makes. Each episode's disk limit is a tmpfs mounted in this
process's namespace (and a layered sandbox's work dir an overlay), so with many sandboxes
open every start copied and parsed every other sandbox's mounts: the cost of a start grew
with the number of sandboxes (``bench/sandbox.py`` here: 500 sandboxes started in 19 s with
their tmpfs mounts, in 4.6 s without them; 1,000 in 60 s).

So bwrap starts elsewhere. One thread of this process keeps a *base* namespace: a private
copy of this process's, made once, with every episode's mount detached from it. Each sandbox
gets a copy of the base with only its own episode directory attached (a clone of its mounts,
``open_tree(2)`` and ``move_mount(2)``, Linux 5.2), held by a file descriptor of this process
for the sandbox's life; its commands enter that namespace with ``nsenter`` before bwrap
starts, in the same ``nsenter`` that makes them the sandbox's user (which ``setpriv`` did:
no process more than before). This process keeps working on the episode's files at their
usual paths, in its own namespace. Where any step is refused (no root, an older kernel, a
security module) the sandbox starts from this process's namespace, as before.

The base is a copy taken when the first such sandbox starts: a mount made on the host after that
(under a path given to ``ro_binds``, say) is not seen by later sandboxes.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import errno
import logging
import os
import re
import threading
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

#: The sources this package names its mounts with (host.py): the episode's tmpfs, a layered
#: work dir's overlay. Every such mount is detached from the base namespace.
EPISODE_SOURCES = frozenset({"uniagent-episode", "uniagent-layers"})

# Linux's generic syscall numbers (the same on x86_64 and arm64 since 5.2), flags.
_SYS_OPEN_TREE = 428
_SYS_MOVE_MOUNT = 429
_OPEN_TREE_CLONE = 1
_AT_RECURSIVE = 0x8000
_AT_FDCWD = -100
_MOVE_MOUNT_F_EMPTY_PATH = 0x4
_CLONE_NEWNS = 0x00020000
_MS_REC = 0x4000
_MS_PRIVATE = 1 << 18
#: umount2(2) flag: detach now, clean up when no longer busy (``umount -l``).
MNT_DETACH = 2

_libc: Any = None


def libc_call(name: str, *args: Any) -> int:
    """A libc call (mount(2), umount2(2), ...: no process per sandbox); its result, or an
    OSError with errno."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    result = int(getattr(_libc, name)(*args))
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{name}: {os.strerror(code)}")
    return result


def unescape_path(field: str) -> str:
    """A path of ``/proc/*/mountinfo`` (space, tab, newline, backslash octal-escaped)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def episode_mounts(mountinfo: str) -> list[str]:
    """The mount points of the episodes' mounts in a ``mountinfo`` table, deepest first."""
    points = []
    for line in mountinfo.splitlines():
        fields = line.split(" ")
        if "-" not in fields:
            continue
        after = fields[fields.index("-") + 1 :]
        if len(after) >= 2 and after[1] in EPISODE_SOURCES:
            points.append(unescape_path(fields[4]))
    return sorted(set(points), key=lambda p: (-p.count("/"), p))


class _Namespaces:
    """The thread that makes sandboxes' namespaces (mount namespaces are per thread once a
    thread has its own: it moves between them, no other thread of this process does)."""

    def __init__(self) -> None:
        self._pool = concurrent.futures.ThreadPoolExecutor(1, "uniagent-mountns")
        self._base: int | None = None
        #: Why this process cannot make them ("" while it can).
        self.problem = ""

    def make(self, clone: int, root: str) -> int:
        return self._pool.submit(self._make, clone, root).result()

    def _make(self, clone: int, root: str) -> int:
        if self.problem:
            raise OSError(self.problem)
        if self._base is None:
            try:
                self._base = self._make_base()
            except OSError as exc:
                self.problem = str(exc)
                raise
        libc_call("unshare", _CLONE_NEWNS)
        made = None
        try:
            libc_call("syscall", _SYS_MOVE_MOUNT, clone, b"", _AT_FDCWD, os.fsencode(root),
                      _MOVE_MOUNT_F_EMPTY_PATH)  # fmt: skip
            made = os.open("/proc/thread-self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
        finally:
            try:
                libc_call("setns", self._base, _CLONE_NEWNS)  # never left in a sandbox's
            except OSError as exc:
                self.problem = f"back to the base namespace: {exc}"  # none made from here
                if made is not None:
                    os.close(made)
                raise
        return made

    def _make_base(self) -> int:
        libc_call("unshare", _CLONE_NEWNS)
        # Private: nothing mounted or unmounted here reaches this process's namespace, and
        # the host's later episode mounts do not reach here.
        libc_call("mount", None, b"/", None, _MS_REC | _MS_PRIVATE, None)
        with open("/proc/thread-self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
            table = f.read()
        for point in episode_mounts(table):
            try:
                libc_call("umount2", os.fsencode(point), MNT_DETACH)
            except OSError as exc:
                # Not a mount point any more (below one detached already: an overlay in a
                # tmpfs), or gone (another process removed its sandbox meanwhile).
                if exc.errno not in (errno.EINVAL, errno.ENOENT):
                    raise
        return os.open("/proc/thread-self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)


_namespaces: _Namespaces | None = None
_namespaces_lock = threading.Lock()


def _forget() -> None:
    """In a forked child: the thread (and its namespaces) stayed with the parent, and the
    lock may have been held by a thread that did not come along."""
    global _namespaces, _namespaces_lock
    _namespaces, _namespaces_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget)


def sandbox_namespace(root: Path) -> int | None:
    """A file descriptor of a new mount namespace for the sandbox whose episode directory
    ``root`` is a mount point (its tmpfs): the base namespace with ``root``'s mounts attached.
    ``None`` where it cannot be made (said once, in the log). Blocking: call it from a worker
    thread; the caller closes it when the sandbox's processes have ended."""
    global _namespaces
    with _namespaces_lock:  # one helper thread per process, whichever thread asks first
        if _namespaces is None:
            _namespaces = _Namespaces()
    if _namespaces.problem:
        return None
    try:
        clone = libc_call("syscall", _SYS_OPEN_TREE, _AT_FDCWD, os.fsencode(root),
                          _OPEN_TREE_CLONE | _AT_RECURSIVE | os.O_CLOEXEC)  # fmt: skip
        try:
            return _namespaces.make(clone, str(root))
        finally:
            os.close(clone)
    except OSError as exc:
        _namespaces.problem = _namespaces.problem or str(exc)
    log.info(
        "bubblewrap sandboxes start in this process's mount namespace (%s): a start reads "
        "every other sandbox's mounts",
        _namespaces.problem,
    )
    return None


def namespace_path(fd: int) -> str:
    """A path of the namespace this process holds as ``fd``, for ``nsenter --mount``."""
    return f"/proc/{os.getpid()}/fd/{fd}"
