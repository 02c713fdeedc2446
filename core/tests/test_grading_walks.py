"""Shared walks of the test environment's roots (no isolation): each walk answers as the shell
check's ``find`` would on the same tree, and one walk serves every episode that asked before
it started, never one that asked after."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import threading
from pathlib import Path

import pytest

from uniagent.grading import walks
from uniagent.testing.grading import wait_ctime_after

FIND_NAMES = (
    'find "$1" -xdev \\( -path "$1/pkgs" -o -path "$1/envs" -o -path "$1/site-packages" '
    '-o -path "$1/dist-packages" \\) -prune -o -name __pycache__ -prune -o -printf "%P\\0" '
    "2>/dev/null | LC_ALL=C sort -z | sha256sum"
)
FIND_SINCE = (
    'find "$1" -xdev \\( -path "$1/pkgs" -o -path "$1/envs" -o -path "$1/site-packages" '
    '-o -path "$1/dist-packages" \\) -prune -o -newerct "@$2" -printf "%y %p\\n" 2>/dev/null'
)


def shell(script: str, *args: str) -> str:
    done = subprocess.run(
        ["bash", "-c", script, "-", *args],
        capture_output=True, text=True, errors="surrogateescape", check=True,
    )  # fmt: skip
    return done.stdout


def tree(root: Path) -> Path:
    """Names of every kind the walk must list as find does: nested packages, bytecode,
    links (to a directory: not entered), odd names, pruned directories right under the root
    (and the same names deeper, which are not pruned)."""
    (root / "pkg" / "sub").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "sub" / "mod.py").write_text("x = 1\n")
    (root / "pkg" / "__pycache__").mkdir()
    (root / "pkg" / "__pycache__" / "mod.cpython-311.pyc").write_bytes(b"\0")
    (root / "site-packages" / "hidden").mkdir(parents=True)
    (root / "pkg" / "site-packages").mkdir()  # not right under the root: walked
    (root / "envs" / "other").mkdir(parents=True)
    (root / "link").symlink_to(root / "pkg")
    (root / "dangling").symlink_to(root / "nowhere")
    (root / "odd name\twith tab.py").write_text("")
    (root / "é.py").write_text("")
    with open(os.fsencode(root) + b"/latin-\xe9.py", "w"):  # a name that is not UTF-8
        pass
    os.mkfifo(root / "fifo")
    return root


def test_the_names_digest_is_the_shell_checks(tmp_path):
    root = tree(tmp_path / "root")
    found = walks.walk(str(root))
    assert found.exists and found.is_dir
    assert found.names_digest() == shell(FIND_NAMES, str(root)).split()[0]
    (root / "pkg" / "sub" / "new.py").write_text("")
    assert walks.walk(str(root)).names_digest() != found.names_digest()
    assert walks.walk(str(root)).names_digest() == shell(FIND_NAMES, str(root)).split()[0]


def test_a_walk_of_the_names_alone_lists_what_a_full_walk_and_find_list(tmp_path):
    """The names (a baseline's digest, a fresh sandbox's comparison) need no file's ctime: a
    walk of them reads the listings and ``lstat``s only directories, and answers nothing
    about what changed."""
    root = tree(tmp_path / "root")
    full, names = walks.walk(str(root)), walks.walk(str(root), names_only=True)
    assert names.names_only and not full.names_only
    assert names.names_digest() == full.names_digest() == shell(FIND_NAMES, str(root)).split()[0]
    assert sorted(e[2] for e in names.entries) == sorted(e[2] for e in full.entries)
    assert names.entered == full.entered and names.is_dir and names.dev == full.dev
    kinds = {path: kind for _, kind, path in names.entries}
    assert kinds[b"pkg"] == kinds[b"pkg/sub"] == "d" and kinds[b"link"] == kinds[b"fifo"] == ""
    with pytest.raises(ValueError, match="no ctimes"):
        names.since(0, 50)
    assert walks.walk(str(root), limit=3, names_only=True).too_many
    file = tmp_path / "pyvenv.cfg"
    file.write_text("")
    assert (
        walks.walk(str(file), names_only=True).names_digest()
        == walks.walk(str(file)).names_digest()
    )
    assert not walks.walk(str(tmp_path / "absent"), names_only=True).exists


async def test_current_names_walks_the_names_alone_and_shared_walk_every_ctime(tmp_path):
    root = tree(tmp_path / "root")
    assert (await walks.current_names(str(root))).names_only
    assert not (await walks.shared_walk(str(root))).names_only


def test_a_file_root_and_a_missing_one(tmp_path):
    file = tmp_path / "pyvenv.cfg"
    file.write_text("home = /usr\n")
    found = walks.walk(str(file))
    assert found.exists and not found.is_dir
    assert found.names_digest() == shell(FIND_NAMES, str(file)).split()[0]
    assert not walks.walk(str(tmp_path / "absent")).exists
    (tmp_path / "gone").symlink_to(tmp_path / "absent")
    assert not walks.walk(str(tmp_path / "gone")).exists  # as [ -e ]: a link to nothing


def test_what_changed_since_is_what_find_newerct_lists(tmp_path):
    root = tree(tmp_path / "root")
    epoch = shell("date +%s.%N").strip()
    # The file system's clock is coarser than date's: touch a file outside the root until
    # its ctime is past the epoch, then every change below is too.
    probe = tmp_path / "probe"
    while True:
        probe.write_text("")
        if probe.stat().st_ctime_ns > walks.since_ns(epoch):
            break
    (root / "pkg" / "sub" / "mod.py").write_text("x = 2\n")  # changed
    (root / "pkg" / "sub" / "added.py").write_text("")  # added: its directory changes too
    (root / "pkg" / "__pycache__" / "planted.cpython-311.pyc").write_bytes(b"\0")
    (root / "site-packages" / "hidden" / "not-walked.py").write_text("")
    odd = os.fsencode(root / "pkg") + b"/bad-\xff.py"  # not UTF-8: reported with U+FFFD
    with open(odd, "w"):
        pass
    found = walks.walk(str(root))
    changed, purge, dir_changed = found.since(walks.since_ns(epoch), 50)
    listed = shell(FIND_SINCE, str(root), epoch).splitlines()
    files = {line[2:] for line in listed if line[0] != "d" and "/__pycache__/" not in line}
    bytecode = {line[2:] for line in listed if "/__pycache__/" in line}
    odd_shown = str(root / "pkg") + "/bad-\ufffd.py"
    assert {f.encode("utf-8", "surrogateescape").decode("utf-8", "replace") for f in files} == (
        set(changed)
    )
    assert set(changed) == {
        str(root / "pkg/sub/mod.py"), str(root / "pkg/sub/added.py"), odd_shown
    }  # fmt: skip
    json.dumps(changed, ensure_ascii=False).encode()  # fit for a UTF-8 results file
    assert set(purge) == bytecode == {str(root / "pkg/__pycache__/planted.cpython-311.pyc")}
    assert dir_changed
    capped = found.since(walks.since_ns(epoch), 1)[0]
    assert len(capped) == 1 and capped[0] in changed
    later = walks.since_ns(shell("date +%s.%N").strip()) + 1
    assert found.since(later, 50) == ([], [], False)


async def test_one_walk_serves_everybody_who_asked_before_it_started(tmp_path):
    """Synchronised on events: the first walk is held while more episodes ask; they get the
    next walk (one, not one each), which started after all of them asked."""
    started: list[threading.Event] = [threading.Event(), threading.Event()]
    release: list[threading.Event] = [threading.Event(), threading.Event()]
    runs: list[int] = []

    def run(root: str) -> walks.RootWalk:
        n = len(runs)
        runs.append(n)
        if n < 2:
            started[n].set()
            release[n].wait(timeout=60)
        return walks.RootWalk(root, True, [(n, "d", b"")])

    walker = walks.SharedWalk(str(tmp_path), run)
    first = asyncio.ensure_future(walker.get())
    await asyncio.to_thread(started[0].wait, 60)  # the first walk is under way
    later = [asyncio.ensure_future(walker.get()) for _ in range(5)]
    await asyncio.sleep(0)  # every later request is made (they wait, none has a result)
    assert not any(task.done() for task in later)
    release[0].set()
    assert (await first).entries[0][0] == 0
    await asyncio.to_thread(started[1].wait, 60)  # the second walk, for the five, started
    last = asyncio.ensure_future(walker.get())  # asked during the second walk: a third one
    release[1].set()
    results = await asyncio.gather(*later)
    assert {r.entries[0][0] for r in results} == {1}, "the five share the walk after theirs"
    assert (await last).entries[0][0] == 2
    assert walker.walks == 3


async def test_a_failed_walk_fails_its_askers_and_the_next_one_walks_again(tmp_path):
    calls = []

    def run(root: str) -> walks.RootWalk:
        calls.append(root)
        if len(calls) == 1:
            raise OSError("no such device")
        return walks.walk(root)

    walker = walks.SharedWalk(str(tmp_path), run)
    with pytest.raises(OSError, match="no such device"):
        await walker.get()
    assert (await walker.get()).exists


async def test_a_caller_that_gives_up_leaves_the_walk_to_the_others(tmp_path):
    gate = threading.Event()
    began = threading.Event()

    def run(root: str) -> walks.RootWalk:
        began.set()
        gate.wait(timeout=60)
        return walks.walk(root)

    walker = walks.SharedWalk(str(tmp_path), run)
    leaving = asyncio.ensure_future(walker.get())
    staying = asyncio.ensure_future(walker.get())
    await asyncio.to_thread(began.wait, 60)
    leaving.cancel()
    gate.set()
    assert (await staying).exists
    with pytest.raises(asyncio.CancelledError):
        await leaving


def test_a_root_with_more_names_than_a_walk_keeps_has_a_digest_of_its_own(tmp_path):
    root = tree(tmp_path / "root")
    found = walks.walk(str(root), limit=3)
    assert found.too_many and found.names_digest() == walks.TOO_MANY
    assert not walks.walk(str(root)).too_many


async def test_a_root_nobody_waits_for_is_not_kept(tmp_path):
    """A root of one sandbox (its own venv, say) is not held for the rest of the run."""
    found = await walks.shared_walk(str(tmp_path))
    assert found.exists and found.is_dir
    assert all(key[1] != str(tmp_path) for key in walks._SHARED)


async def test_the_names_of_a_root_whose_directories_did_not_change_come_from_its_last_walk(
    tmp_path, monkeypatch
):
    """No slack here: a directory's ctime is before a walk that started after it changed."""
    monkeypatch.setattr(walks, "CTIME_SLACK_NS", 0)
    root = tree(tmp_path / "root")
    first = await walks.shared_walk(str(root))
    reused = walks.reused
    (root / "pkg" / "sub" / "mod.py").write_text("x = 2\n")  # content is no name
    (root / "pkg" / "__pycache__" / "new.cpython-311.pyc").write_bytes(b"\0")  # nor bytecode
    (root / "site-packages" / "hidden" / "pruned.py").write_text("")  # nor what is not walked
    asked = [walks.current_names(str(root)) for _ in range(5)]  # all before the round starts
    assert all(found is first for found in await asyncio.gather(*asked))
    assert walks.reused == reused + 1, "one check of the directories served the five"
    wait_ctime_after(first.started_ns, tmp_path)
    (root / "pkg" / "sub" / "added.py").write_text("")
    again = await walks.current_names(str(root))
    assert again is not first and walks.reused == reused + 1
    assert again.names_digest() == shell(FIND_NAMES, str(root)).split()[0]
    assert again.names_digest() != first.names_digest()
    assert await walks.current_names(str(root)) is again  # the new walk is the latest
    wait_ctime_after(again.started_ns, tmp_path)
    (root / "pkg" / "sub" / "added.py").rename(root / "pkg" / "sub" / "renamed.py")
    renamed = await walks.current_names(str(root))
    assert renamed is not again
    assert renamed.names_digest() == shell(FIND_NAMES, str(root)).split()[0]


def test_a_directory_changed_shortly_before_a_walk_started_makes_its_names_doubtful(tmp_path):
    """A change up to :data:`walks.CTIME_SLACK_NS` before the start may have come after it
    (the file system's clock is coarser); a directory gone, or replaced, makes them wrong."""
    root = tree(tmp_path / "root")
    found = walks.walk(str(root))
    newest = max(os.lstat(os.fsencode(root) + (b"/" + rel if rel else b"")).st_ctime_ns
                 for rel in found.entered)  # fmt: skip
    assert b"pkg/__pycache__" not in found.entered and b"site-packages" not in found.entered
    found.started_ns = newest + walks.CTIME_SLACK_NS
    assert not walks.unchanged_since(found)
    found.started_ns = newest + walks.CTIME_SLACK_NS + 1
    assert walks.unchanged_since(found)
    (root / "pkg" / "sub" / "mod.py").unlink()
    (root / "pkg" / "sub").rmdir()
    found.started_ns = 2**62  # whatever the clocks say: a directory walked is gone
    assert not walks.unchanged_since(found)
    file = tmp_path / "pyvenv.cfg"
    file.write_text("")
    assert not walks.unchanged_since(walks.walk(str(file)))  # only a directory's names
    assert not walks.unchanged_since(walks.walk(str(tmp_path / "absent")))


async def test_the_latest_walks_kept_are_bounded(tmp_path, monkeypatch):
    monkeypatch.setattr(walks, "CTIME_SLACK_NS", 0)
    roots = [tree(tmp_path / f"root{n}") for n in range(2)]
    first = await walks.shared_walk(str(roots[0]))
    monkeypatch.setattr(walks, "LATEST_MAX_ENTRIES", len(first.entries) + 1)
    assert await walks.current_names(str(roots[0])) is first
    await walks.shared_walk(str(roots[1]))  # twice the names: the least recent walk goes
    assert await walks.current_names(str(roots[0])) is not first
    loop = asyncio.get_running_loop()
    kept = [w for (lp, _), w in walks._LATEST.items() if lp is loop]
    assert [w.root for w in kept] == [str(roots[0])]  # (its walk again, the other let go)
