"""Run nox sessions side by side in lanes: CI's suites on every core at once.

    python .ci/lanes.py [--lanes N] [--alone SESSION]... [--only-beside SESSION 'OTHER|...']...
                        SESSION... [-- POSARGS]

Each session runs as its own ``python -m nox -s SESSION`` (its own fresh venv, as with
plain ``nox``). Up to N run at once (default: one a CPU), started in the order given, so
give the longest first. Sessions named with ``--alone`` run after all the others, one at a
time with nothing beside them (the stress rounds, which saturate the machine on purpose).
A session given with ``--only-beside`` runs in the lanes, but never at the same time as a
session outside the list given for it (a lane takes the first pending session that may
run beside those running, or waits for one to end).

A session's output goes to ``.nox/lanes/<session>.log`` and is printed whole when the
session ends, so that two sessions' logs are never interleaved; a line says when each
starts and ends. Every session runs even when one fails; the exit status is 1 if any
failed. Interrupted (SIGINT, SIGTERM), it stops every session it started.

Where the machine has cgroup v1's ``cpuacct`` hierarchy and this process may write there
(root), each session runs in a group of its own: when it ends, the CPU of every process it
started (Ray's daemons, sandbox processes a PID namespace reaps, processes nobody waited
for) goes to the durations file as ``all_cpu_seconds``, and processes it left running are
named. A container's processes run in podman's own groups and are not counted.

The noxfile's ``ci`` session (what plain ``nox`` runs) calls this with CI's sessions.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOGS = ROOT / ".nox" / "lanes"
DURATIONS = ROOT / ".nox" / "durations.jsonl"
CPUACCT = Path("/sys/fs/cgroup/cpuacct")
#: Run first in a session's process: it moves itself into the group, then becomes nox.
_JOIN = 'echo $$ > "$0" 2>/dev/null; exec "$@"'


@dataclass(eq=False)
class Job:
    """One nox session to run."""

    session: str
    log: Path
    status: int | None = None
    seconds: float = 0.0
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)


def _slug(session: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", session).strip("-")


class CpuGroups:
    """A cgroup v1 ``cpuacct`` group per session, below this process's own group; ``root``
    is None where there is no such hierarchy or it cannot be written."""

    def __init__(self) -> None:
        self.root: Path | None = None
        try:
            own = next(
                line.split(":", 2)[2]
                for line in Path("/proc/self/cgroup").read_text().splitlines()
                if "cpuacct" in line.split(":", 2)[1].split(",")
            )
            root = CPUACCT / own.lstrip("/") / f"uniagent-ci-{os.getpid()}"
            root.mkdir()
        except (OSError, StopIteration, IndexError):
            return
        self.root = root

    def make(self, name: str) -> Path | None:
        if self.root is None:
            return None
        group = self.root / name
        try:
            group.mkdir()
        except OSError:
            return None
        return group

    @staticmethod
    def seconds(group: Path) -> float | None:
        """The CPU its processes used (those still there and those that ended); None where
        no process ever joined it."""
        try:
            used = int((group / "cpuacct.usage").read_text()) / 1e9
        except (OSError, ValueError):
            return None
        return used if used > 0 else None

    @staticmethod
    def left(group: Path) -> list[int]:
        """The processes still in the group."""
        try:
            return [int(pid) for pid in (group / "cgroup.procs").read_text().split()]
        except (OSError, ValueError):
            return []

    def remove(self) -> None:
        """Remove the groups that are empty (one with a process left in it stays)."""
        if self.root is None:
            return
        for group in [*self.root.iterdir(), self.root]:
            if group.is_dir():
                with contextlib.suppress(OSError):
                    group.rmdir()


class Lanes:
    """Runs jobs, ``lanes`` at a time; prints each job's log whole when it ends."""

    def __init__(
        self,
        command: list[str],
        posargs: list[str],
        lanes: int,
        durations: Path = DURATIONS,
    ) -> None:
        self.command = command
        self.posargs = posargs
        self.lanes = max(1, lanes)
        self.durations = durations
        self.groups = CpuGroups()
        self._print = threading.Lock()
        self._stopping = threading.Event()
        self._running: set[Job] = set()
        self._running_lock = threading.Lock()

    def say(self, text: str) -> None:
        with self._print:
            print(f"lanes: {text}", flush=True)

    def run_one(self, job: Job) -> None:
        """Run one session and print its log; a session that cannot be started failed."""
        if self._stopping.is_set():
            return
        try:
            self._run(job)
        except Exception:
            job.status = -1
            self.say(f"{job.session} could not run:\n{traceback.format_exc()}")

    def _run(self, job: Job) -> None:
        argv = [*self.command, "-s", job.session]
        if self.posargs:
            argv += ["--", *self.posargs]
        job.log.parent.mkdir(parents=True, exist_ok=True)
        group = self.groups.make(_slug(job.session))
        if group is not None:
            argv = ["/bin/sh", "-c", _JOIN, str(group / "cgroup.procs"), *argv]
        self.say(f"{job.session} started")
        start = time.monotonic()
        with job.log.open("wb") as out:
            # Its own process group: stopping the run stops the session's pytest and all.
            job.proc = subprocess.Popen(
                argv, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
            with self._running_lock:
                self._running.add(job)
            try:
                job.status = job.proc.wait()
            finally:
                with self._running_lock:
                    self._running.discard(job)
        job.seconds = time.monotonic() - start
        if group is not None:
            self._account(job, group)
        outcome = "passed" if job.status == 0 else f"FAILED (exit {job.status})"
        with self._print:
            sys.stdout.flush()
            print(f"\nlanes: ===== {job.session} =====", flush=True)
            with job.log.open("rb") as log:
                while chunk := log.read(1 << 16):
                    sys.stdout.buffer.write(chunk)
            sys.stdout.buffer.flush()
            print(f"lanes: {job.session} {outcome} in {job.seconds:.0f} s\n", flush=True)

    def _account(self, job: Job, group: Path) -> None:
        """The session's CPU, every process it started included, to the durations file; the
        processes it left running named."""
        seconds = self.groups.seconds(group)
        if seconds is not None:
            record = {"session": job.session, "all_cpu_seconds": round(seconds, 1)}
            self.durations.parent.mkdir(parents=True, exist_ok=True)
            with self.durations.open("a") as out:
                out.write(json.dumps(record) + "\n")
        left = self.groups.left(group)
        if left:
            names = []
            for pid in left[:8]:
                with contextlib.suppress(OSError):
                    names.append(f"{pid} {Path(f'/proc/{pid}/comm').read_text().strip()}")
            self.say(f"{job.session} left {len(left)} processes running: {', '.join(names)}")

    def run(
        self, jobs: list[Job], alone: list[Job], beside: dict[str, set[str]] | None = None
    ) -> None:
        """``jobs`` in lanes, then ``alone`` one by one. A session named in ``beside`` runs
        only while no session outside its set runs (and none outside it starts)."""
        beside = beside or {}
        pending = list(jobs)
        running: set[str] = set()
        changed = threading.Condition()

        def fits(name: str) -> bool:
            return all(
                (name not in beside or other in beside[name])
                and (other not in beside or name in beside[other])
                for other in running
            )

        def lane() -> None:
            while True:
                with changed:
                    while True:
                        if not pending:
                            return
                        job = next((j for j in pending if fits(j.session)), None)
                        if job is not None:
                            pending.remove(job)
                            running.add(job.session)
                            break
                        changed.wait()  # until a session ends
                try:
                    self.run_one(job)
                finally:
                    with changed:
                        running.discard(job.session)
                        changed.notify_all()

        threads = [threading.Thread(target=lane, daemon=True) for _ in range(self.lanes)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for job in alone:
            self.run_one(job)
        self.groups.remove()

    def stop(self) -> None:
        """Stop every session that runs (SIGTERM to its group, SIGKILL after 10 s)."""
        self._stopping.set()
        with self._running_lock:
            procs = [job.proc for job in self._running if job.proc is not None]
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for proc in procs:
                if proc.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, sig)
            deadline = time.monotonic() + 10
            while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
                time.sleep(0.1)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    posargs: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, posargs = argv[:at], argv[at + 1 :]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sessions", nargs="+", help="nox sessions, the longest first")
    parser.add_argument("--lanes", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--alone", action="append", default=[], help="run by itself, last")
    parser.add_argument(
        "--only-beside",
        action="append",
        default=[],
        nargs=2,
        metavar=("SESSION", "OTHER|..."),
        help="SESSION runs in the lanes, but only beside the sessions named ('|' between)",
    )
    parser.add_argument(
        "--nox", default=f"{sys.executable} -m nox", help="the command that runs one session"
    )
    parser.add_argument("--logs", type=Path, default=LOGS, help="where the sessions' logs go")
    parser.add_argument(
        "--durations", type=Path, default=DURATIONS, help="where each session's CPU is added"
    )
    args = parser.parse_args(argv)
    unknown = [name for name in args.alone if name not in args.sessions]
    if unknown:
        parser.error(f"--alone names sessions not in the list: {unknown}")
    beside: dict[str, set[str]] = {}
    for name, others in args.only_beside:
        beside[name] = {other for other in others.split("|") if other}
        unknown = sorted({name, *beside[name]} - set(args.sessions))
        if unknown:
            parser.error(f"--only-beside {name!r} names sessions not in the list: {unknown}")

    def job(name: str) -> Job:
        return Job(name, args.logs / f"{_slug(name)}.log")

    jobs = [job(name) for name in args.sessions if name not in args.alone]
    alone = [job(name) for name in args.sessions if name in args.alone]
    lanes = Lanes(args.nox.split(), posargs, args.lanes, args.durations)

    def interrupted(signum: int, _frame: object) -> None:
        lanes.say(f"signal {signum}: stopping every session")
        lanes.stop()
        lanes.groups.remove()
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGINT, interrupted)
    signal.signal(signal.SIGTERM, interrupted)
    start = time.monotonic()
    lanes.say(f"{len(jobs)} sessions in {lanes.lanes} lanes, then {len(alone)} alone")
    lanes.run(jobs, alone, beside)
    everything = jobs + alone
    failed = [j.session for j in everything if j.status != 0]
    total = sum(j.seconds for j in everything)
    lanes.say(
        f"{len(everything)} sessions, {total:.0f} s of session time in "
        f"{time.monotonic() - start:.0f} s; "
        + (f"failed: {', '.join(failed)}" if failed else "all passed")
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
