"""How the viewer reads a run folder that is still being written, or was left half done."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

import httpx
import pytest

from uniagent.run.folder import start_attempt
from uniagent.run.manifest import pid_start
from uniagent.view.access import EpisodeFiles
from uniagent.view.rundir import RunFolder


def half_done(
    messages_run: Path, tmp_path: Path, pid: int, *, start: int | str | None = "pid's"
) -> Path:
    """A copy of a finished run turned back into one in progress, owned by ``pid`` (and
    its start time, as `uniagent run` records it; else ``start``).

    Of its 12 jobs, 6 have results, 2 have a folder but no result (running), 4 have
    nothing yet (queued).
    """
    run = tmp_path / "run"
    shutil.copytree(messages_run, run)
    (run / "summary.json").unlink()
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["pid"] = pid
    manifest["pid_start"] = pid_start(pid) if start == "pid's" else start
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
        # A manifest without the start time (an older uniagent): the command line decides.
        folder = RunFolder(half_done(messages_run, tmp_path, other.pid, start=None))
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


@pytest.mark.parametrize("status", ["interrupted", "stopped"])
def test_a_run_that_ended_early_is_interrupted_not_finished(messages_run, tmp_path, status):
    run = tmp_path / "run"
    shutil.copytree(messages_run, run)
    summary = json.loads((run / "summary.json").read_text())
    summary["status"] = status  # Ctrl-C, or the circuit breaker tripped
    (run / "summary.json").write_text(json.dumps(summary))  # written after the manifest
    assert RunFolder(run).state == "interrupted"


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


def test_the_summary_of_a_run_on_several_model_servers_shows_each_ones_share():
    """The viewer's summary counts episodes, tokens and lost attempts per model server,
    as ``uniagent run``'s summary does (``summarize`` over the same records)."""
    from uniagent.run.summary import summarize
    from uniagent.view.index import stats
    from uniagent.view.row import row_from_record

    a, b = "http://10.0.0.1:8000/v1", "http://10.0.0.2:8000/v1"
    records = [
        {"task_id": "t0", "sample": 0, "exit_reason": "finished", "reward": 1.0,
         "model_server": {"name": b, "generated_tokens": 30},
         "previous_attempts": [{"attempt": 1, "exit_reason": "model_error", "model_server": a}]},
        {"task_id": "t1", "sample": 0, "exit_reason": "finished", "reward": 0.0,
         "model_server": {"name": a, "generated_tokens": 12}},
    ]  # fmt: skip
    rows = [row_from_record(r, f"episodes/{i}", i, None) for i, r in enumerate(records)]
    viewed = stats(rows, n=1)["servers"]
    assert (
        viewed
        == summarize(records, n=1, wall_seconds=0.0)["servers"]
        == {
            a: {"episodes": 1, "generated_tokens": 12, "failed_attempts": 1},
            b: {"episodes": 1, "generated_tokens": 30, "failed_attempts": 0},
        }
    )
    assert rows[0].to_json()["model_server"] == b


def append_record(run: Path, record: dict) -> None:
    with (run / "results.jsonl").open("a") as handle:
        handle.write(json.dumps(record) + "\n")


def test_an_empty_run_is_indexed_once_and_picks_up_episodes_as_they_appear(tmp_path):
    run = tmp_path / "run"
    (run / "episodes").mkdir(parents=True)
    (run / "results.jsonl").write_text("")
    folder = RunFolder(run)
    assert folder.kind == "run" and folder.rows == {}
    version = folder.version
    assert not folder.refresh() and not folder.refresh()
    assert folder.version == version, "nothing changed: no new version, no live event"
    (run / "episodes" / "t" / "0").mkdir(parents=True)
    assert folder.refresh() and folder.rows["episodes/t/0"].status == "running"
    assert not folder.refresh()
    append_record(run, {"task_id": "t", "sample": 0, "reward": 1.0, "exit_reason": "finished"})
    assert folder.refresh() and folder.rows["episodes/t/0"].status == "finished"


def test_an_empty_folder_becomes_a_run_when_a_run_starts_writing_into_it(tmp_path, runner_process):
    run = tmp_path / "run"
    run.mkdir()
    folder = RunFolder(run)
    assert folder.kind == "tree" and folder.rows == {}
    manifest = {"pid": runner_process.pid, "pid_start": pid_start(runner_process.pid)}
    manifest |= {"host": socket.gethostname(), "jobs": [["t", 0], ["t", 1]], "n": 2}
    (run / "manifest.json").write_text(json.dumps(manifest))
    assert folder.refresh()
    assert folder.kind == "run" and folder.state == "live"
    assert statuses(folder) == {"queued": 2}


def test_a_reused_pid_does_not_keep_a_run_live(messages_run, tmp_path, runner_process):
    """The manifest's pid now belongs to another process (its start time differs), even
    one whose command line names uniagent."""
    start = pid_start(runner_process.pid)
    assert start is not None
    run = half_done(messages_run, tmp_path, runner_process.pid, start=start - 1)
    folder = RunFolder(run)
    assert folder.state == "interrupted"
    assert statuses(folder) == {"finished": 6, "interrupted": 2, "queued": 4}


def _iso(moment: float) -> str:
    return datetime.fromtimestamp(moment, timezone.utc).isoformat(timespec="seconds")


def resumed(messages_run: Path, tmp_path: Path, pid: int) -> Path:
    """A half-done run whose first invocation ended an hour ago (its summary and episode
    folders are that old), resumed just now by ``pid``."""
    run = half_done(messages_run, tmp_path, pid)
    now = time.time()
    earlier = now - 3600
    (run / "summary.json").write_text(json.dumps({"episodes": 6}))
    for path in [*(run / "episodes").rglob("*"), run / "summary.json", run / "results.jsonl"]:
        os.utime(path, (earlier, earlier))
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["started_at"] = _iso(earlier - 600)
    manifest["resumed_at"] = [_iso(earlier - 300), _iso(now)]
    (run / "manifest.json").write_text(json.dumps(manifest))  # as the resume writes it
    return run


def test_a_resumed_run_is_live_and_runs_what_it_starts_again(
    messages_run, tmp_path, runner_process
):
    run = resumed(messages_run, tmp_path, runner_process.pid)
    folder = RunFolder(run)
    assert folder.state == "live", "an earlier invocation's summary does not end the run"
    assert (
        folder.info()["resumed_at"] == json.loads((run / "manifest.json").read_text())["resumed_at"]
    )
    # The interrupted invocation's folders wait to be run again: queued, not running.
    assert statuses(folder) == {"finished": 6, "queued": 6}
    key = next(
        k for k, r in folder.rows.items() if r.status == "queued" and (run / k / "log.txt").exists()
    )
    start_attempt(run / key)  # what the resumed run does first in the folder
    assert folder.refresh()
    assert folder.rows[key].status == "running"
    assert statuses(folder) == {"finished": 6, "running": 1, "queued": 5}


def with_failure(run: Path, exit_reason: str) -> tuple[str, dict]:
    """Make the first results record of ``run`` an infrastructure failure of attempt 1;
    returns its key and the original record."""
    lines = (run / "results.jsonl").read_text().splitlines()
    first = json.loads(lines[0])
    failed = {**first, "exit_reason": exit_reason, "reward": None, "attempt": 1}
    (run / "results.jsonl").write_text("\n".join([json.dumps(failed), *lines[1:]]) + "\n")
    return f"episodes/{first['task_id']}/{first['sample']}", first


def test_an_infrastructure_failure_run_again_shows_as_running(
    messages_run, tmp_path, runner_process
):
    run = half_done(messages_run, tmp_path, runner_process.pid)
    key, first = with_failure(run, "env_error")
    folder = RunFolder(run)
    assert folder.rows[key].status == "failed"
    start_attempt(run / key)  # a resume (or retry) tries it again: attempt 2
    assert folder.refresh() and folder.rows[key].status == "running"
    append_record(run, {**first, "attempt": 2})
    assert folder.refresh() and folder.rows[key].status == "finished"


def test_the_rerun_of_a_failure_in_a_run_that_stopped_shows_the_failure(
    messages_run, tmp_path, runner_process
):
    run = half_done(messages_run, tmp_path, runner_process.pid)
    key, _ = with_failure(run, "model_error")
    start_attempt(run / key)
    folder = RunFolder(run)
    assert folder.rows[key].status == "running"
    runner_process.kill()
    runner_process.wait()
    assert folder.refresh() and folder.state == "interrupted"
    assert folder.rows[key].status == "failed", "its latest result is still the failure"


def test_top_files_that_link_out_of_the_run_folder_are_not_read(messages_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(messages_run, run)
    outside = tmp_path / "outside"
    outside.mkdir()
    for name in ("manifest.json", "summary.json", "results.jsonl"):
        (run / name).rename(outside / name)
        (run / name).symlink_to(outside / name)
    folder = RunFolder(run)
    assert folder.manifest is None and folder.summary is None
    assert "finished" not in statuses(folder), "results.jsonl outside was not read"
    assert folder.info()["run_id"] is None
    # A link that stays inside the run folder is followed.
    (run / "kept").mkdir()
    (outside / "results.jsonl").rename(run / "kept" / "results.jsonl")
    (run / "results.jsonl").unlink()
    (run / "results.jsonl").symlink_to(Path("kept") / "results.jsonl")
    assert folder.refresh() and statuses(folder)["finished"] == 12


def test_a_results_file_rewritten_in_place_is_read_again(messages_run, tmp_path):
    """Same file, same size, two lines swapped: their offsets moved, and the index follows."""
    run = tmp_path / "run"
    shutil.copytree(messages_run, run)
    for folder_path in (run / "episodes").glob("*/*"):
        (folder_path / "result.json").unlink()  # the record comes from results.jsonl
    folder = RunFolder(run)
    lines = (run / "results.jsonl").read_bytes().splitlines(keepends=True)
    assert len(lines[0]) != len(lines[1])
    swapped = b"".join([lines[1], lines[0], *lines[2:]])
    with (run / "results.jsonl").open("r+b") as handle:  # in place: the inode stays
        handle.write(swapped)
    folder.refresh()
    for line in lines[:2]:
        record = json.loads(line)
        key = f"episodes/{record['task_id']}/{record['sample']}"
        assert EpisodeFiles(folder).results_record(key) == record
    assert statuses(folder) == {"finished": 12}


def test_a_record_of_the_wrong_shape_is_a_row_not_an_error(messages_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(messages_run, run)
    odd = {
        "task_id": "odd",
        "sample": "²",  # a digit to str.isdigit, not to int()
        "reward": 10**400,  # no float holds it
        "metrics": {"turns": "²", "model_seconds": float("nan")},
        "exit_reason": "finished",
        "episode_dir": "episodes/odd/0",
    }
    with (run / "results.jsonl").open("a") as handle:
        handle.write(json.dumps(odd) + "\n" + "{not json\n")
    folder = RunFolder(run)
    row = folder.rows["episodes/odd/0"]
    assert row.status == "finished" and row.reward is None and row.sample is None
    assert row.turns is None and row.model_seconds is None
    assert statuses(folder)["finished"] == 13
    assert folder.info()["unreadable_lines"] == 1
