"""New runs appear: ``uniagent view runs/`` shows the runs that start in ``runs/`` after it,
whether their folder existed before (empty) or not, live through the event stream."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import httpx
import view_runs

from uniagent.run.folder import FolderLock
from uniagent.testing import Gate, Reply, ScriptedChatServer
from uniagent.view.catalog import Catalog
from uniagent.view.rundir import RunFolder

GUARD_S = 300  # only turns a hang into a failure


def folder_of_runs(messages_run: Path, tmp_path: Path) -> Path:
    """``runs/`` holding a finished run ``old`` and an empty folder ``new``."""
    runs = tmp_path / "runs"
    shutil.copytree(messages_run, runs / "old")
    (runs / "new").mkdir()
    return runs


def test_a_run_started_in_a_folder_that_existed_before_is_added(messages_run, tmp_path):
    runs = folder_of_runs(messages_run, tmp_path)
    catalog = Catalog([runs])
    assert [r.name for r in catalog.runs] == ["old"] and catalog.watched == [runs]
    version = catalog.version
    assert not catalog.rescan(), "nothing new"
    lock = FolderLock(runs / "new")  # what `uniagent run --out runs/new` does first
    lock.acquire()
    try:
        assert catalog.rescan() and catalog.version == version + 1
        assert [r.name for r in catalog.runs] == ["old", "new"]
        new = catalog.runs[1]
        assert new.kind == "run" and new.state == "live", "starting: its model may be loading"
    finally:
        lock.release()
    assert not catalog.rescan(), "added once"
    new.refresh()
    assert new.state == "unknown", "never got further: no manifest, no summary"


def test_a_run_in_a_new_folder_takes_the_place_of_the_empty_folder_of_runs(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    catalog = Catalog([runs])
    assert [r.name for r in catalog.runs] == ["runs"], "shown, empty, until a run starts"
    lock = FolderLock(runs / "first")
    lock.acquire()
    try:
        assert catalog.rescan()
        assert [r.name for r in catalog.runs] == ["first"], "the same id: run 0"
        assert catalog.runs[0].state == "live"
    finally:
        lock.release()
    (runs / "second").mkdir()
    assert not catalog.rescan(), "an empty folder is not a run"
    (runs / "second" / "results.jsonl").write_text("")
    assert catalog.rescan() and [r.name for r in catalog.runs] == ["first", "second"]


def test_an_empty_folder_named_as_a_run_folder_becomes_that_run(tmp_path, runner_process):
    run = tmp_path / "new"
    run.mkdir()
    catalog = Catalog([run])
    lock = FolderLock(run)
    lock.acquire()
    try:
        assert not catalog.rescan(), "the folder itself, not a folder of runs"
        folder = catalog.runs[0]
        assert folder.refresh() and folder.kind == "run" and folder.state == "live"
        assert catalog.watched == []
    finally:
        lock.release()


def test_a_run_named_on_its_own_and_inside_a_folder_of_runs_is_shown_once(messages_run, tmp_path):
    runs = folder_of_runs(messages_run, tmp_path)
    catalog = Catalog([runs / "old", runs])
    (runs / "new" / "results.jsonl").write_text("")
    catalog.rescan()
    assert [r.root.name for r in catalog.runs] == ["old", "new"]
    assert [r.name for r in catalog.runs] == ["old", "new"]


def test_a_run_started_later_appears_in_the_viewer_through_its_events(
    messages_run, tmp_path, viewer_of
):
    """`uniagent view runs/`, then `uniagent run --out runs/new`: no restart needed."""
    runs = folder_of_runs(messages_run, tmp_path)
    viewer = viewer_of(str(runs))
    listed = viewer.json("/api/runs")
    assert [r["name"] for r in listed["runs"]] == ["old"]
    assert any("appear as they start" in line for line in viewer.output)
    tasks = view_runs.make_tasks(tmp_path / "swe_tiny")
    config = view_runs.write_config(tmp_path / "config.yaml")
    gate = Gate()
    reply = view_runs.chat_policy()

    def held(body: dict) -> Reply:
        gate.hold()
        return reply(body)

    with (
        ScriptedChatServer(default=held) as server,
        httpx.stream("GET", viewer.url + "api/runs/0/events", timeout=GUARD_S) as events,
    ):
        updates = (json.loads(line[5:]) for line in events.iter_lines() if line.startswith("data:"))
        first = next(updates)
        assert first["runs_version"] == listed["runs_version"]
        command = view_runs.cli_command(config, tasks, server, runs / "new", "--limit", "1")
        run = subprocess.Popen(
            command, env=view_runs.run_env(tmp_path / "tmp"), stderr=subprocess.PIPE, text=True
        )
        try:
            update = next(updates)  # run 0 did not change: this is about the runs on show
            assert update["runs_version"] > first["runs_version"] and update["changed"] == []
            listed = viewer.json("/api/runs")
            assert [r["name"] for r in listed["runs"]] == ["old", "new"]
            assert listed["runs"][1]["state"] == "live"
            assert gate.wait_for(1, GUARD_S)
            # The viewer answers from a look at the folder up to half a second old: the
            # episode that asked the model shows as running now or with the run's next change.
            with httpx.stream("GET", viewer.url + "api/runs/1/events", timeout=GUARD_S) as live:
                news = (json.loads(line[5:]) for line in live.iter_lines() if line[:5] == "data:")
                next(news)  # the run as it was when the stream opened
                rows = viewer.json("/api/runs/1/episodes")["rows"]
                while [r["status"] for r in rows] != ["running"]:
                    try:
                        next(news)
                    except (httpx.ReadTimeout, StopIteration) as exc:  # quiet or closed
                        never = f"the episode never showed as running: {rows}"
                        raise AssertionError(never) from exc
                    rows = viewer.json("/api/runs/1/episodes")["rows"]
            assert [(r["task_id"], r["status"]) for r in rows] == [("mean-empty", "running")]
        finally:
            gate.release()
            _, stderr = run.communicate(timeout=GUARD_S)
    assert run.returncode == 0, stderr
    assert RunFolder(runs / "new").state == "finished"
