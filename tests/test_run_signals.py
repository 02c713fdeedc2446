"""SIGINT and SIGTERM in every phase of ``uniagent run``, through the command line.

Each case holds a real ``python -m uniagent.cli run`` at one phase by an event
the test controls, signals it there, and checks the guarded outcome: exit status
130 / 143 after one ``uniagent: interrupted by ...`` line, no traceback, and no
sandbox left behind (no process, no episode directory, no cgroup). The holds:

- loading: the task file is a FIFO the test opens for writing (the open returns
  once the command reads it) and never writes;
- set-up: every sandbox's ``post_setup`` reads such a FIFO (bound in read-only);
- episodes: the model server holds the first requests (a :class:`Gate`);
- teardown: a service (a plugin installed for the command) whose ``stop`` reads a
  FIFO: the test lets it finish after the signal, and it must finish;
- exit: the command's stdout is a pipe the test filled, so that printing the
  summary blocks after the last episode's line.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml

from uniagent.testing.chat_server import Gate, Reply, ScriptedChatServer, tool_call

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "examples" / "swe_tiny" / "config.yaml"
PHASES = ["loading", "set-up", "episodes", "teardown", "exit"]
SIGNALS = [signal.SIGINT, signal.SIGTERM]
TASKS = 2  # --limit: two episodes at once (--concurrency 2)

PLUGIN = """
import asyncio
from pathlib import Path

from pydantic import BaseModel

from uniagent import ServiceSpec, hookimpl


class Settings(BaseModel):
    hold: str  # a FIFO the stop reads to its end before it reports "stopped"
    marker: str


class Running:
    def __init__(self, settings):
        self.settings = settings

    async def stop(self):
        await asyncio.to_thread(Path(self.settings.hold).read_bytes)
        Path(self.settings.marker).write_text("stopped")


async def start(settings):
    Path(settings.marker).write_text("started")
    return Running(settings)


@hookimpl
def uniagent_services():
    return [ServiceSpec(name="held_stop", start=start, settings=Settings)]
"""


def submit_at_once(gate: Gate | None = None):
    """Every episode submits on its first turn; with ``gate``, requests wait for it."""

    def reply(body: dict) -> Reply:
        if gate is not None:
            gate.hold()
        return Reply("Done.", tool_calls=[tool_call("submit", {}, "call_submit")])

    return reply


class Fifo:
    """A FIFO the command blocks on: :meth:`wait` returns once it opened it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        os.mkfifo(path, 0o666)
        os.chmod(path, 0o666)  # the sandbox's user (uid 65534 under bwrap as root) reads it
        self.fd: int | None = None

    def wait(self, proc: subprocess.Popen) -> None:
        """Open the write end: it returns when the command opened the read end (or ended)."""

        def unblock_if_it_ends() -> None:
            proc.wait()
            if self.fd is None:  # it ended without opening the FIFO: let the open return
                os.close(os.open(self.path, os.O_RDONLY | os.O_NONBLOCK))

        threading.Thread(target=unblock_if_it_ends, daemon=True).start()
        self.fd = os.open(self.path, os.O_WRONLY)
        if proc.poll() is not None:
            pytest.fail(f"the command ended before it opened {self.path.name} ({proc.returncode})")

    def release(self) -> None:
        """Close the write end: the reader sees the end of the file."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class Lines:
    """The command's stderr, line by line, read on a thread."""

    def __init__(self, stream: Any) -> None:
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: Any) -> None:
        for line in stream:
            self.lines.put(line)
        self.lines.put(None)

    def wait_for(self, prefix: str, timeout: float = 300) -> None:
        """Block until a line starting with ``prefix`` arrives."""
        while True:
            line = self.lines.get(timeout=timeout)  # a bound, not the synchronisation
            if line is None:
                pytest.fail(f"no line {prefix!r}: {''.join(self.seen)}")
            self.seen.append(line)
            if line.startswith(prefix):
                return

    def so_far(self) -> str:
        """Everything read until now, without waiting for more."""
        with contextlib.suppress(queue.Empty):
            while (line := self.lines.get_nowait()) is not None:
                self.seen.append(line)
        return "".join(self.seen)

    def rest(self) -> str:
        """Everything, once the command closed its stderr."""
        self._thread.join(timeout=300)
        while (line := self.lines.get_nowait()) is not None:
            self.seen.append(line)
        return "".join(self.seen)


def sandbox_processes(tmp: Path) -> list[int]:
    """PIDs whose working directory lies inside the run's TMPDIR."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and os.readlink(proc / "cwd").startswith(str(tmp)):
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def cgroups_of(pid: int) -> list[Path]:
    """The sandbox control groups a process named after itself."""
    from uniagent.env import cgroups

    found = []
    for hierarchy in cgroups._hierarchies():
        if hierarchy.parent.is_dir():
            found += hierarchy.parent.glob(f"{cgroups.PREFIX}{pid}-*")
    return found


def prefilled_pipe() -> tuple[int, int]:
    """A pipe whose buffer is full: the next write to it blocks until the test reads."""
    read, write = os.pipe()
    os.set_blocking(write, False)
    try:
        while True:
            os.write(write, b"x" * 65536)
    except BlockingIOError:
        pass
    os.set_blocking(write, True)  # the command's writes block (the flag is the pipe's)
    return read, write


@pytest.mark.parametrize("how", SIGNALS, ids=["sigint", "sigterm"])
@pytest.mark.parametrize("phase", PHASES)
def test_a_signal_in_any_phase_closes_everything_and_exits_128_plus_n(
    tasks, tmp_path, sandbox_tmp, phase, how
):
    sync = tmp_path / "sync"
    sync.mkdir(mode=0o755)
    sync.chmod(0o755)
    config = yaml.safe_load(CONFIG.read_text())
    data = tasks
    env = {**os.environ, "TMPDIR": str(sandbox_tmp), "OPENAI_API_KEY": "test"}
    gate = Gate() if phase == "episodes" else None
    hold = None
    if phase in ("loading", "set-up", "teardown"):
        hold = Fifo(sync / ("tasks.jsonl" if phase == "loading" else "hold"))
    stdout: Any = subprocess.DEVNULL
    drain = None
    if phase == "loading":
        data = sync / "tasks.jsonl"
    elif phase == "set-up":  # each task's own set-up (its overrides), after the hold
        data = tmp_path / "held.jsonl"
        rows = [json.loads(line) for line in tasks.read_text().splitlines()]
        for row in rows:
            env_settings = row["config_overrides"]["env"]
            env_settings["post_setup"].insert(0, f"cat {sync / 'hold'} >/dev/null")
            env_settings["deployment"]["ro_binds"].append(str(sync))
        data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    elif phase == "teardown":
        plugin = tmp_path / "plugin"
        info = plugin / "uniagent_held_stop-0.0.dist-info"
        info.mkdir(parents=True)
        (plugin / "uniagent_held_stop.py").write_text(PLUGIN)
        (info / "METADATA").write_text(
            "Metadata-Version: 2.1\nName: uniagent-held-stop\nVersion: 0.0\n"
        )
        (info / "entry_points.txt").write_text("[uniagent]\nheld_stop = uniagent_held_stop\n")
        env["PYTHONPATH"] = os.pathsep.join([str(plugin), env.get("PYTHONPATH", "")])
        marker = tmp_path / "service"
        config["services"] = {"held_stop": {"hold": str(sync / "hold"), "marker": str(marker)}}
    elif phase == "exit":
        drain, stdout = prefilled_pipe()
    config_path = tmp_path / "config.yaml"
    config_path.write_text(yaml.safe_dump(config))
    out = tmp_path / "out"
    with ScriptedChatServer(default=submit_at_once(gate)) as server:
        command = [
            sys.executable, "-m", "uniagent.cli", "run", str(config_path), "--data", str(data),
            "--model", f"openai:{server.base_url}#scripted", "--out", str(out),
            "--limit", str(TASKS), "--concurrency", str(TASKS), "--retries", "0",
        ]  # fmt: skip
        proc = subprocess.Popen(command, env=env, stdout=stdout, stderr=subprocess.PIPE, text=True)
        if drain is not None:
            os.close(stdout)  # the command holds the only write end now
        err = Lines(proc.stderr)
        if phase == "episodes":
            assert gate is not None
            if not gate.wait_for(TASKS):
                proc.kill()
                pytest.fail(f"the episodes never asked the model: {err.rest()}")
        elif phase == "exit":
            err.wait_for(f"done {TASKS}/{TASKS}")  # the final counts: every episode ended
        else:
            assert hold is not None
            hold.wait(proc)
        if phase == "set-up":
            assert list(sandbox_tmp.glob("uniagent-*")), "sandboxes are being set up"
        if phase == "teardown":
            assert marker.read_text() == "started"
        proc.send_signal(how)
        if hold is not None:
            hold.release()  # the held part may finish now (a stopping service must)
        if gate is not None:
            gate.release()
        if drain is not None:  # read to the end: the command can write what it holds
            threading.Thread(target=lambda: os.fdopen(drain, "rb").read(), daemon=True).start()
        try:
            rc = proc.wait(timeout=300)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            pytest.fail(f"the run did not exit within 300 s of the signal:\n{err.so_far()}")
        stderr = err.rest()

    assert rc == 128 + how, stderr
    last = stderr.strip().splitlines()[-1]
    assert last.startswith(f"uniagent: interrupted by {signal.Signals(how).name}"), stderr
    assert "Traceback" not in stderr
    assert sandbox_processes(sandbox_tmp) == [], "every sandbox's processes are gone"
    assert list(sandbox_tmp.glob("uniagent-*")) == [], "every episode directory is removed"
    assert cgroups_of(proc.pid) == [], "every sandbox's cgroup is removed"
    if phase == "loading":
        assert "while loading" in last
        assert not (out / "manifest.json").exists(), "nothing was started"
    if phase == "set-up":
        results = out / "results.jsonl"
        assert not results.exists() or not results.read_text(), "no episode got past set-up"
        assert json.loads((out / "summary.json").read_text())["status"] == "interrupted"
    if phase == "teardown":
        assert marker.read_text() == "stopped", "the service's stop ran to its end"
    if phase in ("teardown", "exit"):
        summary = json.loads((out / "summary.json").read_text())
        assert summary["episodes"] == TASKS and summary["exit_reasons"] == {"finished": TASKS}
