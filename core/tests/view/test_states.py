"""Episode and run states the runner makes visible as they happen: a task that cannot start
fails at once, an episode whose backend writes nothing until it ends (Ray) runs, and a
resumed run is live while its model loads."""

from __future__ import annotations

import asyncio
import io
import json
import os
import shutil
import socket
import subprocess
import threading
import time
from datetime import datetime, timezone
from typing import Any

import view_runs

from uniagent.config import AgentConfig
from uniagent.run.jobs import Job, episode_dir, failure_payload, write_payload
from uniagent.run.layout import RESULTS
from uniagent.run.manifest import pid_start
from uniagent.run.progress import EpisodeState, Progress
from uniagent.run.results import ResultsFile
from uniagent.run.retry import CircuitBreaker, RetryPolicy
from uniagent.run.runner import run, run_jobs
from uniagent.tasks import Task, load_tasks
from uniagent.testing import Gate, Reply, ScriptedChatServer
from uniagent.view.rundir import RunFolder

GUARD_S = 300  # only turns a hang into a failure


def statuses(folder: RunFolder) -> dict[str, str]:
    return {key: row.status for key, row in folder.rows.items()}


def test_a_task_that_cannot_start_is_failed_while_the_run_goes_on(tmp_path):
    tasks = view_runs.make_tasks(tmp_path / "swe_tiny")
    rows = [json.loads(line) for line in tasks.read_text().splitlines()]
    bad = {k: v for k, v in rows[0].items() if k != "problem_statement"}
    bad["instance_id"] = "no-problem"
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text(json.dumps(bad) + "\n" + json.dumps(rows[1]) + "\n")
    config = view_runs.write_config(tmp_path / "config.yaml")
    out = tmp_path / "run"
    gate = Gate()
    reply = view_runs.chat_policy()

    def held(body: dict) -> Reply:
        gate.hold()
        return reply(body)

    with ScriptedChatServer(default=held) as server:
        # One at a time: the good task's model call comes after the bad task gave up.
        command = view_runs.cli_command(config, mixed, server, out, "--concurrency", "1")
        proc = subprocess.Popen(
            command, env=view_runs.run_env(tmp_path / "tmp"), stderr=subprocess.PIPE, text=True
        )
        try:
            assert gate.wait_for(1, GUARD_S)
            folder = RunFolder(out)
            assert folder.state == "live"
            good = f"episodes/{rows[1]['instance_id']}/0"
            assert statuses(folder) == {"episodes/no-problem/0": "failed", good: "running"}
            assert "problem_statement" in (folder.rows["episodes/no-problem/0"].error or "")
        finally:
            gate.release()
            _, stderr = proc.communicate(timeout=GUARD_S)
    assert proc.returncode == 2, stderr  # tasks that could not start: bad input
    folder.refresh()
    assert folder.state == "finished"
    assert statuses(folder) == {"episodes/no-problem/0": "failed", good: "finished"}


def _iso(moment: float) -> str:
    return datetime.fromtimestamp(moment, timezone.utc).isoformat(timespec="seconds")


async def test_an_episode_whose_backend_writes_nothing_until_it_ends_shows_as_running(tmp_path):
    """``--ray``: the worker's files come back when the episode ends. Resumed, a folder an
    interrupted Ray attempt left (empty, old) runs again: it shows as running meanwhile."""
    out = tmp_path / "run"
    job = Job(Task("t", {}), 0)
    left = episode_dir(out, job)
    left.mkdir(parents=True)
    os.utime(left, (time.time() - 3600, time.time() - 3600))
    now = time.time()
    manifest = {
        "run_id": "r", "pid": os.getpid(), "pid_start": pid_start(os.getpid()),
        "host": socket.gethostname(), "n": 1, "jobs": [["t", 0]],
        "started_at": _iso(now - 3600), "resumed_at": [_iso(now)],
    }  # fmt: skip
    (out / "manifest.json").write_text(json.dumps(manifest))
    folder = RunFolder(out)
    assert statuses(folder) == {"episodes/t/0": "queued"}, "the resume has not started it"
    dispatched, replied = asyncio.Event(), asyncio.Event()

    async def on_a_worker(job: Job, attempt: int, state: EpisodeState) -> dict[str, Any]:
        dispatched.set()
        await replied.wait()  # the worker runs the episode elsewhere
        payload = failure_payload(job, "the worker went away")  # any outcome will do
        return write_payload(episode_dir(out, job), payload, "worker log\n", {"attempt": attempt})

    quiet = Progress(io.StringIO(), live=False)
    results = ResultsFile(out / RESULTS)
    policy, breaker = RetryPolicy(0, 0.0), CircuitBreaker(0)
    jobs = run_jobs([job], on_a_worker, out, concurrency=1, policy=policy, breaker=breaker,
                    progress=quiet, results=results)  # fmt: skip
    running = asyncio.ensure_future(jobs)
    await asyncio.wait_for(dispatched.wait(), GUARD_S)
    assert await asyncio.to_thread(folder.refresh)
    assert statuses(folder) == {"episodes/t/0": "running"}
    replied.set()
    await asyncio.wait_for(running, GUARD_S)
    assert await asyncio.to_thread(folder.refresh)
    assert statuses(folder) == {"episodes/t/0": "failed"}
    assert (left / "log.txt").read_text() == "worker log\n"


def test_a_resumed_run_is_live_while_its_model_loads(messages_run, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(messages_run, out)
    folder = RunFolder(out)
    assert folder.state == "finished"
    manifest = json.loads((out / "manifest.json").read_text())
    config = AgentConfig.from_yaml(manifest["config_file"])
    tasks, bad_rows = load_tasks(manifest["tasks"]["path"])
    loading, loaded = threading.Event(), threading.Event()
    outcome: list[BaseException] = []

    def model() -> Any:  # a model that takes its time to load, then cannot be had
        loading.set()
        loaded.wait(GUARD_S)
        raise RuntimeError("no weights here")

    def resume() -> None:
        try:
            asyncio.run(
                run(config, tasks, bad_rows, model, out, n=manifest["n"], force_resume=True,
                    progress=Progress(io.StringIO(), live=False))
            )  # fmt: skip
        except BaseException as exc:  # handed to the test
            outcome.append(exc)

    thread = threading.Thread(target=resume)
    thread.start()
    try:
        assert loading.wait(GUARD_S)
        assert folder.refresh() and folder.state == "live", "not the last invocation's end"
        assert set(statuses(folder).values()) == {"finished"}
    finally:
        loaded.set()
        thread.join(GUARD_S)
    assert "cannot load the model" in str(outcome[0])
    assert folder.refresh() and folder.state == "finished", "a resume that never began"
