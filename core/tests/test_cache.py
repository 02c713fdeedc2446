"""The download cache: a folder is built once, whole or not at all, under concurrency."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from uniagent import build_once, cache_dir


def test_the_cache_folder_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("UNIAGENT_CACHE_DIR", str(tmp_path / "c"))
    assert cache_dir() == tmp_path / "c"
    monkeypatch.delenv("UNIAGENT_CACHE_DIR")
    assert cache_dir() == Path.home() / ".cache" / "uniagent"


def test_concurrent_callers_build_once_and_all_see_the_whole_folder(tmp_path):
    target = tmp_path / "cache" / "thing-1.0"
    builds: list[int] = []
    barrier = threading.Barrier(8)
    seen: list[str] = []

    def build(staging: Path) -> None:
        builds.append(1)
        (staging / "part").write_text("a")
        (staging / "done").write_text("b")

    def caller() -> None:
        barrier.wait()
        folder = build_once(target, build, done=lambda f: (f / "done").is_file())
        seen.append((folder / "part").read_text() + (folder / "done").read_text())

    threads = [threading.Thread(target=caller) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(builds) == 1
    assert seen == ["ab"] * 8
    assert target.stat().st_mode & 0o777 == 0o755  # a sandbox's own user reads it
    assert [p.name for p in target.parent.iterdir() if p.name.startswith(".staging-")] == []


def test_a_failed_build_leaves_nothing_and_an_incomplete_folder_is_replaced(tmp_path):
    target = tmp_path / "thing"
    target.mkdir()
    (target / "half").write_text("x")  # an interrupted older layout: not done

    def broken(staging: Path) -> None:
        (staging / "done").write_text("")
        raise RuntimeError("registry unreachable")

    with pytest.raises(RuntimeError, match="registry unreachable"):
        build_once(target, broken, done=lambda f: (f / "done").is_file())
    assert sorted(p.name for p in tmp_path.iterdir()) == [".thing.lock", "thing"]
    assert [p.name for p in target.iterdir()] == ["half"]

    build_once(target, lambda s: (s / "done").write_text(""), done=lambda f: (f / "done").is_file())
    assert [p.name for p in target.iterdir()] == ["done"]
