"""How fast ``uniagent view`` shows a big run: 10,000 episodes against 100 in the same run.

Run: ``python bench/view.py`` (options: ``--episodes 10000 --baseline 100 --repeats 5
--requests 40 --browser``). Needs ``uniagent[view]``; ``--browser`` also needs Playwright
and Chromium (``/usr/bin/chromium`` or ``$UNIAGENT_CHROMIUM``).

The run folders are synthetic but shaped like ``uniagent run``'s: a manifest, one results
line per episode with a realistic payload (a 2-4 KB patch, a SWE-style test report of 60
tests and a 2 KB log tail, so the results file is ~60 MB at 10,000 episodes), a summary,
and every episode folder with its four files.

What is timed (wall clock; medians and 90th percentiles over the repeats):

- **cold start**: from launching ``uniagent view`` to the first page of the runs table
  (50 rows) arriving over HTTP; "index" is the part after the server said it listens.
- **first page**: ``GET /api/runs/0/episodes?limit=50`` on a running server, plus the
  same sorted by reward, filtered by a task-id search, the summary, and one episode.
- **browser** (``--browser``): headless Chromium from navigation to 50 rows on screen.
- **poll**: one ``RunFolder.refresh()`` with nothing new (what the live view costs each
  tick), finished and while running (10,000 planned jobs, half done, none started).

The "ratio" column divides the big run's median by the baseline run's: 1.0 means the
size does not matter; 100 means linear in episodes. The goal: first page < 1 s at 10,000.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from uniagent.run.layout import LOG, MANIFEST, MESSAGES, RESULT, RESULTS, SUMMARY, episode_path

EXITS = ["finished"] * 14 + ["max_step_limit"] * 3 + ["format_error", "timeout_error", "env_error"]
TOOLS = ["execute_bash", "str_replace_editor", "submit"]


def make_run(root: Path, episodes: int, *, finished: bool = True, seed: int = 0) -> Path:
    """A run folder of ``episodes`` episodes (4 samples per task)."""
    rng = random.Random(seed)
    root.mkdir(parents=True)
    n = 4
    tasks = [f"repo__project-{i:05d}" for i in range(episodes // n)]
    jobs = [[t, s] for t in tasks for s in range(n)]
    manifest = {
        "run_id": "bench",
        "started_at": "2026-01-01T00:00:00+00:00",
        "n": n,
        "pid": 0,
        "host": "elsewhere",
        "jobs": jobs,
    }
    (root / MANIFEST).write_text(json.dumps(manifest))
    done = jobs if finished else jobs[: len(jobs) // 2]
    lines = []
    for task, sample in done:
        reward = float(rng.random() < 0.3)
        patch = "".join(
            f"diff --git a/src/m{k}.py b/src/m{k}.py\n@@ -1,3 +1,3 @@\n"
            + f"-    x = {k}\n+    x = {k + 1}\n"
            + "     context line of the file\n" * rng.randint(20, 50)
            for k in range(2)
        )
        tests = [f"tests/test_mod.py::test_case_{k}" for k in range(60)]
        info = {
            "resolution_status": "FULL" if reward else "NO",
            "tests_status": {
                "FAIL_TO_PASS": {
                    "success": tests[:3] if reward else [],
                    "failure": [] if reward else tests[:3],
                },
                "PASS_TO_PASS": {"success": tests[3:], "failure": []},
            },
            "log_tail": "collected 60 items\n" + "." * 2000,
        }
        folder = episode_path(root, task, sample)
        record = {
            "task_id": task,
            "sample": sample,
            "exit_reason": rng.choice(EXITS),
            "traj_masked": False,
            "reward": reward,
            "reward_info": info,
            "submission": patch,
            "error": None,
            "metrics": {
                "turns": rng.randint(3, 40),
                "tool_calls": {t: rng.randint(0, 12) for t in TOOLS},
                "format_errors": rng.randint(0, 2),
                "syntax_errors": 0,
                "timeouts": 0,
                "setup_seconds": rng.uniform(2, 20),
                "model_seconds": rng.uniform(10, 300),
                "env_seconds": rng.uniform(1, 60),
                "reward_seconds": rng.uniform(5, 90),
            },
            "episode_dir": str(folder),
        }
        folder.mkdir(parents=True)
        (folder / RESULT).write_text(json.dumps(record))
        (folder / MESSAGES).write_text(json.dumps([{"role": "user", "content": "fix it"}]))
        (folder / LOG).write_text("start\nfinished\n")
        lines.append(json.dumps(record))
    (root / RESULTS).write_text("\n".join(lines) + "\n")
    if finished:
        (root / SUMMARY).write_text(json.dumps({"episodes": len(done), "samples_per_task": n}))
    return root


def start(run: Path) -> tuple[subprocess.Popen[str], str, float]:
    """Launch ``uniagent view``; return it, its address and when it said it listens."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "uniagent.cli", "view", str(run), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout], daemon=True).start()
    while True:
        line = lines.get(timeout=300)
        if "serving http://" in line:
            return proc, line.split("serving ", 1)[1].split()[0], time.perf_counter()


def stop(proc: subprocess.Popen[str]) -> None:
    proc.terminate()
    proc.wait(timeout=30)


def cold(run: Path) -> tuple[float, float]:
    """Seconds from launch to the first page, and from listening to the first page."""
    launched = time.perf_counter()
    proc, url, listening = start(run)
    try:
        response = httpx.get(url + "api/runs/0/episodes", params={"limit": 50}, timeout=120)
        response.raise_for_status()
        done = time.perf_counter()
    finally:
        stop(proc)
    return done - launched, done - listening


def timed(fn: Callable[[], object], repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def warm(url: str, requests: int, key: str) -> dict[str, list[float]]:
    client = httpx.Client(base_url=url, timeout=120)

    def get(path: str, **params: object) -> Callable[[], object]:
        return lambda: client.get(path, params=params).raise_for_status()

    cases = {
        "first page": get("/api/runs/0/episodes", limit=50),
        "sorted by reward": get("/api/runs/0/episodes", limit=50, sort="reward", order="desc"),
        "task-id search": get("/api/runs/0/episodes", limit=50, q="project-004"),
        "summary": get("/api/runs/0/summary"),
        "an episode": get("/api/runs/0/episode", key=key),
    }
    for fn in cases.values():  # one untimed request each
        fn()
    return {name: timed(fn, requests) for name, fn in cases.items()}


def browser(url: str, repeats: int) -> list[float]:
    from playwright.sync_api import sync_playwright

    from uniagent.testing.browser import launch_chromium

    out = []
    with sync_playwright() as p:
        b = launch_chromium(p)
        for i in range(repeats + 1):
            page = b.new_context().new_page()
            t = time.perf_counter()
            page.goto(url)
            page.locator("#runs-table tbody tr").nth(49).wait_for()
            if i:  # the first one warms Chromium's caches
                out.append(time.perf_counter() - t)
            page.context.close()
        b.close()
    return out


def poll(run: Path, repeats: int) -> list[float]:
    from uniagent.view.rundir import RunFolder

    folder = RunFolder(run)
    return timed(folder.refresh, repeats)


def stats(xs: list[float]) -> tuple[float, float]:
    xs = sorted(xs)
    return statistics.median(xs), xs[min(len(xs) - 1, int(0.9 * len(xs)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=10_000)
    parser.add_argument("--baseline", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=5, help="cold starts per run size")
    parser.add_argument("--requests", type=int, default=40, help="timed requests per case")
    parser.add_argument("--browser", action="store_true", help="also time Chromium")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="uniagent-bench-view-") as tmp:
        t = time.perf_counter()
        runs = {
            size: make_run(Path(tmp) / f"run{size}", size)
            for size in (args.baseline, args.episodes)
        }
        live = make_run(Path(tmp) / "live", args.episodes, finished=False, seed=1)
        mb = (runs[args.episodes] / RESULTS).stat().st_size / 1e6
        print(
            f"made the run folders in {time.perf_counter() - t:.1f} s "
            f"(results.jsonl of {args.episodes} episodes: {mb:.0f} MB)\n"
        )
        rows: list[tuple[str, dict[int, tuple[float, float]]]] = []

        colds = {s: [cold(r) for _ in range(args.repeats)] for s, r in runs.items()}
        rows.append(
            (
                "cold start: launch to first page",
                {s: stats([c[0] for c in v]) for s, v in colds.items()},
            )
        )
        rows.append(
            (
                "  after it listens: first page",
                {s: stats([c[1] for c in v]) for s, v in colds.items()},
            )
        )
        results: dict[int, dict[str, list[float]]] = {}
        browsers: dict[int, list[float]] = {}
        for size, run in runs.items():
            proc, url, _ = start(run)
            try:
                results[size] = warm(url, args.requests, "episodes/repo__project-00000/0")
                if args.browser:
                    browsers[size] = browser(url, args.repeats)
            finally:
                stop(proc)
        for name in results[args.episodes]:
            rows.append((name, {s: stats(results[s][name]) for s in runs}))
        if args.browser:
            rows.append(
                ("browser: navigate to 50 rows shown", {s: stats(browsers[s]) for s in runs})
            )
        rows.append(
            ("poll, finished run", {s: stats(poll(r, args.requests)) for s, r in runs.items()})
        )
        live_poll = stats(poll(live, args.requests))

    big, small = args.episodes, args.baseline
    print(f"{'':38} {f'{small} episodes':>18} {f'{big} episodes':>18} {'ratio':>7}")
    print(f"{'':38} {'median    p90':>18} {'median    p90':>18}")
    for name, by in rows:
        ratio = by[big][0] / by[small][0] if by[small][0] else float("nan")
        print(f"{name:38} {cell(by[small]):>18} {cell(by[big]):>18} {ratio:7.1f}")
    print(f"{'poll, running (half done, none started)':38} {'':>18} {cell(live_poll):>18}")
    first = dict(rows)["first page"][big][0]
    start_to_page = dict(rows)["cold start: launch to first page"][big][0]
    print(
        f"\nfirst page at {big} episodes: {fmt(first)} on a running server "
        f"({'under' if first < 1 else 'OVER'} 1 s); {fmt(start_to_page)} from launch"
    )


def cell(median_p90: tuple[float, float]) -> str:
    return f"{fmt(median_p90[0])} {fmt(median_p90[1])}"


def fmt(seconds: float) -> str:
    return f"{seconds * 1000:6.1f}ms" if seconds < 1 else f"{seconds:6.2f}s "


if __name__ == "__main__":
    main()
