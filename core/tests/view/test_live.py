"""Live updates and the event loop, in process: no change is missed by an event stream,
and a request blocked in file IO does not hold up the others.

Each wait below is on an event; the timeouts only turn a hang into a failure.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import threading
from pathlib import Path

import httpx

from uniagent.run.manifest import pid_start
from uniagent.view.access import EpisodeFiles
from uniagent.view.app import Watcher, create_app
from uniagent.view.rundir import RunFolder

GUARD_S = 120  # far longer than any step takes, on a machine with every core busy


def pending_run(messages_run: Path, tmp_path: Path, pid: int) -> tuple[Path, list[str]]:
    """A copy of a finished run, resumed by ``pid`` to run three more jobs (queued)."""
    run = tmp_path / "run"
    shutil.copytree(messages_run, run)
    manifest = json.loads((run / "manifest.json").read_text())
    manifest |= {"pid": pid, "pid_start": pid_start(pid)}
    extra = [["later", 0], ["later", 1], ["later", 2]]
    manifest["jobs"] += extra
    (run / "manifest.json").write_text(json.dumps(manifest))
    return run, [f"episodes/{t}/{s}" for t, s in extra]


async def test_a_change_made_while_an_update_is_being_sent_is_not_missed(
    messages_run, tmp_path, runner_process
):
    run, queued = pending_run(messages_run, tmp_path, runner_process.pid)
    folder = RunFolder(run)
    watcher = Watcher([folder], interval=3600)  # no ticks: only the refreshes below
    stream = watcher.stream(folder)
    first = json.loads((await anext(stream))["data"])
    assert first["changed"] is None
    # The stream is suspended where it hands its update over (sending it): a change now
    # lands between its look at the run and its wait.
    (run / queued[0]).mkdir(parents=True)
    assert watcher.refresh(folder)
    update = json.loads((await asyncio.wait_for(anext(stream), GUARD_S))["data"])
    assert update["changed"] == [queued[0]]
    await stream.aclose()


async def test_a_change_found_by_a_worker_thread_wakes_a_waiting_stream(
    messages_run, tmp_path, runner_process
):
    run, queued = pending_run(messages_run, tmp_path, runner_process.pid)
    folder = RunFolder(run)
    watcher = Watcher([folder], interval=3600)
    stream = watcher.stream(folder)
    await anext(stream)
    waiting = asyncio.ensure_future(anext(stream))  # waits: nothing changed yet
    await asyncio.sleep(0)  # let it start waiting (order, not time: one loop turn)
    assert not waiting.done()
    (run / queued[1]).mkdir(parents=True)
    assert await asyncio.to_thread(watcher.refresh, folder)  # as the request handlers do
    update = json.loads((await asyncio.wait_for(waiting, GUARD_S))["data"])
    assert update["changed"] == [queued[1]] and update["status"]["running"] == 1
    await stream.aclose()


async def test_a_request_blocked_on_a_slow_disk_does_not_hold_up_the_others(
    messages_run, tmp_path, runner_process, monkeypatch
):
    run, _ = pending_run(messages_run, tmp_path, runner_process.pid)
    folder = RunFolder(run)
    entered, release = threading.Event(), threading.Event()
    read_text = EpisodeFiles.read_text

    def slow_read_text(self: EpisodeFiles, key: str, name: str, *, tail: int) -> tuple[str, int]:
        entered.set()
        release.wait(GUARD_S)  # a disk that does not answer until told
        return read_text(self, key, name, tail=tail)

    monkeypatch.setattr(EpisodeFiles, "read_text", slow_read_text)
    app = create_app([folder])
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        log = asyncio.ensure_future(
            client.get("/api/runs/0/episode/log", params={"key": "episodes/mean-empty/0"})
        )
        assert await asyncio.to_thread(entered.wait, GUARD_S)
        runs = await asyncio.wait_for(client.get("/api/runs"), GUARD_S)
        assert runs.status_code == 200 and not release.is_set() and not log.done()
        release.set()
        response = await asyncio.wait_for(log, GUARD_S)
    assert response.status_code == 200 and "finished" in response.json()["text"]
