"""Ctrl-C on ``uniagent run`` with an in-process model (``hf:smollm2``), through the CLI.

SIGINT lands while the real SmolLM2 generates (a turn of 1000 tokens, minutes here):
generation must stop at the next token, and once, twice or three times the promised
lines and exit status come out (docs/running.md, "Stopping"), never a traceback.

A probe plugin (an installed-looking distribution on ``PYTHONPATH``, loaded through the
``uniagent`` entry points like any plugin) is the test's eyes and hands inside the run:
it prints a line when ``transformers``' ``generate()`` starts, holds that generation until
the run tells it to stop (then prints a line and lets it end at its next token), and its
service, stopped when the run closes, prints how many threads are still generating and
then holds the closing until the test writes to a FIFO. Every step waits for a line,
never for time.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.slow  # each run loads the real model in a new process

ROOT = Path(__file__).resolve().parents[3]
LINE_TIMEOUT = 600.0  # a failure guard only: every wait ends on a line

PROBE = '''
"""Test probe: says when generate() starts; its service holds the run's closing."""
import asyncio
import sys
import threading
from pathlib import Path

from pydantic import BaseModel

from uniagent import ServiceSpec, hookimpl


def _watch(frame, event, arg):
    code = frame.f_code
    if event == "call" and code.co_name == "generate" and code.co_filename.endswith(
        "generation/utils.py"
    ):
        threading.setprofile(None)
        sys.setprofile(None)
        print("probe: generate() started", file=sys.stderr, flush=True)
        while frame.f_code.co_name != "_generate_sync":
            frame = frame.f_back
        frame.f_locals["stop"].wait()  # the run's cancellation reached the generation
        print("probe: generation told to stop", file=sys.stderr, flush=True)


threading.setprofile(_watch)  # threads started from now on: the model's worker threads


def generating() -> int:
    """Threads inside HFLocalModel's generation."""
    count = 0
    for frame in sys._current_frames().values():
        while frame is not None and frame.f_code.co_name != "_generate_sync":
            frame = frame.f_back
        count += frame is not None
    return count


class Settings(BaseModel):
    fifo: str


class Holding:
    def __init__(self, fifo: str) -> None:
        self.fifo = fifo

    async def stop(self) -> None:
        print(f"probe: closing; threads generating: {generating()}", file=sys.stderr, flush=True)
        await asyncio.to_thread(Path(self.fifo).read_text)  # until the test writes


async def start(settings: Settings) -> Holding:
    return Holding(settings.fifo)


@hookimpl
def uniagent_services():
    return [ServiceSpec(name="probe", start=start, settings=Settings)]
'''


class Run:
    """``uniagent run`` in a child process, its stderr read line by line."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env
        )
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def wait_for(self, prefix: str | tuple[str, ...]) -> str:
        """The first line (from now on) that starts with ``prefix`` (or one of them)."""
        while True:
            line = self._queue.get(timeout=LINE_TIMEOUT)
            if line is None:
                raise AssertionError(f"exited before {prefix!r}:\n" + "\n".join(self.lines))
            self.lines.append(line)
            if line.startswith(prefix):
                return line

    def finish(self) -> int:
        """The exit status, once every line is read."""
        while (line := self._queue.get(timeout=LINE_TIMEOUT)) is not None:
            self.lines.append(line)
        return self.proc.wait(timeout=LINE_TIMEOUT)

    def interrupt(self) -> None:
        self.proc.send_signal(signal.SIGINT)


@pytest.fixture
def setup(tmp_path: Path) -> tuple[list[str], dict[str, str], Path]:
    """The command line, its environment (the probe installed) and the probe's FIFO."""
    site = tmp_path / "site"
    info = site / "uniagent_probe-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: uniagent-probe\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[uniagent]\nuniagent-probe = uniagent_probe\n")
    (site / "uniagent_probe.py").write_text(textwrap.dedent(PROBE))
    fifo = tmp_path / "release"
    os.mkfifo(fifo)
    subprocess.run(
        [sys.executable, str(ROOT / "examples/swe_tiny/make_tasks.py"), str(tmp_path / "t")],
        check=True, capture_output=True,
    )  # fmt: skip
    config = yaml.safe_load((ROOT / "examples/swe_tiny/quickstart.yaml").read_text())
    config.update(
        tools=["execute_bash", "submit"],
        services={"probe": {"fifo": str(fifo)}},
        concurrency=1,
        # Unguided SmolLM2 writing 1000 tokens: a turn that would go on for minutes.
        sampling={"max_tokens": 1000, "extra_body": {"min_new_tokens": 1000}},
    )
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    argv = [
        sys.executable, "-m", "uniagent.cli", "run", str(tmp_path / "config.yaml"),
        "--data", str(tmp_path / "t" / "tasks.jsonl"), "--model", "hf:smollm2",
        "--out", str(tmp_path / "out"), "--limit", "1",
    ]  # fmt: skip
    pythonpath = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": pythonpath, "TMPDIR": str(tmp_path)}
    return argv, env, fifo


STOPPING = (
    "uniagent: stopping (SIGINT): cancelling the running episodes and closing their sandboxes; "
    "signal twice more to exit at once"
)
STILL_CLOSING = (
    "uniagent: still closing sandboxes; signal again to exit now and leave them to `uniagent clean`"
)
INTERRUPTED = (
    "uniagent: interrupted by SIGINT: 0 of 1 episodes finished; running episodes stopped "
    "and their sandboxes closed; run the same command again to resume"
)


@pytest.mark.parametrize("signals", [1, 2, 3])
def test_ctrl_c_once_twice_three_times(
    setup: tuple[list[str], dict[str, str], Path], signals: int
) -> None:
    argv, env, fifo = setup
    run = Run(argv, env)
    try:
        run.wait_for("probe: generate() started")
        run.interrupt()
        closing = run.wait_for("probe: closing;")
        # The episodes are unwound and their sandboxes closed: no generation goes on.
        assert closing == "probe: closing; threads generating: 0"
        if signals >= 2:
            run.interrupt()
            assert run.wait_for("uniagent: still closing") == STILL_CLOSING
        if signals == 3:
            run.interrupt()  # exits at once: the closing is still held
        else:
            fifo.write_text("go\n")
        status = run.finish()
    finally:
        if run.proc.poll() is None:
            run.proc.kill()
            run.proc.wait()
    output = "\n".join(run.lines)
    assert status == 130, output
    for sign in ("Traceback", "Exception ignored", "terminate called", "KeyboardInterrupt"):
        assert sign not in output, output
    if signals < 3:
        assert run.lines[-1] == INTERRUPTED, output
    else:
        assert INTERRUPTED not in output  # it did not wait for the closing
        # What it left is `uniagent clean`'s: the sandbox (its tmpfs mounted) unless its
        # close, which runs beside the held closing, ended before the third signal (a race
        # either way: both are right). After the clean, no sandbox and no mount of one.
        root = Path(env["TMPDIR"])
        clean = [sys.executable, "-m", "uniagent.cli", "clean", "--no-containers"]
        done = subprocess.run(clean, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        assert not [p for p in root.glob("uniagent-*-*") if p.is_dir()], done.stdout
        assert f"{root}/uniagent-" not in Path("/proc/mounts").read_text(), done.stdout


def test_the_first_signal_is_answered_at_once(setup: tuple[list[str], dict[str, str], Path]):
    """Before: nothing was printed until the generation had stopped and every sandbox was
    closed (up to a minute with a larger model: a token, or a long prompt's first one)."""
    argv, env, fifo = setup
    run = Run(argv, env)
    try:
        run.wait_for("probe: generate() started")  # held there until the run stops it
        run.interrupt()
        first = run.wait_for(("uniagent: stopping", "probe: generation told to stop"))
        assert first == STOPPING, "\n".join(run.lines)  # said before the generation ended
        run.wait_for("probe: closing;")
        fifo.write_text("go\n")
        status = run.finish()
    finally:
        if run.proc.poll() is None:
            run.proc.kill()
            run.proc.wait()
    output = "\n".join(run.lines)
    assert status == 130, output
    assert run.lines.count(STOPPING) == 1 and run.lines[-1] == INTERRUPTED, output
