"""Whether anything under a walked root changed since its walk started, from the kernel.

Without isolation, a check of the test environment before grading walks its roots again
(:mod:`uniagent.grading.walks`): a file's content changes its own ctime, not its
directory's, so every file is ``lstat``-ed, tens of thousands for a site-packages, per
episode, whatever the agent did. Where this process may (root: ``CAP_SYS_ADMIN``), a
fanotify group marks the root's whole file system (``FAN_MARK_FILESYSTEM``), reporting each
change with the inode it touched and the directory it was made in (``FAN_REPORT_FID``,
``FAN_REPORT_DFID_NAME``): a write, a truncation, a ``close`` of a file opened for writing
(what a write through a shared mapping leaves), an attribute or link-count change (a hard
link made elsewhere), a name created, deleted or moved. A walk that started after the
group was armed records the inodes it listed (:meth:`FsWatch.begin`,
:meth:`WalkToken.seen`); while no change reported since then touched one of them (as the
object or as the directory of a name), and the mount table at, above and below the root
is what it was, the tree is
the one the walk saw (:meth:`WalkToken.clean`), and its ctimes answer any later baseline's
"what changed since".

The kernel queues each event before the call that caused it returns, so once the agent's
processes are gone every change they made, through any path, hard link or bind mount of
that file system, is in the queue. Anything this cannot judge makes every walk of the file
system doubtful, and they walk again: a queue overflow, a file handle of a kind it cannot
read (only the 32-bit inode and generation handle of ext4 and its kin is read), a change of
the mount table (a mount over a walked directory sends no event), a process forked from
the one that armed the group. ``UNIAGENT_FS_WATCH=0`` turns it off (every check walks).
While armed, a group costs every write on its file system a little kernel time, whoever
makes it, so one unused for :data:`IDLE_SECONDS` is closed (its walks become doubtful) and
the next walk arms another.

Without isolation nothing bounds the agent (``docs/rewards.md``): as root a process can
leave its cgroup, survive the stop and write later, seen or not.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import struct
import sys
import threading
import time
import weakref
from collections.abc import Iterable
from typing import Any

from uniagent.env.mountns import unescape_path

log = logging.getLogger(__name__)

FAN_CLOEXEC = 0x1
FAN_NONBLOCK = 0x2
FAN_REPORT_FID = 0x200
FAN_REPORT_DIR_FID = 0x400
FAN_REPORT_NAME = 0x800
FAN_MARK_ADD = 0x1
FAN_MARK_FILESYSTEM = 0x100
FAN_MODIFY = 0x2
FAN_ATTRIB = 0x4
FAN_CLOSE_WRITE = 0x8
FAN_MOVED_FROM = 0x40
FAN_MOVED_TO = 0x80
FAN_CREATE = 0x100
FAN_DELETE = 0x200
FAN_DELETE_SELF = 0x400
FAN_MOVE_SELF = 0x800
FAN_Q_OVERFLOW = 0x4000
FAN_ONDIR = 0x40000000
#: Every change of content, attributes or names, of files and directories.
MASK = (
    FAN_MODIFY | FAN_ATTRIB | FAN_CLOSE_WRITE | FAN_MOVED_FROM | FAN_MOVED_TO | FAN_CREATE
    | FAN_DELETE | FAN_DELETE_SELF | FAN_MOVE_SELF | FAN_ONDIR
)  # fmt: skip
#: Info records that carry a file handle (object, directory, directory and name, the old
#: and new directory of a rename).
_FID_RECORDS = frozenset({1, 2, 3, 10, 12})
#: ``FILEID_INO32_GEN``: a 32-bit inode number and its generation (ext2/3/4 and others
#: using the kernel's generic encoder).
_INO32_GEN = 1
AT_FDCWD = -100
AT_HANDLE_FID = 0x200
_METADATA = struct.Struct("=IBBHQii")
_INFO = struct.Struct("=BBH")
_HANDLE = struct.Struct("=Ii")
#: A group unused this long (s) is closed (its walks are walked again; a later walk arms a new
#: one): while armed, every write on its file system costs the kernel about a microsecond
#: more, whoever makes it.
IDLE_SECONDS = 30.0
#: Inodes an unfinished walk keeps from the events that came while it walked; beyond, it is
#: doubtful (judged when it ends).
PENDING_MAX = 100_000


class WalkToken:
    """One walk's standing with its file system's watch: :meth:`clean` while no reported
    change touched an inode it listed since it started."""

    def __init__(self, watch: FsWatch, root: str) -> None:
        self._watch = watch
        self.root = root
        self._mounts = _mounts(root)
        self.dirty = False
        self.inodes: set[int] | None = None
        #: The inodes changes touched while the walk was under way (``None``: too many).
        self.pending: list[int] | None = []

    def seen(self, inodes: Iterable[int]) -> None:
        """The walk ended; ``inodes``: every inode it listed (its root's included)."""
        self._watch.ended(self, set(inodes))

    def clean(self) -> bool:
        """Whether nothing the walk listed changed since it started (blocking: reads the
        queued changes first)."""
        return self._watch.clean(self)


class FsWatch:
    """A fanotify group marking one file system, drained by whoever asks."""

    def __init__(self, fd: int, dev: int) -> None:
        self.fd = fd
        self.dev = dev
        self.pid = os.getpid()
        self._lock = threading.Lock()
        self._tokens: weakref.WeakSet[WalkToken] = weakref.WeakSet()
        #: How many events were read.
        self.events = 0
        self._used = time.monotonic()
        if fd >= 0:
            threading.Thread(
                target=self._close_when_idle, name="uniagent-fswatch", daemon=True
            ).start()

    def begin(self, root: str) -> WalkToken | None:
        """A token for a walk of ``root`` about to start (``None``: this watch cannot judge
        any more)."""
        with self._lock:
            if not self._usable():
                return None
            self._drain()
            self._used = time.monotonic()
            token = WalkToken(self, root)
            self._tokens.add(token)
            return token

    def ended(self, token: WalkToken, inodes: set[int]) -> None:
        with self._lock:
            if self._usable():
                self._drain()
            else:
                token.dirty = True
            pending, token.pending = token.pending, None
            token.inodes = inodes
            if pending is None or not inodes.isdisjoint(pending):
                token.dirty = True

    def clean(self, token: WalkToken) -> bool:
        with self._lock:
            if token.dirty or token.inodes is None:
                return False
            if not self._usable():
                token.dirty = True
                return False
            self._drain()
            self._used = time.monotonic()
            mounts = _mounts(token.root) if not token.dirty else None
            if mounts is None or mounts != token._mounts:
                token.dirty = True
            return not token.dirty

    def close_if_idle(self, now: float) -> bool:
        """Close the group where it was last used :data:`IDLE_SECONDS` before ``now``
        (monotonic); whether it is closed."""
        with self._lock:
            if self.fd >= 0 and now - self._used >= IDLE_SECONDS and self._usable():
                self._close()
            return self.fd < 0

    def _close_when_idle(self) -> None:
        while not self.close_if_idle(time.monotonic()):
            time.sleep(IDLE_SECONDS / 3)

    def _usable(self) -> bool:
        return self.fd >= 0 and os.getpid() == self.pid

    def _drain(self) -> None:
        """Read every queued event and mark the walks whose inodes they touched."""
        while True:
            try:
                data = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                return
            except OSError as exc:
                log.warning("the file system watch stopped (%s); roots are walked again", exc)
                self._close()
                return
            if not data:
                return
            self._read(data)

    def _read(self, data: bytes) -> None:
        tokens = [t for t in self._tokens if not t.dirty]
        offset = 0
        while offset + _METADATA.size <= len(data):
            length, _, _, meta_length, mask, _, _ = _METADATA.unpack_from(data, offset)
            if length < _METADATA.size:  # (never: the kernel's own records)
                self._spoil(tokens)
                return
            self.events += 1
            start, offset = offset, offset + length
            if not tokens:
                continue
            overflow = mask & FAN_Q_OVERFLOW
            inodes = None if overflow else _inodes(data, start + meta_length, offset)
            if inodes is None:
                self._spoil(tokens)
                tokens = []
                continue
            for token in tokens:
                if token.pending is not None and token.inodes is None:
                    if len(token.pending) + len(inodes) > PENDING_MAX:
                        token.pending = None  # judged doubtful when it ends
                    else:
                        token.pending.extend(inodes)
                elif token.inodes is not None and not token.inodes.isdisjoint(inodes):
                    token.dirty = True
            tokens = [t for t in tokens if not t.dirty]

    def _spoil(self, tokens: Iterable[WalkToken]) -> None:
        for token in tokens:
            if token.inodes is None:
                token.pending = None
            else:
                token.dirty = True

    def _close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)
        self.fd = -1
        self._spoil(list(self._tokens))


def _inodes(data: bytes, start: int, end: int) -> list[int] | None:
    """The inodes an event's info records name (``None``: one it cannot read, or none)."""
    found: list[int] = []
    offset = start
    while offset + _INFO.size <= end:
        kind, _, length = _INFO.unpack_from(data, offset)
        if length < _INFO.size:
            return None
        if kind in _FID_RECORDS:
            # header, fsid (8 bytes), struct file_handle (bytes, type), the handle
            size, handle_type = _HANDLE.unpack_from(data, offset + 12)
            if handle_type != _INO32_GEN or size != 8 or offset + 20 + size > end:
                return None
            found.append(struct.unpack_from("=I", data, offset + 20)[0])
        offset += length
    return found or None


def _mounts(root: str) -> list[str] | None:
    """The lines of this process's mount table whose mount point is ``root``, above it or
    below it (a mount over a walked directory sends no event; the sandboxes' own mounts
    elsewhere do not count); ``None`` where it cannot be read."""
    real = os.path.realpath(root).rstrip("/") + "/"
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as table:
            lines = table.read().splitlines()
    except OSError:
        return None
    related = []
    for line in lines:
        fields = line.split(" ", 5)
        if len(fields) < 5:
            return None
        point = unescape_path(fields[4]).rstrip("/") + "/"
        if point.startswith(real) or real.startswith(point):
            related.append(line)
    return related


_WATCHES: dict[int, FsWatch | None] = {}
_ARMING = threading.Lock()


def watch_for(path: str, dev: int, ino: int) -> FsWatch | None:
    """The watch of the file system ``dev`` that holds ``path`` (inode ``ino``), armed on
    first use; ``None`` where it cannot be (not root, no fanotify, handles it cannot read,
    ``UNIAGENT_FS_WATCH=0``)."""
    if os.environ.get("UNIAGENT_FS_WATCH", "1") == "0" or not sys.platform.startswith("linux"):
        return None
    with _ARMING:
        watch = _WATCHES.get(dev)
        if watch is not None and not watch._usable():
            del _WATCHES[dev]  # closed (idle, or a read failed): armed again
        if dev not in _WATCHES:
            _WATCHES[dev] = _arm(path, dev, ino)
        return _WATCHES[dev]


def _reset_after_fork() -> None:
    """In a forked child: its parent's groups are closed here (their queues stay the
    parent's) and a walk arms groups of its own."""
    global _ARMING
    _ARMING = threading.Lock()
    for watch in _WATCHES.values():
        if watch is not None:
            watch._lock = threading.Lock()  # (a thread of the parent may have held it)
            if watch.fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(watch.fd)
    _WATCHES.clear()


os.register_at_fork(after_in_child=_reset_after_fork)


def _arm(path: str, dev: int, ino: int) -> FsWatch | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        init, mark = libc.fanotify_init, libc.fanotify_mark
        to_handle = libc.name_to_handle_at
    except (OSError, AttributeError):
        return None
    init.argtypes = [ctypes.c_uint, ctypes.c_uint]
    mark.argtypes = [ctypes.c_int, ctypes.c_uint, ctypes.c_uint64, ctypes.c_int, ctypes.c_char_p]
    flags = FAN_CLOEXEC | FAN_NONBLOCK | FAN_REPORT_FID | FAN_REPORT_DIR_FID | FAN_REPORT_NAME
    fd = init(flags, os.O_RDONLY | os.O_LARGEFILE)
    if fd < 0:
        log.debug("no file system watch: fanotify_init: %s", os.strerror(ctypes.get_errno()))
        return None
    if mark(fd, FAN_MARK_ADD | FAN_MARK_FILESYSTEM, MASK, AT_FDCWD, os.fsencode(path)) < 0:
        log.debug("no file system watch: fanotify_mark: %s", os.strerror(ctypes.get_errno()))
        os.close(fd)
        return None
    if _handle_inode(to_handle, path) != ino:  # events name inodes this cannot read
        os.close(fd)
        return None
    return FsWatch(fd, dev)


def _handle_inode(to_handle: Any, path: str) -> int | None:
    """The inode in ``path``'s file handle as fanotify encodes it, where it is one."""
    to_handle.argtypes = [
        ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int),
        ctypes.c_int,
    ]  # fmt: skip
    buffer = ctypes.create_string_buffer(8 + 128)
    struct.pack_into("=Ii", buffer, 0, 128, 0)
    mount = ctypes.c_int()
    for flags in (AT_HANDLE_FID, 0):
        if to_handle(AT_FDCWD, os.fsencode(path), buffer, ctypes.byref(mount), flags) == 0:
            break
        if ctypes.get_errno() != errno.EINVAL:
            return None
    else:
        return None
    size, handle_type = _HANDLE.unpack_from(buffer, 0)
    if handle_type != _INO32_GEN or size != 8:
        return None
    return int(struct.unpack_from("=I", buffer, 8)[0])
