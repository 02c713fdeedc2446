"""Walks of the test environment's roots on the host, shared by the episodes that ask at once.

Without isolation, an episode's sandbox sees the host's files at their own paths, so the
test-environment check (:mod:`uniagent.grading.testenv`) of every such episode walks the
same directories: the interpreter's standard library and site-packages, tens of
thousands of names, at the baseline and again before grading. Nothing there is
read-only (any agent could have written anywhere), so the walk cannot be skipped, but
one walk can serve every episode that asked for it before it started: its result is what
each of them would have seen by walking at that moment. A request never joins a walk
already under way (it may have passed a directory before the request's agent stopped);
it waits for the next one, which starts when the current one ends and serves everybody
who asked meanwhile.

One walk records every entry's ctime, so each episode takes from it what changed since
its own baseline (:meth:`RootWalk.since`), and the digest of the names under the root
(:meth:`RootWalk.names_digest`) is the one the shell check prints
(``find ROOT -xdev ... -printf '%P\\0' | LC_ALL=C sort -z | sha256sum``).

The walk runs in this process with :func:`os.scandir` and ``lstat``, not a ``find`` from
the ``PATH`` (which the agent could have replaced): on a worker thread, so the event loop
goes on.
"""

from __future__ import annotations

import asyncio
import bisect
import hashlib
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field

#: Directories right under a root that are not walked (roots of their own where the
#: interpreter's path has them; a conda installation's packages and other envs).
PRUNED = frozenset({b"pkgs", b"envs", b"site-packages", b"dist-packages"})
PYCACHE = b"__pycache__"
#: The most names one walk keeps (about 170 bytes each in memory): a root with more has a
#: digest of its own (:data:`TOO_MANY`) instead of its names'.
MAX_ENTRIES = 1_000_000
TOO_MANY = "too-many-names"


#: ``find -printf %y``'s letter for each file type.
_KINDS = {
    stat.S_IFDIR: "d", stat.S_IFREG: "f", stat.S_IFLNK: "l", stat.S_IFIFO: "p",
    stat.S_IFSOCK: "s", stat.S_IFCHR: "c", stat.S_IFBLK: "b",
}  # fmt: skip


def _kind(mode: int) -> str:
    return _KINDS.get(stat.S_IFMT(mode), "U")


@dataclass
class RootWalk:
    """What one walk of ``root`` found: each entry's ctime (ns), kind and path below the root
    (``b""``: the root itself), in ctime order."""

    root: str
    exists: bool
    entries: list[tuple[int, str, bytes]] = field(default_factory=list)
    #: More than :data:`MAX_ENTRIES` names: the walk stopped there.
    too_many: bool = False
    _ctimes: list[int] = field(default_factory=list, repr=False)
    _digest: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        #: Whether the root is a directory (its own entry, the first one walked, is).
        self.is_dir = bool(self.entries) and self.entries[0][1:] == ("d", b"")
        self.entries.sort(key=lambda entry: entry[0])
        self._ctimes = [entry[0] for entry in self.entries]

    def names_digest(self) -> str:
        """sha256 of the names under the root (``__pycache__`` and what it holds aside), each
        ended by a NUL, in byte order: what the shell check's ``find | sort -z | sha256sum``
        prints for the same tree; :data:`TOO_MANY` for a root with more names than a walk
        keeps."""
        if self.too_many:
            return TOO_MANY
        if self._digest is None:
            if os.path.basename(self.root) == "__pycache__":
                names: list[bytes] = []  # find's -name prunes the start point itself
            else:
                names = [rel for _, _, rel in self.entries if PYCACHE not in rel.split(b"/")]
            names.sort()
            digest = hashlib.sha256()
            for name in names:
                digest.update(name + b"\0")
            self._digest = digest.hexdigest()
        return self._digest

    def since(self, since_ns: int, limit: int) -> tuple[list[str], list[str], bool]:
        """What changed after ``since_ns`` (a ctime newer than it): at most ``limit`` changed
        files (not directories, not bytecode; names that are not UTF-8 shown with U+FFFD),
        the bytecode paths to delete (files under a ``__pycache__``), and whether a
        directory changed (its names may differ)."""
        changed: list[str] = []
        purge: list[str] = []
        dir_changed = False
        root = os.fsencode(self.root)
        for _, kind, rel in self.entries[bisect.bisect_right(self._ctimes, since_ns) :]:
            path = root + b"/" + rel if rel else root
            if PYCACHE in path.split(b"/"):
                if not (kind == "d" and path.endswith(b"/" + PYCACHE)):
                    purge.append(os.fsdecode(path))
            elif kind == "d":
                dir_changed = True
            elif len(changed) < limit:  # reported (as the shell check's output is read)
                changed.append(path.decode("utf-8", "replace"))
        return changed, purge, dir_changed


def walk(root: str, limit: int | None = None) -> RootWalk:
    """One walk of ``root`` as ``find ROOT -xdev`` sees it (no link followed; a directory on
    another file system listed, not entered; :data:`PRUNED` right under it skipped); the
    entries it cannot read are left out, as ``find 2>/dev/null`` leaves them."""
    if not os.path.exists(root):  # as the shell's [ -e ]: a link to nothing is missing
        return RootWalk(root, False)
    try:
        top = os.lstat(root)
    except OSError:
        return RootWalk(root, False)
    entries = [(top.st_ctime_ns, _kind(top.st_mode), b"")]
    limit = MAX_ENTRIES if limit is None else limit
    if stat.S_ISDIR(top.st_mode):
        base = os.fsencode(root)
        stack = [b""]
        while stack:
            rel = stack.pop()
            try:
                with os.scandir(base + b"/" + rel if rel else base) as listing:
                    found = list(listing)
            except OSError:
                continue
            for entry in found:
                name = entry.name
                if not rel and name in PRUNED:
                    continue
                try:
                    info = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                path = rel + b"/" + name if rel else name
                entries.append((info.st_ctime_ns, _kind(info.st_mode), path))
                if len(entries) > limit:
                    return RootWalk(root, True, entries, too_many=True)
                if stat.S_ISDIR(info.st_mode) and info.st_dev == top.st_dev:
                    stack.append(path)
    return RootWalk(root, True, entries)


def since_ns(epoch: str) -> int:
    """The baseline's clock (``SECONDS.FRACTION``) in nanoseconds."""
    seconds, _, fraction = epoch.partition(".")
    return int(seconds) * 1_000_000_000 + int((fraction[:9] or "0").ljust(9, "0"))


class SharedWalk:
    """Walks of one root: :meth:`get` returns a walk that started after it was called, shared
    with everybody else who asked before that walk started."""

    def __init__(self, root: str, run: Callable[[str], RootWalk] | None = None) -> None:
        self.root = root
        self._run = run
        self._loop = asyncio.get_running_loop()
        self._next: asyncio.Future[RootWalk] | None = None
        self._walking: asyncio.Task[None] | None = None
        #: How many walks ran (for tests and the bench).
        self.walks = 0

    async def get(self) -> RootWalk:
        """The next walk's result (a walk under way now does not count)."""
        if self._next is None:
            self._next = self._loop.create_future()
        waiting = self._next
        if self._walking is None:
            self._walking = asyncio.ensure_future(self._walk_while_asked())
        # Shielded: a caller that gives up (its grading timed out) leaves the walk to the others.
        return await asyncio.shield(waiting)

    async def _walk_while_asked(self) -> None:
        try:
            while self._next is not None:
                asked, self._next = self._next, None  # who asks from now on waits for the next
                self.walks += 1
                try:
                    found = await asyncio.to_thread(self._run or walk, self.root)
                except Exception as exc:
                    if not asked.done():
                        asked.set_exception(exc)
                else:
                    if not asked.done():
                        asked.set_result(found)
                finally:
                    if asked.done() and not asked.cancelled():
                        asked.exception()  # retrieved, whether anybody still waits or not
        finally:
            self._walking = None
            if self._next is not None and not self._loop.is_closed():  # asked as it stopped
                self._walking = asyncio.ensure_future(self._walk_while_asked())
            elif _SHARED.get((self._loop, self.root)) is self:  # idle: a root of one sandbox
                del _SHARED[(self._loop, self.root)]  # is not kept for the whole run


_SHARED: dict[tuple[asyncio.AbstractEventLoop, str], SharedWalk] = {}


async def shared_walk(root: str) -> RootWalk:
    """A walk of ``root`` that started after this call, shared by every episode of this event
    loop that asked for the same root before it started."""
    loop = asyncio.get_running_loop()
    walker = _SHARED.get((loop, root))
    if walker is None:
        for key in [k for k in _SHARED if k[0].is_closed()]:  # loops that ended (tests)
            del _SHARED[key]
        walker = _SHARED[(loop, root)] = SharedWalk(root)
    return await walker.get()
