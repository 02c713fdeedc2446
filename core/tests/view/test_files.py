"""The viewer's file access: what stays inside a run folder, what is read, and how."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from uniagent.view import files
from uniagent.view.files import OutsideFolder, ResultsTail, Unreadable, contained, inside


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A run folder (resolved, as RunFolder keeps it) with a secret beside it."""
    run = tmp_path / "run"
    (run / "episodes" / "t" / "0").mkdir(parents=True)
    (run / "episodes" / "t" / "0" / "log.txt").write_text("log")
    (tmp_path / "secret.txt").write_text("secret")
    return run.resolve()


@pytest.mark.parametrize(
    "relative",
    [
        "..",
        "../secret.txt",
        "episodes/../../secret.txt",
        "episodes/t/0/../../../../secret.txt",
        "/etc/passwd",
        "\\server\\share",
        "episodes/t/0/log.txt\x00.png",
    ],
)
def test_inside_refuses_paths_that_leave_the_folder(root, relative):
    with pytest.raises(OutsideFolder):
        inside(root, relative)


def test_inside_resolves_paths_within_the_folder(root):
    assert inside(root, "episodes/t/0/log.txt") == root / "episodes" / "t" / "0" / "log.txt"
    assert inside(root, ".") == root
    assert inside(root, "episodes/t/../t/0") == root / "episodes" / "t" / "0"
    assert inside(root, "episodes/t/0/not-yet.json") == root / "episodes/t/0/not-yet.json"


def test_inside_follows_links_and_refuses_those_that_lead_out(root):
    episode = root / "episodes" / "t" / "0"
    (episode / "out.txt").symlink_to(root.parent / "secret.txt")
    (episode / "in.txt").symlink_to(episode / "log.txt")
    (root / "episodes" / "linked").symlink_to(root.parent, target_is_directory=True)
    with pytest.raises(OutsideFolder):
        inside(root, "episodes/t/0/out.txt")
    with pytest.raises(OutsideFolder):
        inside(root, "episodes/linked/secret.txt")
    assert inside(root, "episodes/t/0/in.txt") == episode / "log.txt"


def test_inside_refuses_a_symlink_loop_instead_of_failing(root):
    (root / "a").symlink_to(root / "b")
    (root / "b").symlink_to(root / "a")
    with pytest.raises(OutsideFolder, match="cannot be resolved"):
        inside(root, "a")


def test_contained_keeps_plain_files_and_links_inside_only(root):
    (root / "summary.json").write_text("{}")
    (root / "manifest.json").symlink_to(root.parent / "secret.txt")
    (root / "results.jsonl").symlink_to(root / "episodes" / "t" / "0" / "log.txt")
    assert contained(root, root / "summary.json") == root / "summary.json"
    assert contained(root, root / "manifest.json") is None
    assert contained(root, root / "results.jsonl") == root / "episodes" / "t" / "0" / "log.txt"
    assert contained(root, root / "missing.json") == root / "missing.json"


def test_only_regular_files_are_opened_and_a_fifo_does_not_block(root):
    fifo = root / "episodes" / "t" / "0" / "messages.json"
    os.mkfifo(fifo)  # no writer: a blocking open would wait for ever
    assert files.open_regular(fifo) is None
    assert files.read_json(fifo) is None
    assert files.open_regular(root / "episodes") is None


def test_json_that_does_not_parse_or_is_too_large_says_why(root, monkeypatch):
    path = root / "result.json"
    path.write_text('{"reward": 1.0,')
    with pytest.raises(Unreadable, match=r"result.json is not valid JSON: .*line 1"):
        files.load_json(path)
    assert files.load_json(root / "missing.json") is None
    path.write_text('{"reward": 1.0}')
    monkeypatch.setattr(files, "MAX_JSON_BYTES", 8)
    with pytest.raises(Unreadable, match="too large"):
        files.load_json(path)


def test_the_results_tail_reads_complete_lines_in_chunks(root, monkeypatch):
    monkeypatch.setattr(files, "CHUNK_BYTES", 7)  # lines span several chunks
    path = root / "results.jsonl"
    path.write_bytes(b'{"a": 1}\n{"b": 22}\n{"c"')
    tail = ResultsTail()
    batch = tail.poll(path)
    assert batch is not None and not batch.reset
    assert list(batch.lines) == [(0, b'{"a": 1}\n'), (9, b'{"b": 22}\n')]
    assert tail.poll(path) is None, "unchanged: nothing to read"
    with path.open("ab") as handle:
        handle.write(b": 3}\n")
    batch = tail.poll(path)
    assert batch is not None and not batch.reset
    assert list(batch.lines) == [(19, b'{"c": 3}\n')]


@pytest.mark.parametrize("how", ["replaced", "truncated", "rewritten", "same size"])
def test_the_results_tail_starts_over_when_the_file_is_not_just_appended_to(root, how):
    path = root / "results.jsonl"
    path.write_bytes(b'{"a": 1}\n{"b": 2}\n')
    tail = ResultsTail()
    list(tail.poll(path).lines)  # type: ignore[union-attr]
    if how == "replaced":
        new = root / "new.jsonl"
        new.write_bytes(b'{"x": 1}\n{"b": 2}\n{"c": 3}\n')
        new.replace(path)
    elif how == "truncated":
        path.write_bytes(b'{"x": 1}\n')
    elif how == "rewritten":  # same inode, longer, the start changed
        with path.open("r+b") as handle:
            handle.write(b'{"x": 1}\n{"y": 2}\n{"c": 3}\n')
    else:  # same inode, same size, other content
        with path.open("r+b") as handle:
            handle.write(b'{"b": 2}\n{"a": 1}\n')
        stat = path.stat()
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    batch = tail.poll(path)
    assert batch is not None and batch.reset
    assert [line for _, line in batch.lines] == path.read_bytes().splitlines(keepends=True)
