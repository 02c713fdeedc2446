"""How the viewer reads a run folder that is still being written, or was left half done."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from uniagent.view.rundir import RunFolder


@pytest.fixture
def runner_process() -> Iterator[subprocess.Popen[bytes]]:
    """A live process that looks like `uniagent run` (its command line names uniagent)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()", "uniagent"], stdin=subprocess.PIPE
    )
    yield proc
    proc.kill()
    proc.wait()


def half_done(messages_run: Path, tmp_path: Path, pid: int) -> Path:
    """A copy of a finished run turned back into one in progress, owned by ``pid``.

    Of its 12 jobs, 6 have results, 2 have a folder but no result (running), 4 have
    nothing yet (queued).
    """
    run = tmp_path / "run"
    shutil.copytree(messages_run, run)
    (run / "summary.json").unlink()
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["pid"] = pid
    (run / "manifest.json").write_text(json.dumps(manifest))
    lines = (run / "results.jsonl").read_text().splitlines(keepends=True)
    records = [json.loads(line) for line in lines]
    keep = {(r["task_id"], r["sample"]) for r in records[:6]}
    (run / "results.jsonl").write_text("".join(lines[:6]))
    pending = [(t, s) for t, s in manifest["jobs"] if (t, s) not in keep]
    for index, (task, sample) in enumerate(pending):
        folder = run / "episodes" / task / str(sample)
        if index < 2:  # started: the folder and its log, nothing else yet
            for name in ("result.json", "messages.json", "rollout.json"):
                (folder / name).unlink()
        else:
            shutil.rmtree(folder)
    return run


def statuses(folder: RunFolder) -> Counter[str]:
    return Counter(row.status for row in folder.rows.values())


def test_a_run_in_progress_shows_queued_running_and_finished(
    messages_run, tmp_path, runner_process
):
    run = half_done(messages_run, tmp_path, runner_process.pid)
    folder = RunFolder(run)
    assert folder.state == "live"
    assert statuses(folder) == {"finished": 6, "running": 2, "queued": 4}
    assert [r.order for r in folder.rows.values()] == list(range(12))


def test_a_queued_job_runs_then_finishes_as_the_files_appear(
    messages_run, tmp_path, runner_process
):
    run = half_done(messages_run, tmp_path, runner_process.pid)
    folder = RunFolder(run)
    key = next(k for k, r in folder.rows.items() if r.status == "queued")
    (run / key).mkdir(parents=True)
    version = folder.version
    assert folder.refresh() and folder.version == version + 1
    assert folder.rows[key].status == "running"
    assert not folder.refresh(), "nothing new, nothing changed"

    record = json.loads((messages_run / key / "result.json").read_text())
    line = json.dumps(record)
    with (run / "results.jsonl").open("a") as handle:
        handle.write(line[:40])  # cut short, as by a writer still at it
    folder.refresh()
    assert folder.rows[key].status == "running"
    with (run / "results.jsonl").open("a") as handle:
        handle.write(line[40:] + "\n")
    assert folder.refresh()
    assert folder.rows[key].status == "finished"
    assert folder.rows[key].reward == record["reward"]


def test_a_run_whose_process_died_shows_its_started_episodes_as_interrupted(
    messages_run, tmp_path, runner_process
):
    run = half_done(messages_run, tmp_path, runner_process.pid)
    folder = RunFolder(run)
    running = {k for k, r in folder.rows.items() if r.status == "running"}
    runner_process.kill()
    runner_process.wait()
    folder.refresh()
    assert folder.state == "interrupted"
    assert {k for k, r in folder.rows.items() if r.status == "interrupted"} == running
    assert statuses(folder)["queued"] == 4, "never started: still queued for a resume"


def test_a_process_that_is_not_uniagent_does_not_keep_a_run_live(messages_run, tmp_path):
    other = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )
    try:
        folder = RunFolder(half_done(messages_run, tmp_path, other.pid))
        assert folder.state == "interrupted"
    finally:
        other.kill()
        other.wait()


def test_tasks_that_could_not_start_are_failed_once_the_run_ends(messages_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(messages_run, run)
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["jobs"].append(["no-problem", 0])
    (run / "manifest.json").write_text(json.dumps(manifest))
    (run / "episodes" / "no-problem" / "0").mkdir(parents=True)
    summary = json.loads((run / "summary.json").read_text())
    summary["failed_tasks"] = [
        {"task_id": "no-problem", "sample": 0, "error": "task has no field 'problem_statement'"}
    ]
    (run / "summary.json").write_text(json.dumps(summary))  # written after the manifest
    folder = RunFolder(run)
    assert folder.state == "finished"
    row = folder.rows["episodes/no-problem/0"]
    assert row.status == "failed" and "problem_statement" in (row.error or "")


def test_a_rewritten_results_file_is_read_again_whole(messages_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(messages_run, run)
    folder = RunFolder(run)
    lines = (run / "results.jsonl").read_text().splitlines(keepends=True)
    (run / "results.jsonl").write_text("".join(lines[:3]))  # e.g. a repair after a crash
    folder.refresh()
    assert statuses(folder)["finished"] == 3
    assert statuses(folder)["interrupted"] == 9, "their folders exist, their results are gone"


def test_unknown_fields_and_junk_lines_are_tolerated(messages_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(messages_run, run)
    lines = (run / "results.jsonl").read_text().splitlines()
    first = json.loads(lines[0])
    first["new_field"] = {"from": "a later version"}
    first["metrics"]["tool_calls"] = "not a mapping"
    first["metrics"]["inexact_turns"] = 2
    (run / "results.jsonl").write_text(
        "\n".join([json.dumps(first), "{not json", "[1, 2]", *lines[1:]]) + "\n"
    )
    (run / "manifest.json").write_text(json.dumps({"jobs": [["x"], "bad", ["mean-empty", 0]]}))
    (run / "unexpected.bin").write_bytes(b"\x00\x01")
    folder = RunFolder(run)
    assert statuses(folder)["finished"] == 12
    row = folder.rows[f"episodes/{first['task_id']}/{first['sample']}"]
    assert row.tool_calls == {} and row.inexact_turns == 2


def test_the_event_stream_names_the_rows_that_changed(
    messages_run, tmp_path, runner_process, viewer_of
):
    run = half_done(messages_run, tmp_path, runner_process.pid)
    queued = [k for k, r in RunFolder(run).rows.items() if r.status == "queued"]
    viewer = viewer_of(str(run))
    with httpx.stream("GET", viewer.url + "api/runs/0/events", timeout=120) as events:
        updates = (json.loads(line[5:]) for line in events.iter_lines() if line.startswith("data:"))
        first = next(updates)
        assert first["state"] == "live" and first["status"]["queued"] == 4
        assert first["changed"] is None, "the first event is the whole picture"
        (run / queued[0]).mkdir(parents=True)
        update = next(updates)
        assert update["changed"] == [queued[0]]
        assert update["status"] == {"finished": 6, "running": 3, "queued": 3}


def test_changes_are_remembered_per_version(messages_run, tmp_path, runner_process):
    run = half_done(messages_run, tmp_path, runner_process.pid)
    folder = RunFolder(run)
    start = folder.version
    queued = [k for k, r in folder.rows.items() if r.status == "queued"]
    for key in queued[:2]:
        (run / key).mkdir(parents=True)
        folder.refresh()
    assert folder.changes_since(start) == sorted(queued[:2])
    assert folder.changes_since(start + 1) == [queued[1]]
    assert folder.changes_since(folder.version) == []
    assert folder.changes_since(-100) is None


def test_the_summary_of_a_run_with_nothing_finished_yet_is_empty_not_an_error():
    from uniagent.view.index import stats
    from uniagent.view.row import Row

    summary = stats([Row(key="episodes/t/0", task_id="t", sample=0, order=0)], n=1)
    assert summary["episodes"] == 0 and summary["mean_reward"] is None
    assert summary["status"]["queued"] == 1 and summary["time_seconds"]["model_seconds"] == 0.0
