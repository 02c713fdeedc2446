# ruff: noqa: E402 - imports follow the sys.path fix below
"""Sandbox benchmark: command round trips and many concurrent host sessions.

    python bench/sandbox.py                       # everything (about 2-3 minutes)
    python bench/sandbox.py --sessions 1,64 --rounds 100

Round trip of ``echo hi`` (median and p95) through: uniagent's host runtime
(a persistent async bash session), the full ``AgentEnv.run_action`` path, a
command that needs the in-session ``bash -n`` check, a raw ``bash -c``
subprocess, a lone ``bash -n``, SWE-ReX's ``LocalRuntime`` and its
``RemoteRuntime`` against a ``swerex-remote`` started here. Then 1, 64, 256
and 1000 concurrent host sessions in one event loop, without isolation and under
bubblewrap (``--isolation``): start time, command throughput, the runner's own CPU
per command and the shells' (``/proc/PID/schedstat`` of each session's processes),
failures, memory of the bash processes (PSS and RSS) and of this
process per session, and the largest event-loop lag (a 10 ms ticker's worst gap). The
session rows run with the garbage collector set as ``uniagent run`` sets it
(``uniagent.env.many_sandboxes_gc``; ``--gc-threshold 700`` for CPython's default).
SWE-ReX rows need ``pip install 'uniagent[swerex]'``; they are skipped, with a note,
without it.
"""

from __future__ import annotations

import sys

# Running `python bench/sandbox.py` puts bench/ first on sys.path, where a sibling
# script named like a stdlib module (bench/tokenize.py) would shadow it.
sys.path[:] = [p for p in sys.path if not p or not p.rstrip("/").endswith("bench")]

import argparse
import asyncio
import os
import resource
import runpy
import secrets
import shutil
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from uniagent import open_env, procfs
from uniagent.env import AgentEnv, HostDeployment, many_sandboxes_gc, use_pidfd_child_watcher
from uniagent.env.aio import GC_THRESHOLD
from uniagent.env.host import HostDeploymentConfig
from uniagent.env.runtime import BashAction, CreateBashSessionRequest

Row = tuple[str, int, float, float]
BENCH = Path(__file__).resolve().parent


async def timed(name: str, rounds: int, call: Callable[[], Awaitable[object]]) -> Row:
    """Median and p95 of ``call`` in ms, after a few warm-up calls."""
    for _ in range(min(50, rounds)):  # warm up (thread pool, caches, CPU clocks)
        await call()
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        await call()
        samples.append((time.perf_counter() - start) * 1000)
    samples.sort()
    return name, rounds, statistics.median(samples), samples[int(0.95 * (len(samples) - 1))]


async def latency_rows(rounds: int, slow_rounds: int) -> tuple[list[Row], list[str]]:
    rows: list[Row] = []
    notes: list[str] = []
    async with open_env({"type": "host"}) as env:
        runtime = env.runtime
        action = BashAction(command="echo hi", check="silent")
        rows.append(await timed("host runtime (persistent async bash)", rounds,
                                lambda: runtime.run_in_session(action)))  # fmt: skip
        rows.append(await timed("AgentEnv.run_action, host", rounds,
                                lambda: env.run_action("echo hi")))  # fmt: skip
        checked = BashAction(command="if true; then echo hi; fi", check="silent")
        rows.append(await timed("host runtime, `if ...; fi` (in-session bash -n)", rounds,
                                lambda: runtime.run_in_session(checked)))  # fmt: skip
    if shutil.which("bwrap"):
        async with open_env({"type": "host", "isolation": "bwrap"}) as env:
            rows.append(await timed("AgentEnv.run_action, host + bwrap", rounds,
                                    lambda: env.run_action("echo hi")))  # fmt: skip

    async def bash_c() -> None:
        proc = await asyncio.create_subprocess_exec(
            "bash", "-c", "echo hi", stdout=asyncio.subprocess.PIPE
        )
        await proc.communicate()

    async def bash_n() -> None:
        proc = await asyncio.create_subprocess_exec(
            "bash", "-n", stdin=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        await proc.communicate(b"if true; then echo hi; fi")

    rows.append(await timed("raw `bash -c` subprocess per command", rounds, bash_c))
    rows.append(await timed("`bash -n` subprocess (a syntax check alone)", rounds, bash_n))
    try:
        rows += await swerex_rows(slow_rounds)
    except ImportError as exc:
        notes.append(f"SWE-ReX rows skipped ({exc}): pip install 'uniagent[swerex]'")
    return rows, notes


async def swerex_rows(rounds: int) -> list[Row]:
    from swerex.runtime.abstract import BashAction as RexAction
    from swerex.runtime.abstract import CreateBashSessionRequest as RexCreate
    from swerex.runtime.local import LocalRuntime
    from swerex.runtime.remote import RemoteRuntime

    from uniagent.env.remote import make_runtime, wait_until_alive

    rows = []
    local = LocalRuntime()
    await local.create_session(RexCreate())
    rows.append(await timed("SWE-ReX LocalRuntime (pexpect; blocks the loop)", rounds,
                            lambda: local.run_in_session(RexAction(command="echo hi",
                                                                   check="silent"))))  # fmt: skip
    await local.close()

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    token = secrets.token_hex(8)
    exe = shutil.which("swerex-remote", path=os.path.dirname(sys.executable)) or "swerex-remote"
    server = subprocess.Popen(
        [exe, "--host", "127.0.0.1", "--port", str(port), "--auth-token", token],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        ours = make_runtime(host="127.0.0.1", port=port, auth_token=token)
        await wait_until_alive(ours, 60, "swerex-remote")
        await ours.create_session(CreateBashSessionRequest())
        upstream = RemoteRuntime(host="http://127.0.0.1", port=port, auth_token=token)
        action = BashAction(command="echo hi", check="silent")
        rows.append(await timed("SWE-ReX RemoteRuntime -> swerex-remote", rounds,
                                lambda: upstream.run_in_session(action)))  # fmt: skip
        rows.append(await timed("uniagent remote runtime -> swerex-remote", rounds,
                                lambda: ours.run_in_session(action)))  # fmt: skip
    finally:
        server.terminate()
        server.wait(10)
    return rows


def memory_kib(pids: list[int]) -> tuple[int, int]:
    """Summed PSS and RSS (KiB) of ``pids``."""
    pss = rss = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    pss += int(line.split()[1])
                elif line.startswith("Rss:"):
                    rss += int(line.split()[1])
        except OSError:
            continue
    return pss, rss


def tree_cpu_s(pids: list[int]) -> float:
    """CPU seconds so far (``/proc/PID/schedstat``) of ``pids`` and everything they started
    that still runs (a bubblewrap sandbox's shell is a child of its ``bwrap``)."""
    total = 0
    for pid in {p for root in pids if root for p in procfs.subtree(root)}:
        try:
            with open(f"/proc/{pid}/schedstat") as stat:
                total += int(stat.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # ended meanwhile, or no schedstat here
    return total / 1e9


def own_rss_kib() -> int:
    """This process's resident memory (KiB)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


async def concurrent(n: int, commands: int, isolation: str = "auto") -> dict[str, Any]:
    """``n`` host envs in this loop (``isolation``), ``commands`` commands each, with a lag
    ticker."""
    gaps: list[tuple[float, float]] = []  # (when, how late the 10 ms tick came)
    done = asyncio.Event()

    async def ticker() -> None:
        last = time.perf_counter()
        while not done.is_set():
            await asyncio.sleep(0.01)
            now = time.perf_counter()
            gaps.append((now, now - last - 0.01))
            last = now

    def lag_ms(since: float, until: float) -> float:
        return 1000 * max((g for t, g in gaps if since <= t <= until), default=0.0)

    tick = asyncio.create_task(ticker())
    rss_before = own_rss_kib()
    config = HostDeploymentConfig(isolation=isolation)  # type: ignore[arg-type]
    envs = [AgentEnv(HostDeployment(config)) for _ in range(n)]
    t0 = time.perf_counter()
    results = await asyncio.gather(*(e.start() for e in envs), return_exceptions=True)
    t1 = time.perf_counter()
    failures = sum(isinstance(r, BaseException) for r in results)
    live = [e for e, r in zip(envs, results) if not isinstance(r, BaseException)]
    pids = [e.deployment.runtime.sessions["default"].pid for e in live]  # type: ignore[attr-defined]
    pss, rss = memory_kib([p for p in pids if p])
    runner_kib = (own_rss_kib() - rss_before) / max(1, len(live))

    async def work(env: AgentEnv) -> int:
        bad = 0
        for i in range(commands):
            obs = await env.run_action(f"echo {i}")
            bad += obs.output != f"{i}\n"
        return bad

    # (thousands of /proc files: on a thread, so the lag ticker goes on)
    shells2 = await asyncio.to_thread(tree_cpu_s, pids)
    t2, cpu2 = time.perf_counter(), time.process_time()
    outcomes = await asyncio.gather(*(work(e) for e in live), return_exceptions=True)
    t3, cpu3 = time.perf_counter(), time.process_time()
    shells3 = await asyncio.to_thread(tree_cpu_s, pids)
    failures += sum(o if isinstance(o, int) else commands for o in outcomes)
    await asyncio.gather(*(e.close() for e in envs))
    t4 = time.perf_counter()
    await asyncio.sleep(0.05)
    done.set()
    await tick
    lags = {"start": lag_ms(t0, t1), "run": lag_ms(t2, t3), "close": lag_ms(t3, t4 + 0.05)}
    return {
        "isolation": isolation, "sessions": n, "start_s": t1 - t0,
        "throughput": len(live) * commands / (t3 - t2),
        "runner_cpu_ms_per_command": 1000 * (cpu3 - cpu2) / max(1, len(live) * commands),
        "shells_cpu_ms_per_command": 1000 * (shells3 - shells2) / max(1, len(live) * commands),
        "failures": failures, "pss_mib": pss / 1024 / max(1, len(pids)),
        "rss_mib": rss / 1024 / max(1, len(pids)), "close_s": t4 - t3,
        "runner_kib_per_session": runner_kib,
        "lag": "/".join(f"{v:.0f}" for v in lags.values()), "lag_ms": lags,
    }  # fmt: skip


def raise_fd_limit(sessions: int) -> str:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # per session: 2 sockets, a pipe, a pty, a pidfd, a mount namespace (bwrap); plus headroom
    need = 7 * sessions + 200
    if soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(need, soft)), hard))
    new = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return f"open files: soft limit {soft} -> {new} (hard {hard}, need about {need})"


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=500, help="round trips per fast row")
    parser.add_argument("--slow-rounds", type=int, default=30, help="round trips per SWE-ReX row")
    parser.add_argument("--sessions", default="1,64,256,1000", help="concurrency levels")
    parser.add_argument("--commands", type=int, default=20, help="commands per session")
    parser.add_argument(
        "--isolation",
        default="none,bwrap",
        help="the session rows' host isolation, a comma list (bwrap rows only where it works)",
    )
    parser.add_argument(
        "--gc-threshold",
        type=int,
        default=GC_THRESHOLD,
        help="the young generation's collection threshold during the session rows, as "
        f"`uniagent run` sets it (default {GC_THRESHOLD}; 700: CPython's own)",
    )
    parser.add_argument(
        "--json", type=Path, metavar="FILE", help="also write the figures to FILE as JSON"
    )
    args = parser.parse_args()
    figures = runpy.run_path(str(BENCH / "figures.py"))  # bench/ is kept off sys.path
    where = figures["provenance"]()
    levels = [int(x) for x in args.sessions.split(",") if x]
    print(raise_fd_limit(max(levels, default=1)))
    print(f"pidfd child watching: {use_pidfd_child_watcher()}; python {sys.version.split()[0]}; "
          f"{os.cpu_count()} CPUs")  # fmt: skip

    rows, notes = await latency_rows(args.rounds, args.slow_rounds)
    print(f"\n{'round trip of `echo hi`':52} {'n':>5} {'median ms':>10} {'p95 ms':>9}")
    for name, n, median, p95 in rows:
        print(f"{name:52} {n:>5} {median:>10.3f} {p95:>9.3f}")
    base = next((r[2] for r in rows if r[0].startswith("host runtime (")), None)
    rex = next((r[2] for r in rows if r[0].startswith("SWE-ReX LocalRuntime")), None)
    if base and rex:
        print(f"host runtime vs SWE-ReX LocalRuntime: {rex / base:.0f}x faster (median)")
    for note in notes:
        print("note:", note)

    isolations = [x for x in args.isolation.split(",") if x]
    if "bwrap" in isolations and not shutil.which("bwrap"):
        isolations.remove("bwrap")
        print("note: no bwrap on PATH: its session rows are left out")
    print(f"\n{'isolation':>9} {'sessions':>8} {'start s':>8} {'cmd/s':>9} {'CPU ms/cmd':>10} "
          f"{'shells ms':>9} "
          f"{'failures':>8} {'PSS MiB':>8} {'RSS MiB':>8} {'KiB/ses':>8} {'close s':>8} "
          f"{'max loop lag ms start/run/close':>32}")  # fmt: skip
    sessions = []
    for isolation, n in ((i, n) for i in isolations for n in levels):
        with many_sandboxes_gc(args.gc_threshold):  # as `uniagent run` drives its sandboxes
            r = await concurrent(n, args.commands, isolation)
        sessions.append(r)
        print(f"{isolation:>9} {n:>8} {r['start_s']:>8.2f} {r['throughput']:>9.0f} "
              f"{r['runner_cpu_ms_per_command']:>10.3f} "
              f"{r['shells_cpu_ms_per_command']:>9.3f} {r['failures']:>8} "
              f"{r['pss_mib']:>8.2f} {r['rss_mib']:>8.2f} {r['runner_kib_per_session']:>8.0f} "
              f"{r['close_s']:>8.2f} "
              f"{r['lag']:>32}")  # fmt: skip
    print(
        "(PSS/RSS: per bash process; KiB/ses: what this process's resident memory grew by "
        "per live session (a row after a larger one reuses its memory: near 0); throughput: "
        "commands/s across all sessions; CPU ms/cmd: this process's CPU per command while "
        "the commands run, the shells' not counted; shells ms: the sessions' own processes' "
        "CPU per command (bash, and bwrap's where isolated); garbage collection of the young "
        f"generation every {args.gc_threshold} allocations)"
    )
    if args.json:
        latency = [{"name": name, "n": n, "median_ms": median, "p95_ms": p95}
                   for name, n, median, p95 in rows]  # fmt: skip
        figures["write"](args.json, "bench/sandbox.py", args, where, round_trips=latency,
                      notes=notes, sessions=sessions)  # fmt: skip


if __name__ == "__main__":
    asyncio.run(main())
