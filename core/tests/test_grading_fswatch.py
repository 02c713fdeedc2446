"""The file system's watch (fanotify) lets a check before grading take the latest walk of a
root only while nothing under it changed: every way of changing a file, a name or what a
path leads to makes the next check walk again and see the change."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from uniagent.grading import fswatch, walks
from uniagent.testing.grading import wait_ctime_after


def watchable(path: Path) -> None:
    """Skip where the kernel cannot be asked (not root, not Linux, a file system whose
    handles the watch does not read); where it can (root on ext2/3/4), the watch must arm."""
    if not sys.platform.startswith("linux") or os.geteuid() != 0:
        pytest.skip("fanotify's file system marks need root on Linux")
    kind = subprocess.run(
        ["stat", "-f", "-c", "%T", str(path)], capture_output=True, text=True, check=True
    ).stdout.strip()
    if not kind.startswith("ext"):
        pytest.skip(f"{path} is on {kind}, whose file handles the watch does not read")
    info = os.lstat(path)
    assert fswatch.watch_for(str(path), info.st_dev, info.st_ino) is not None


def make_root(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    tmp_path.mkdir(exist_ok=True)
    (root / "pkg" / "sub").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "sub" / "mod.py").write_text("x = 1\n")
    (root / "pkg" / "__pycache__").mkdir()
    (root / "pkg" / "__pycache__" / "mod.cpython-311.pyc").write_bytes(b"\0" * 16)
    watchable(root)
    return root


def mapped_write(path: Path) -> None:
    """Write through a shared mapping in a process that then exits (no write(2) at all)."""
    subprocess.run(
        [sys.executable, "-c",
         "import mmap, os, sys\nfd = os.open(sys.argv[1], os.O_RDWR)\n"
         "m = mmap.mmap(fd, 1)\nos.close(fd)\nm[0] = ord('y')\n", str(path)],
        check=True,
    )  # fmt: skip


def linked_write(path: Path, outside: Path) -> None:
    """Write through a hard link made now outside the root (events name that directory)."""
    os.link(path, outside / "link")
    in_place(outside / "link")


def in_place(path: Path) -> None:
    with open(path, "r+") as out:
        out.write("y")


def rename_in(path: Path, outside: Path) -> None:
    (outside / "new.py").write_text("import os\n")
    os.rename(outside / "new.py", path.parent / "new.py")


def renamed_directory(path: Path, outside: Path) -> None:
    """The directory moved away and another one, with the same names, put in its place."""
    sub = path.parent
    os.rename(sub, outside / "old-sub")
    sub.mkdir()
    (sub / path.name).write_text("x = 2\n")


#: Each change, given the root's ``pkg/sub/mod.py`` and a directory outside the root.
CHANGES: dict[str, Callable[[Path, Path], object]] = {
    "write": lambda path, outside: in_place(path),
    "mapped-write-by-a-process-that-exited": lambda path, outside: mapped_write(path),
    "write-through-a-hard-link-made-outside": linked_write,
    # (made before the walk: only the event's own inode, not its directory, is the root's)
    "write-through-a-hard-link-outside-from-before": lambda path, outside: in_place(
        outside / "linked"
    ),
    "truncate-by-path": lambda path, outside: os.truncate(path, 0),
    "chmod": lambda path, outside: os.chmod(path, 0o600),
    "utime": lambda path, outside: os.utime(path, (0, 0)),
    "new-file": lambda path, outside: (path.parent / "added.py").write_text(""),
    "rename-in": rename_in,
    "rename-out": lambda path, outside: os.rename(path, outside / "gone.py"),
    "unlink": lambda path, outside: path.unlink(),
    "bytecode": lambda path, outside: in_place(
        path.parent.parent / "__pycache__" / "mod.cpython-311.pyc"
    ),
    "directory-replaced": renamed_directory,
}


@pytest.mark.parametrize("change", sorted(CHANGES))
async def test_every_change_makes_the_next_check_walk_again(tmp_path, change):
    root = make_root(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    os.link(root / "pkg" / "sub" / "mod.py", outside / "linked")
    first = await walks.shared_walk(str(root))
    assert first.token is not None
    since = first.started_ns
    assert await walks.shared_walk(str(root)) is first, "nothing changed: no walk"
    assert await walks.current_names(str(root)) is first
    wait_ctime_after(since, tmp_path)  # (a change's ctime is the file system's coarser clock)
    CHANGES[change](root / "pkg" / "sub" / "mod.py", outside)
    again = await walks.shared_walk(str(root))
    assert again is not first
    changed, purge, dir_changed = again.since(since, 50)
    assert changed or purge or dir_changed, "the new walk sees the change"
    assert await walks.shared_walk(str(root)) is again, "and is the latest while it holds"


async def test_a_root_whose_path_leads_elsewhere_is_walked_again(tmp_path):
    """A directory above the root moved away (no event names an inode the walk listed) and a
    copy put at its path: the root's path leads to another inode."""
    root = make_root(tmp_path / "above")
    first = await walks.shared_walk(str(root))
    os.rename(tmp_path / "above", tmp_path / "moved")
    subprocess.run(["cp", "-a", str(tmp_path / "moved"), str(tmp_path / "above")], check=True)
    in_place(root / "pkg" / "sub" / "mod.py")
    assert not first.watched_unchanged()
    again = await walks.shared_walk(str(root))
    assert again is not first and again.ino != first.ino


async def test_a_mount_over_a_walked_directory_is_walked_again(tmp_path):
    """A mount sends no event: the mount table is compared, its mounts at, above or below
    the root (a sandbox's own tmpfs elsewhere is no change of the root). The root's path
    has a space, which the mount table writes as ``\\040``."""
    root = make_root(tmp_path / "a space")
    first = await walks.shared_walk(str(root))
    elsewhere = tmp_path / "elsewhere with space"
    elsewhere.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(elsewhere)], check=True)
    try:
        assert first.watched_unchanged()
    finally:
        subprocess.run(["umount", str(elsewhere)], check=True)
    sub = root / "pkg" / "sub"
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(sub)], check=True)
    try:
        (sub / "mod.py").write_text("x = 3\n")  # (on the tmpfs: no event on the root's fs)
        assert not first.watched_unchanged()
        again = await walks.shared_walk(str(root))
        assert again is not first
        assert again.names_digest() != first.names_digest()
    finally:
        subprocess.run(["umount", str(sub)], check=True)


async def test_a_change_while_a_walk_is_under_way_makes_it_doubtful(tmp_path, monkeypatch):
    """A change that came while the walk walked (it may have passed the file) is judged
    when the walk ends."""
    root = make_root(tmp_path)
    real_scandir = os.scandir
    changed = []

    def scandir(path):  # the change lands while the walk lists the root
        if not changed:
            changed.append(path)
            in_place(root / "pkg" / "sub" / "mod.py")
        return real_scandir(path)

    monkeypatch.setattr(walks.os, "scandir", scandir)
    found = walks.walk(str(root), watch=True)
    assert changed and found.token is not None
    assert not found.watched_unchanged()


async def test_without_the_watch_every_check_walks(tmp_path, monkeypatch):
    root = make_root(tmp_path)
    monkeypatch.setenv("UNIAGENT_FS_WATCH", "0")
    first = await walks.shared_walk(str(root))
    assert first.token is None
    assert await walks.shared_walk(str(root)) is not first


def test_a_forked_child_does_not_read_its_parents_queue(tmp_path):
    """The queue is the group's: a child reading it would take events from the parent."""
    root = make_root(tmp_path)
    info = os.lstat(root)
    parent = fswatch.watch_for(str(root), info.st_dev, info.st_ino)
    assert parent is not None
    walked = walks.walk(str(root), watch=True)
    assert walked.watched_unchanged()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        try:
            child = fswatch.watch_for(str(root), info.st_dev, info.st_ino)
            ok = child is not None and child is not parent and child.fd != parent.fd
            ok = ok and not walked.watched_unchanged()  # (the parent's walk: not judged here)
            os.write(write, b"1" if ok else b"0")
        finally:
            os._exit(0)
    os.close(write)
    assert os.read(read, 1) == b"1"
    os.waitpid(pid, 0)
    assert parent._usable() and walked.watched_unchanged()


def _event(mask: int, records: list[tuple[int, int, bytes]]) -> bytes:
    """A queued event as the kernel writes it: metadata, then info records (type, handle
    type, handle)."""
    body = b""
    for kind, handle_type, handle in records:
        record = struct.pack("=ii", 0, 0) + struct.pack("=Ii", len(handle), handle_type) + handle
        body += struct.pack("=BBH", kind, 0, 4 + len(record)) + record
    return struct.pack("=IBBHQii", 24 + len(body), 3, 0, 24, mask, -1, 1) + body


@pytest.mark.parametrize(
    "event",
    [
        _event(fswatch.FAN_Q_OVERFLOW, []),
        _event(fswatch.FAN_MODIFY, [(1, 0x81, struct.pack("=QI", 7, 0))]),  # 64-bit handle
        _event(fswatch.FAN_MODIFY, []),
    ],
    ids=["overflow", "a-handle-it-cannot-read", "no-handle"],
)
def test_what_the_watch_cannot_judge_makes_every_walk_doubtful(event):
    watch = fswatch.FsWatch(-1, 0)
    done = fswatch.WalkToken(watch, "/")
    done.inodes = {5}
    walking = fswatch.WalkToken(watch, "/")
    watch._tokens.update({done, walking})
    watch._read(event)
    assert done.dirty
    assert walking.pending is None  # judged doubtful when it ends


def test_an_event_on_another_inode_leaves_a_walk_clean():
    watch = fswatch.FsWatch(-1, 0)
    token = fswatch.WalkToken(watch, "/")
    token.inodes = {5, 6}
    watch._tokens.add(token)
    ino32 = fswatch._INO32_GEN
    watch._read(_event(fswatch.FAN_MODIFY, [(2, ino32, struct.pack("=II", 9, 0)),
                                            (1, ino32, struct.pack("=II", 10, 0))]))  # fmt: skip
    assert not token.dirty
    watch._read(_event(fswatch.FAN_CREATE, [(2, ino32, struct.pack("=II", 6, 0))]))
    assert token.dirty


def test_the_watch_is_shared_by_the_roots_of_one_file_system(tmp_path):
    root = make_root(tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    a, b = os.lstat(root), os.lstat(other)
    assert fswatch.watch_for(str(root), a.st_dev, a.st_ino) is fswatch.watch_for(
        str(other), b.st_dev, b.st_ino
    )


async def test_an_idle_group_is_closed_and_the_next_walk_arms_another(tmp_path):
    """While armed, a group costs every write on its file system: one unused for
    :data:`fswatch.IDLE_SECONDS` is closed, its walks are doubtful, and a walk arms anew."""
    root = make_root(tmp_path)
    first = await walks.shared_walk(str(root))
    assert first.token is not None
    info = os.lstat(root)
    watch = fswatch.watch_for(str(root), info.st_dev, info.st_ino)
    assert watch is not None
    assert not watch.close_if_idle(time.monotonic())  # just used
    assert watch.close_if_idle(time.monotonic() + fswatch.IDLE_SECONDS)
    assert watch.fd < 0 and not first.watched_unchanged()
    again = await walks.shared_walk(str(root))
    assert again is not first and again.token is not None
    assert fswatch.watch_for(str(root), info.st_dev, info.st_ino) not in (None, watch)
    assert await walks.shared_walk(str(root)) is again
