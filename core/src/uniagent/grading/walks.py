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

Only what changed since the baseline needs a walk that started after the agent stopped.
The names alone (the baseline's digest, and a fresh sandbox's comparison) can come from an
earlier walk: a name added, removed or renamed changes its directory's ctime, so where no
directory that walk entered has changed since shortly before it started
(:func:`unchanged_since`: an ``lstat`` of each directory, a tenth of the walk's cost on a
site-packages), the names under the root are still the ones it listed
(:func:`current_names`). Episodes run one after another so walk once each, not twice.
Where the names need a walk of their own, it reads the directories and ``lstat``s only the
directories among their entries (to enter them, on the same file system): no file's ctime
is needed for names, and a file's ``lstat`` was most of a walk's cost (``names_only``: a
site-packages of 51,000 names in 0.08 s of CPU instead of 0.19 s).

Where this process can watch the root's file system (:mod:`uniagent.grading.fswatch`:
fanotify, as root), a walk records the inodes it listed, and a later round takes the latest
walk, names and ctimes, while no change the kernel reported since that walk started touched
one of them, the root's path still leads to the same directory and the mount table is the
same (:meth:`RootWalk.watched_unchanged`): a check before grading then walks nothing where
nothing under the root changed, whatever its size.

The walk runs in this process with :func:`os.scandir` and ``lstat``, not a ``find`` from
the ``PATH`` (which the agent could have replaced): on a worker thread, so the event loop
goes on.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import hashlib
import os
import stat
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from uniagent.grading import fswatch

#: Directories right under a root that are not walked (roots of their own where the
#: interpreter's path has them; a conda installation's packages and other envs).
PRUNED = frozenset({b"pkgs", b"envs", b"site-packages", b"dist-packages"})
PYCACHE = b"__pycache__"
#: The most names one walk keeps (about 170 bytes each in memory): a root with more has a
#: digest of its own (:data:`TOO_MANY`) instead of its names'.
MAX_ENTRIES = 1_000_000
TOO_MANY = "too-many-names"
#: How long before a walk started a directory's change still makes the walk's names doubtful:
#: a file system's clock is coarser than the walk's (a tick; a second on some file systems),
#: so a change just after the start can carry a ctime just before it.
CTIME_SLACK_NS = 2_000_000_000
#: Names kept at most in the latest walks of the roots (:func:`current_names`), about 170
#: bytes each: the least recently used roots' walks are let go beyond that.
LATEST_MAX_ENTRIES = 200_000


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
    (``b""``: the root itself), in ctime order. A ``names_only`` walk knows the names, the
    root's own entry and which entries are directories, no file's ctime or kind (0, ``""``):
    its :meth:`names_digest`, never :meth:`since`."""

    root: str
    exists: bool
    entries: list[tuple[int, str, bytes]] = field(default_factory=list)
    #: More than :data:`MAX_ENTRIES` names: the walk stopped there.
    too_many: bool = False
    names_only: bool = False
    #: When the walk started (``time.time_ns()``), the root's device, and the directories it
    #: entered (``b""``: the root; none under a ``__pycache__``, whose names are not counted):
    #: what :func:`unchanged_since` checks.
    started_ns: int = 0
    dev: int = 0
    entered: list[bytes] = field(default_factory=list, repr=False)
    #: The root's own inode, and its walk's standing with the file system's watch (``None``:
    #: not watched): :meth:`watched_unchanged`.
    ino: int = 0
    token: fswatch.WalkToken | None = field(default=None, repr=False, compare=False)
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

    def watched_unchanged(self) -> bool:
        """Whether the tree under the root is still the one this walk saw, from the file
        system's watch (blocking): the root's path leads to the same inode, and no change was
        reported since the walk started to anything it listed (:mod:`~uniagent.grading.fswatch`).
        ``False`` for a walk that was not watched."""
        if self.token is None:
            return False
        try:
            info = os.lstat(self.root)
        except OSError:
            return False
        if (info.st_dev, info.st_ino) != (self.dev, self.ino):
            return False
        return self.token.clean()

    def since(self, since_ns: int, limit: int) -> tuple[list[str], list[str], bool]:
        """What changed after ``since_ns`` (a ctime newer than it): at most ``limit`` changed
        files (not directories, not bytecode; names that are not UTF-8 shown with U+FFFD),
        the bytecode paths to delete (files under a ``__pycache__``), and whether a
        directory changed (its names may differ)."""
        if self.names_only:
            raise ValueError(f"a walk of the names of {self.root} has no ctimes to compare")
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


def walk(
    root: str, limit: int | None = None, *, names_only: bool = False, watch: bool = False
) -> RootWalk:
    """One walk of ``root`` as ``find ROOT -xdev`` sees it (no link followed; a directory on
    another file system listed, not entered; :data:`PRUNED` right under it skipped); the
    entries it cannot read are left out, as ``find 2>/dev/null`` leaves them.

    ``names_only``: the directories' listings alone, an ``lstat`` only of the entries that
    are directories (the listing's file type says which, where the file system gives it);
    the result has no file's ctime (:class:`RootWalk`).

    ``watch``: where the root's file system can be watched (:func:`fswatch.watch_for`), the
    walk is registered with it before it starts and hands it the inodes it listed
    (:meth:`RootWalk.watched_unchanged`)."""
    token = None
    if watch:
        with contextlib.suppress(OSError):
            here = os.lstat(root)
            watcher = fswatch.watch_for(root, here.st_dev, here.st_ino)
            token = watcher.begin(root) if watcher is not None else None
    started = time.time_ns()
    if not os.path.exists(root):  # as the shell's [ -e ]: a link to nothing is missing
        return RootWalk(root, False, started_ns=started, names_only=names_only)
    try:
        top = os.lstat(root)
    except OSError:
        return RootWalk(root, False, started_ns=started, names_only=names_only)
    entries = [(top.st_ctime_ns, _kind(top.st_mode), b"")]
    entered: list[bytes] = []
    inodes = [top.st_ino]
    limit = MAX_ENTRIES if limit is None else limit
    if stat.S_ISDIR(top.st_mode):
        base = os.fsencode(root)
        stack = [b""]
        while stack:
            rel = stack.pop()
            if PYCACHE not in rel.split(b"/"):
                entered.append(rel)
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
                    if names_only and not entry.is_dir(follow_symlinks=False):
                        ctime = mode = dev = 0
                    else:
                        info = entry.stat(follow_symlinks=False)
                        ctime, mode, dev = info.st_ctime_ns, info.st_mode, info.st_dev
                except OSError:
                    continue
                path = rel + b"/" + name if rel else name
                entries.append((ctime, _kind(mode) if mode else "", path))
                if token is not None:
                    inodes.append(entry.inode())
                if len(entries) > limit:
                    return RootWalk(
                        root, True, entries, too_many=True, started_ns=started,
                        names_only=names_only,
                    )  # fmt: skip
                if stat.S_ISDIR(mode) and dev == top.st_dev:
                    stack.append(path)
    if token is not None:
        token.seen(inodes)
    return RootWalk(
        root, True, entries, started_ns=started, dev=top.st_dev, entered=entered,
        names_only=names_only, ino=top.st_ino, token=token,
    )  # fmt: skip


def unchanged_since(found: RootWalk) -> bool:
    """Whether the names under ``found``'s root are still the ones it listed: a directory
    it walked (the root included) whose names changed has a ctime from after the walk's
    start (less :data:`CTIME_SLACK_NS`), so each of them is ``lstat``-ed, nothing else (a
    file's content is no name). Only for a directory root walked whole; one on which
    another file system was mounted since (another device) has changed."""
    if not found.is_dir or found.too_many or not found.entered:
        return False
    limit = found.started_ns - CTIME_SLACK_NS
    base = os.fsencode(found.root)
    for rel in found.entered:
        try:
            info = os.lstat(base + b"/" + rel if rel else base)
        except OSError:
            return False
        if info.st_ctime_ns >= limit or not stat.S_ISDIR(info.st_mode) or info.st_dev != found.dev:
            return False
    return True


def paths_unchanged(paths: Iterable[tuple[str, tuple[int, int] | None]], limit_ns: int) -> bool:
    """Whether each path is still the file it was (its device and inode), with a ctime from
    before ``limit_ns`` (a file's content and a directory's names change it, and it cannot
    be set back without setting the clock), or still missing where it was (``None``);
    blocking. A path that leads elsewhere now is another inode."""
    for path, identity in paths:
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            if identity is None:
                continue
            return False
        except OSError:
            return False
        if (info.st_dev, info.st_ino) != identity or info.st_ctime_ns >= limit_ns:
            return False
    return True


def since_ns(epoch: str) -> int:
    """The baseline's clock (``SECONDS.FRACTION``) in nanoseconds."""
    seconds, _, fraction = epoch.partition(".")
    return int(seconds) * 1_000_000_000 + int((fraction[:9] or "0").ljust(9, "0"))


class SharedWalk:
    """Walks of one root: :meth:`get` returns a walk that started after it was called, shared
    with everybody else who asked before that walk started.

    With ``names``, a round takes the root's latest walk (:data:`_LATEST`) instead where
    :func:`unchanged_since`, checked after every asker asked, says its names still hold:
    one check serves them all, as one walk does. Any round takes it (one with ctimes, for
    ``since``) where the file system's watch says nothing under the root changed since it
    started (:meth:`RootWalk.watched_unchanged`)."""

    def __init__(
        self, root: str, run: Callable[[str], RootWalk] | None = None, *, names: bool = False
    ) -> None:
        self.root = root
        self.names = names
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
                latest = _LATEST.get((self._loop, self.root))
                try:
                    found = await asyncio.to_thread(self._round, latest)
                except Exception as exc:
                    if not asked.done():
                        asked.set_exception(exc)
                else:
                    _keep_latest(self._loop, found, again=found is latest)
                    if not asked.done():
                        asked.set_result(found)
                finally:
                    if asked.done() and not asked.cancelled():
                        asked.exception()  # retrieved, whether anybody still waits or not
        finally:
            self._walking = None
            if self._next is not None and not self._loop.is_closed():  # asked as it stopped
                self._walking = asyncio.ensure_future(self._walk_while_asked())
            elif _SHARED.get(key := (self._loop, self.root, self.names)) is self:
                del _SHARED[key]  # idle: a root of one sandbox is not kept for the whole run

    def _round(self, latest: RootWalk | None) -> RootWalk:
        """One round, on a worker thread: ``latest`` where the file system's watch says
        nothing under the root changed since it started (a walk with ctimes where they are
        asked for), or, for the names alone, where its names still hold; else a walk (of the
        names alone where only they are asked for)."""
        if self._run is not None:
            if self.names and latest is not None and unchanged_since(latest):
                return latest
            return self._run(self.root)
        if latest is not None and (self.names or not latest.names_only):
            if latest.watched_unchanged():
                return latest
            if self.names and unchanged_since(latest):
                return latest
        return walk(self.root, names_only=self.names, watch=True)


#: The walkers by event loop, root and whether they answer with names alone.
_SHARED: dict[tuple[asyncio.AbstractEventLoop, str, bool], SharedWalk] = {}
#: The latest walk of each root, by event loop (least recently used first).
_LATEST: OrderedDict[tuple[asyncio.AbstractEventLoop, str], RootWalk] = OrderedDict()
#: How many rounds took the latest walk instead of walking (for tests and the bench).
reused = 0


def _keep_latest(loop: asyncio.AbstractEventLoop, found: RootWalk, *, again: bool) -> None:
    """Keep ``found`` as the root's latest walk (``again``: it was already)."""
    global reused
    reused += again
    for key in [k for k in _LATEST if k[0].is_closed()]:  # loops that ended (tests)
        del _LATEST[key]
    _LATEST[(loop, found.root)] = found
    _LATEST.move_to_end((loop, found.root))
    kept = sum(len(w.entries) for w in _LATEST.values())
    while kept > LATEST_MAX_ENTRIES and len(_LATEST) > 1:
        _, dropped = _LATEST.popitem(last=False)
        kept -= len(dropped.entries)


async def current_names(root: str) -> RootWalk:
    """A walk whose names are those under ``root`` now (for :meth:`RootWalk.names_digest`,
    not :meth:`RootWalk.since`): the latest walk of ``root`` in this event loop where
    the file system's watch or :func:`unchanged_since` says its names still hold, else a new
    walk; either from a round that started after this call, shared by everybody who asked
    before it started."""
    return await _walker(root, names=True).get()


async def shared_walk(root: str) -> RootWalk:
    """A walk of ``root`` whose ctimes are those under it now: one that started after this
    call, shared by every episode of this event loop that asked for the same root before it
    started, or the latest walk with ctimes where the file system's watch says nothing under
    the root changed since that walk started (:meth:`RootWalk.watched_unchanged`)."""
    return await _walker(root, names=False).get()


def _walker(root: str, *, names: bool) -> SharedWalk:
    loop = asyncio.get_running_loop()
    walker = _SHARED.get((loop, root, names))
    if walker is None:
        for key in [k for k in _SHARED if k[0].is_closed()]:  # loops that ended (tests)
            del _SHARED[key]
        walker = _SHARED[(loop, root, names)] = SharedWalk(root, names=names)
    return walker
