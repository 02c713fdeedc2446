# ruff: noqa: E402 - imports follow the sys.path fix below
"""End-to-end episodes: ``uniagent run`` beside mini-swe-agent's runner and a bare floor.

    python bench/run.py                                   # 1, 16, 64, 256 at once; 256 tasks
    python bench/run.py --concurrency 16,64 --tasks 128 --repeats 3

One scripted OpenAI-compatible server on 127.0.0.1 (``ScriptedChatServer`` in its
own process, instant replies) plays a fixed 6-turn script per task: five shell
commands, then the finish (uniagent's ``submit`` tool; for the others a command
printing ``COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT``, mini-swe-agent's convention).
The same tasks and server serve, at each concurrency, in turn:

- ``floor``: ``bench/floor.py``, a minimal asyncio loop (HTTP call, ``bash -c`` per
  command, nothing else);
- ``uniagent``: ``uniagent run`` on the host backend without isolation (as the
  floor runs; ``--isolation bwrap`` puts every uniagent row under bubblewrap, where
  the child CPU column misses what runs in the sandboxes: their PID namespace's
  init reaps those processes, not the runner; compare such rows by ep/s and by the
  machine's busy CPU, ``mach ms``, on a quiet machine), with
  its defaults otherwise (per-sandbox cgroup and tmpfs where root allows, tools
  installed, results and episode files written, no reward);
- ``uniagent+reward``: the same with the built-in ``command`` reward graded in the
  episode's sandbox (the grader's baseline before the first turn, grading after), every
  integrity defence on (history scrub, ``tests/`` protected, toolchain check), in a git
  checkout made by ``post_setup`` (a local clone of a synthetic repository: 10 files and
  one commit, or ``--repo-size FILES:COMMITS``, a comma list to compare sizes in one run);
- ``uniagent+fresh``: the same graded with ``grade_in: fresh`` (the patch applied in a
  fresh sandbox of the task, started while the agent works); both rows' test command is
  ``test -s note.txt`` (no Python: the status channel records no run), or
  ``--test-command`` (``python3 -m unittest tests.test_note`` runs the repository's test);
- ``...+warm`` (any uniagent row, e.g. ``uniagent+reward+warm``): the same with
  ``--warm N`` (``--warm``, default 8): sandboxes set up and baselined ahead while the
  agents run; worth measuring with ``--model-latency SECONDS`` (each reply waits that
  long, as a model's generation would; by default replies are instant);
- ``mini-swe-agent``: its batch runner (``mini-extra swebench`` 2.4.6, local
  environment: ``bash -c`` per command, one thread per worker) in a venv the bench
  makes (``bench/.venv-mini``, ``pip install mini-swe-agent==2.4.6``).

Each runner is its own process, started through a small wrapper that records at
exit its own CPU (``RUSAGE_SELF``), the CPU of the processes it started and waited
for (``RUSAGE_CHILDREN``: sandboxes, commands), its peak RSS, and for asyncio
runners the event-loop lag (a 10 ms ticker's lateness: p99 and worst). Printed
per concurrency: episodes/s, runner CPU per episode, started processes' CPU per
episode, their total, peak memory, loop lag, and the ratios to the floor; then
uniagent's per-episode split for each of its rows (medians over episodes, from its
results: setup, tools, baseline, agent loop, of which model wait and env, grading, of
which the fresh sandbox's set-up and the reward itself, close); and the reward command's
own CPU and wall time, run alone in a checkout of each repository size.
"""

from __future__ import annotations

import sys

# Running `python bench/run.py` puts bench/ first on sys.path, where a sibling
# script named like a stdlib module (bench/tokenize.py) would shadow it.
sys.path[:] = [p for p in sys.path if not p or not p.rstrip("/").endswith("bench")]

import argparse
import json
import os
import runpy
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
MINI_VENV = BENCH / ".venv-mini"
MINI = "mini-swe-agent==2.4.6"
TURNS = 6
COMMANDS = (
    "ls -la",
    "echo hello > note.txt && cat note.txt",
    "grep -c root /etc/passwd",
    "printf '%s\\n' delta alpha charlie bravo | sort",
    "wc -c note.txt",
)
DONE = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"

#: Runs a module or script in this process and writes its resource use at exit.
WRAPPER = r"""
import asyncio, atexit, json, os, resource, runpy, sys, time
out, target, args = sys.argv[1], sys.argv[2], sys.argv[3:]
lags, started = [], time.monotonic()
def dump():
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    with open(out, "w") as f:
        json.dump({"self_cpu": me.ru_utime + me.ru_stime,
                   "children_cpu": kids.ru_utime + kids.ru_stime,
                   "self_maxrss_kb": me.ru_maxrss, "wall": time.monotonic() - started,
                   "lags": sorted(lags)}, f)
atexit.register(dump)
real_run = asyncio.run
def run_with_probe(main, **kwargs):
    async def probe():
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + 0.01
            await asyncio.sleep(0.01)
            lags.append(loop.time() - due)
    async def wrapped():
        ticker = asyncio.ensure_future(probe())
        try:
            return await main
        finally:
            ticker.cancel()
    return real_run(wrapped(), **kwargs)
asyncio.run = run_with_probe
sys.argv = [target, *args]
try:
    if target.endswith(".py"):
        runpy.run_path(target, run_name="__main__")
    else:
        runpy.run_module(target, run_name="__main__", alter_sys=True)
except SystemExit as exc:
    if exc.code not in (None, 0):
        raise
"""


def script(body: dict[str, Any]) -> Any:
    """The server's reply: turn k (from the history) of the fixed script, in the asker's tools."""
    from uniagent.testing import Reply, tool_call

    turn = sum(1 for m in body["messages"] if m.get("role") == "assistant")
    names = {t["function"]["name"] for t in body.get("tools") or []}
    bash = "execute_bash" if "execute_bash" in names else "bash"
    if turn < TURNS - 1:
        return Reply("", tool_calls=[tool_call(bash, {"command": COMMANDS[turn]}, f"call_{turn}")])
    if "submit" in names:
        return Reply("", tool_calls=[tool_call("submit", {}, "call_submit")])
    return Reply("", tool_calls=[tool_call(bash, {"command": DONE}, "call_done")])


def serve(url_file: Path, latency: float = 0.0) -> None:
    """Run the scripted server until killed; its URL goes to ``url_file``. Each reply waits
    ``latency`` seconds first (a model's generation time; the server answers requests in
    threads, so they wait side by side)."""
    from uniagent.testing import ScriptedChatServer

    def slow(body: dict[str, Any]) -> Any:
        time.sleep(latency)
        return script(body)

    with ScriptedChatServer(default=slow if latency else script, model="scripted") as server:
        url_file.write_text(server.base_url)
        while True:
            time.sleep(3600)


def mini_python() -> Path:
    """The interpreter of the venv holding mini-swe-agent (made on first use)."""
    python = MINI_VENV / "bin" / "python"
    if not python.exists():
        print(f"making {MINI_VENV} with {MINI} (once) ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(MINI_VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", MINI], check=True)
    return python


#: The reward rows' test command by default (the scripted agent writes note.txt); starts no
#: Python, so the status channel has no run to record (``--test-command`` to run one, e.g.
#: ``python3 -m unittest tests.test_note``).
TEST_COMMAND = "test -s note.txt"
REWARD_RUNNERS = ("uniagent+reward", "uniagent+fresh")
#: The synthetic repository's tests/ (a protected path of the reward rows).
NOTE_TEST = """import os
import unittest


class Note(unittest.TestCase):
    def test_note(self):
        self.assertTrue(os.path.getsize("note.txt"))
"""


def repo_sizes(text: str) -> list[tuple[int, int]]:
    """``FILES:COMMITS[,FILES:COMMITS...]`` as pairs (an error naming the bad one)."""
    sizes = []
    for item in text.split(","):
        files, sep, commits = item.partition(":")
        if not (sep and files.isdigit() and commits.isdigit() and min(int(files), int(commits))):
            raise SystemExit(f"--repo-size: {item!r} is not FILES:COMMITS (both at least 1)")
        sizes.append((int(files), int(commits)))
    return sizes


def make_repo(path: Path, files: int, commits: int) -> None:
    """A git repository of ``files`` Python files (about 2 KB each, in 50 folders) and
    ``tests/test_note.py``, with ``commits`` commits (each after the first changes three
    files), written in one ``git fast-import``; a tag and a side branch in the history."""
    import random

    rng = random.Random(0)
    names = [f"pkg{i % 50:02d}/mod{i:05d}.py" for i in range(files)]
    chunks: list[bytes] = []

    def data(text: str) -> None:
        raw = text.encode()
        chunks.append(b"data %d\n%s\n" % (len(raw), raw))

    for c in range(commits):
        chunks.append(b"commit refs/heads/main\ncommitter bench <b@b> %d +0000\n" % (10**9 + c))
        data(f"commit {c}")
        touched = range(files) if c == 0 else [rng.randrange(files) for _ in range(3)]
        for i in touched:
            body = "".join(f"def f{i}_{j}_{c}(x):\n    return x + {rng.randrange(10**9)}\n"
                           for j in range(40))  # fmt: skip
            chunks.append(f"M 100644 inline {names[i]}\n".encode())
            data(body)
        if c == 0:
            chunks.append(b"M 100644 inline tests/test_note.py\n")
            data(NOTE_TEST)
        if c == max(0, commits - 2):
            chunks.append(b"reset refs/tags/v-old\nfrom refs/heads/main\n\n")
    subprocess.run(["git", "init", "-q", "-b", "main", str(path)], check=True)
    subprocess.run(["git", "-C", str(path), "fast-import", "--quiet"], input=b"".join(chunks),
                   check=True)  # fmt: skip
    subprocess.run(["git", "-C", str(path), "checkout", "-q", "main"], check=True)
    subprocess.run(["git", "-C", str(path), "branch", "side", "v-old"], check=True)


def command_cost(
    repo: Path, work: Path, runs: int = 20, command: str = TEST_COMMAND
) -> dict[str, float]:
    """The reward command alone, in a clone of ``repo`` with note.txt (``bash -c``, as the
    grader's shell runs it): median wall ms and mean CPU ms of ``runs`` runs."""
    import resource

    checkout = Path(tempfile.mkdtemp(prefix="command-", dir=work))
    subprocess.run(["git", "clone", "-q", str(repo), str(checkout / "r")], check=True)
    (checkout / "r" / "note.txt").write_text("hello\n")
    walls = []
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run(
            ["bash", "--norc", "-c", command], cwd=checkout / "r", check=True,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        walls.append(time.perf_counter() - started)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    shutil.rmtree(checkout, ignore_errors=True)
    return {"wall_ms": statistics.median(walls) * 1000, "cpu_ms": cpu / runs * 1000}


def write_inputs(
    work: Path,
    tasks: int,
    repos: dict[str, Path] | None = None,
    isolation: str = "none",
    test_command: str = TEST_COMMAND,
) -> dict[str, Path]:
    """Tasks (JSONL, and a dataset folder for mini-swe-agent) and uniagent's configs (host
    sandboxes with ``isolation``; under bwrap the reward rows' repository bound read-only)."""
    rows = [
        {"instance_id": f"task-{i:04d}", "problem_statement": f"Task {i}: look around, then stop.",
         "test_command": test_command}
        for i in range(tasks)
    ]  # fmt: skip
    text = "".join(json.dumps(r) + "\n" for r in rows)
    (work / "tasks.jsonl").write_text(text)
    (work / "dataset").mkdir(exist_ok=True)
    (work / "dataset" / "train.jsonl").write_text(text)
    base = (
        "tool_parser: hermes\n"
        "tools: [execute_bash, submit]\n"
        "instance_template: '{problem_statement}'\n"
        "interaction: {max_turns: 10}\n"
    )
    deployment = f"env:\n  deployment: {{type: host, isolation: {isolation}}}\n"
    (work / "uniagent.yaml").write_text(base + deployment)
    for label, repo in (repos or {}).items():
        binds = f", ro_binds: [{json.dumps(str(repo))}]" if isolation != "none" else ""
        checkout = (
            f"env:\n  deployment: {{type: host, isolation: {isolation}{binds}}}\n"
            f"  post_setup: [{json.dumps(f'git clone -q {repo} .')}]\n"
        )
        for runner, grade_in in zip(REWARD_RUNNERS, ("episode", "fresh"), strict=True):
            (work / f"{runner}-{label}.yaml").write_text(
                base + checkout + f"reward:\n  name: command\n  grade_in: {grade_in}\n"
                "  integrity: {scrub_history: true, protect_paths: [tests/]}\n"
            )
    return {"tasks": work / "tasks.jsonl", "dataset": work / "dataset"}


def command(
    runner: str, work: Path, url: str, concurrency: int, out: Path, warm: int = 0
) -> list[str]:
    """The command line of one runner (a reward runner is ``RUNNER FILES:COMMITS``; a
    uniagent runner named ``...+warm`` prepares ``warm`` sandboxes ahead)."""
    if runner.startswith("uniagent"):
        name, _, size = runner.partition(" ")
        ahead = ["--warm", str(warm)] if name.endswith("+warm") else []
        name = name.removesuffix("+warm")
        config = work / (f"{name}-{size}.yaml" if size else "uniagent.yaml")
        return [
            sys.executable,
            "-c",
            WRAPPER,
            str(out / "usage.json"),
            "uniagent.cli",
            "run",
            str(config),
            "--data",
            str(work / "tasks.jsonl"),
            "--model",
            f"openai:{url}#scripted",
            "--out",
            str(out),
            "--concurrency",
            str(concurrency),
            *ahead,
        ]
    if runner == "floor":
        return [
            sys.executable,
            "-c",
            WRAPPER,
            str(out / "usage.json"),
            str(BENCH / "floor.py"),
            str(work / "tasks.jsonl"),
            url,
            "scripted",
            str(concurrency),
        ]
    cwd = out / "cwd"
    cwd.mkdir(parents=True, exist_ok=True)
    return [str(mini_python()), "-c", WRAPPER, str(out / "usage.json"),
            "minisweagent.run.utilities.mini_extra", "swebench",
            "--subset", str(work / "dataset"), "--split", "train", "-o", str(out / "mini"),
            "-w", str(concurrency), "-m", "openai/scripted",
            "-c", "swebench.yaml", "-c", "environment.environment_class=local",
            "-c", f"environment.cwd={cwd}", "-c", f"model.model_kwargs.api_base={url}",
            "-c", "model.cost_tracking=ignore_errors", "-c", "agent.cost_limit=0"]  # fmt: skip


def finished(runner: str, out: Path, tasks: int, stdout: str) -> int:
    """How many episodes ended as the script intends (all six turns, then the finish)."""
    if runner.startswith("uniagent"):
        records = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
        graded = " " in runner  # a reward runner: the fix (note.txt) scores 1
        return sum(
            1
            for r in records
            if r["exit_reason"] == "finished"
            and r["metrics"]["turns"] == TURNS
            and (not graded or r["reward"] == 1.0)
        )
    if runner == "floor":
        report = json.loads(stdout.strip().splitlines()[-1])
        return report["episodes"] if report["turns"] == TURNS * report["episodes"] else 0
    statuses = list((out / "mini").glob("exit_statuses_*.yaml"))
    text = statuses[0].read_text() if statuses else ""
    return text.count("- task-")  # listed under `Submitted:` (the only status they reach)


def uniagent_split(out: Path) -> dict[str, float]:
    """Medians per episode (ms) of uniagent's phases and of model wait and env in the loop."""
    records = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    keys = ("setup", "tools", "baseline", "ready", "agent", "grading", "close")
    split = {k: statistics.median([r["timings"].get(k, 0.0) for r in records]) * 1000
             for k in keys}  # fmt: skip
    for name, key in (("model wait", "model_seconds"), ("env", "env_seconds")):
        split[name] = statistics.median([r["metrics"][key] for r in records]) * 1000
    split["episode"] = statistics.median([r["wall_seconds"] for r in records]) * 1000
    graded = [r["reward_info"].get("integrity", {}) for r in records if r.get("reward_info")]
    for name, key in (("fresh setup", "fresh_setup_seconds"), ("reward", "reward_seconds")):
        if any(key in g for g in graded):
            split[name] = statistics.median([g.get(key, 0.0) for g in graded]) * 1000
    return split


def measure(
    runner: str, work: Path, url: str, concurrency: int, tasks: int, warm: int = 0
) -> dict[str, Any]:
    """Run one runner once; its figures."""
    out = Path(tempfile.mkdtemp(prefix=f"{runner}-{concurrency}-", dir=work))
    env = {**os.environ, "OPENAI_API_KEY": "bench", "MSWEA_COST_TRACKING": "ignore_errors",
           "MSWEA_CONFIGURED": "true", "TMPDIR": str(out)}  # fmt: skip
    started, busy = time.monotonic(), machine_busy()
    done = subprocess.run(command(runner, work, url, concurrency, out, warm), capture_output=True,
                          text=True, env=env, cwd=out, timeout=3600)  # fmt: skip
    wall, busy = time.monotonic() - started, machine_busy() - busy
    if done.returncode != 0:
        raise RuntimeError(f"{runner} at {concurrency} failed:\n{done.stderr[-3000:]}")
    usage = json.loads((out / "usage.json").read_text())
    lags = usage["lags"]
    row = {
        "runner": runner,
        "concurrency": concurrency,
        "tasks": tasks,
        "ok": finished(runner, out, tasks, done.stdout),
        "eps": tasks / wall,
        "self_ms": usage["self_cpu"] / tasks * 1000,
        "children_ms": usage["children_cpu"] / tasks * 1000,
        "rss_mb": usage["self_maxrss_kb"] / 1024,
        "lag_p99": lags[int(0.99 * (len(lags) - 1))] * 1000 if lags else None,
        "lag_max": lags[-1] * 1000 if lags else None,
    }
    row["total_ms"] = row["self_ms"] + row["children_ms"]
    row["machine_ms"] = busy / tasks * 1000
    if runner.startswith("uniagent"):
        row["split"] = uniagent_split(out)
    shutil.rmtree(out, ignore_errors=True)
    return row


def machine_busy() -> float:
    """Seconds of CPU the whole machine has spent busy since boot (``/proc/stat``: every
    state but idle and iowait): what a run costs with everything it starts, sandboxed
    processes included, and whatever else runs beside it (quiet machines only)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    ticks = [int(x) for x in fields[:8]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def median_row(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The median of each figure over repeats (the first row's labels)."""
    merged = dict(rows[0])
    for key, value in rows[0].items():
        if isinstance(value, float):
            merged[key] = statistics.median(r[key] for r in rows)
        elif isinstance(value, dict):
            merged[key] = {k: statistics.median(r[key][k] for r in rows) for k in value}
    merged["ok"] = min(r["ok"] for r in rows)
    return merged


COLUMNS = (  # header, width, figure of a row (with its floor row), format
    ("conc", 5, lambda r, f: r["concurrency"], "d"),
    ("runner", 26, lambda r, f: r["runner"], "<"),
    ("tasks", 5, lambda r, f: r["tasks"], "d"),
    ("ok", 5, lambda r, f: r["ok"], "d"),
    ("ep/s", 7, lambda r, f: r["eps"], ".2f"),
    ("x floor", 7, lambda r, f: r["eps"] / f["eps"] if f else None, ".2f"),
    ("self ms", 8, lambda r, f: r["self_ms"], ".1f"),
    ("child ms", 8, lambda r, f: r["children_ms"], ".1f"),
    ("total ms", 8, lambda r, f: r["total_ms"], ".1f"),
    ("x floor", 7, lambda r, f: r["total_ms"] / f["total_ms"] if f else None, ".2f"),
    ("mach ms", 8, lambda r, f: r["machine_ms"], ".1f"),
    ("RSS MB", 7, lambda r, f: r["rss_mb"], ".0f"),
    ("lag p99", 8, lambda r, f: r["lag_p99"], ".1f"),
    ("lag max", 8, lambda r, f: r["lag_max"], ".1f"),
)


def floor_of(rows: list[dict[str, Any]], row: dict[str, Any]) -> dict[str, Any] | None:
    """The floor's row at ``row``'s concurrency, if the floor ran."""
    return next((x for x in rows if x["concurrency"] == row["concurrency"]
                 and x["runner"] == "floor"), None)  # fmt: skip


def with_ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows with their ratios to the floor (``eps_x_floor``, ``cpu_x_floor``), for JSON."""
    out = []
    for r in rows:
        floor = floor_of(rows, r)
        ratios = {"eps_x_floor": r["eps"] / floor["eps"],
                  "cpu_x_floor": r["total_ms"] / floor["total_ms"]} if floor else {}  # fmt: skip
        out.append({**r, **ratios})
    return out


def report(rows: list[dict[str, Any]], costs: dict[str, dict[str, float]]) -> None:
    """The table, the ratios to the floor and uniagent's split."""
    print(
        f"\nepisodes of {TURNS} turns; ok: those that ran the whole script; CPU (ms) and "
        "lag (ms) per episode; medians over repeats; mach ms: the whole machine's busy CPU "
        "during the run per episode (the scripted server and anything else running included)"
    )
    head = " ".join(f"{name:{'<' if spec == '<' else '>'}{width}}"
                    for name, width, _, spec in COLUMNS)  # fmt: skip
    print(head)
    print("-" * len(head))
    for r in rows:
        floor = floor_of(rows, r)
        cells = []
        for _, width, figure, spec in COLUMNS:
            value = figure(r, floor)
            if value is None:
                cells.append(f"{'-':>{width}}")
            elif spec == "<":
                cells.append(f"{value:<{width}}")
            else:
                cells.append(f"{value:>{width}{spec}}")
        print(" ".join(cells))
    print(
        "\nuniagent per episode (median ms): setup, tools, baseline, ready (a sandbox prepared "
        "ahead waiting for its slot), agent loop "
        "(model wait, env), grading (fresh sandbox's set-up, the reward), close; the whole "
        "episode"
    )
    for r in rows:
        if "split" in r:
            s = r["split"]
            inner = ", ".join(f"{k} {s[k]:.1f}" for k in ("fresh setup", "reward") if k in s)
            print(
                f"{r['concurrency']:>5} {r['runner']:<26} setup {s['setup']:.1f}  tools "
                f"{s['tools']:.1f}  baseline {s['baseline']:.1f}  ready {s.get('ready', 0.0):.1f}  "
                f"agent {s['agent']:.1f} "
                f"(model {s['model wait']:.1f}, env {s['env']:.1f})  grading "
                f"{s['grading']:.1f}{f' ({inner})' if inner else ''}  close {s['close']:.1f}  "
                f"episode {s['episode']:.1f}"
            )
    if costs:
        print("\nthe reward command alone (bash -c, in a checkout): median wall ms, CPU ms")
        for label, cost in costs.items():
            print(f"  {label:<12} {cost['wall_ms']:.1f} wall  {cost['cpu_ms']:.1f} CPU")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", default="1,16,64,256")
    parser.add_argument("--tasks", type=int, default=256, help="tasks per concurrency")
    parser.add_argument(
        "--serial-tasks",
        type=int,
        default=128,
        help="tasks at concurrency 1 (one at a time is slow for the slow runners)",
    )
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument(
        "--runners", default="floor,uniagent,uniagent+reward,uniagent+fresh,mini-swe-agent"
    )
    parser.add_argument(
        "--repo-size",
        default="10:1",
        help="FILES:COMMITS of the reward rows' synthetic repository; a comma list runs "
        "them on each (e.g. 10:1,6000:3000)",
    )
    parser.add_argument(
        "--isolation",
        choices=("none", "bwrap"),
        default="none",
        help="the uniagent rows' host sandboxes (the floor and mini-swe-agent have none)",
    )
    parser.add_argument(
        "--test-command",
        default=TEST_COMMAND,
        help="the reward rows' test command, run in the checkout (default: a shell test that "
        "starts no Python; 'python3 -m unittest tests.test_note' runs the repository's test "
        "under the status channel)",
    )
    parser.add_argument(
        "--model-latency",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="each model reply waits this long (default 0: instant, the runners' own cost)",
    )
    parser.add_argument(
        "--warm",
        type=int,
        default=8,
        help="sandboxes prepared ahead by the uniagent rows named ...+warm (e.g. "
        "--runners uniagent+reward,uniagent+reward+warm; default 8)",
    )
    parser.add_argument(
        "--json", type=Path, metavar="FILE", help="also write the figures to FILE as JSON"
    )
    parser.add_argument("--serve", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.model_latency)
        return
    figures = runpy.run_path(str(BENCH / "figures.py"))  # bench/ is kept off sys.path
    where = figures["provenance"]()
    sizes = repo_sizes(args.repo_size)
    runners = []
    for runner in args.runners.split(","):
        if runner.removesuffix("+warm") in REWARD_RUNNERS:
            runners += [f"{runner} {f}:{c}" for f, c in sizes]
        else:
            runners.append(runner)
    if "mini-swe-agent" in runners:
        mini_python()
    with tempfile.TemporaryDirectory(prefix="uniagent-bench-run-") as tmp:
        work = Path(tmp)
        repos: dict[str, Path] = {}
        costs: dict[str, dict[str, float]] = {}
        if any(" " in r for r in runners):
            for files, commits in sizes:
                label = f"{files}:{commits}"
                repos[label] = work / f"repo-{files}-{commits}"
                make_repo(repos[label], files, commits)
                costs[label] = command_cost(repos[label], work, command=args.test_command)
        url_file = work / "url"
        server = subprocess.Popen([sys.executable, __file__, "--serve", str(url_file),
                                   "--model-latency", str(args.model_latency)])  # fmt: skip
        try:
            while not url_file.exists():
                if server.poll() is not None:
                    raise RuntimeError("the scripted server did not start")
                time.sleep(0.05)
            url = url_file.read_text()
            rows = []
            for concurrency in (int(c) for c in args.concurrency.split(",")):
                tasks = args.serial_tasks if concurrency == 1 else args.tasks
                write_inputs(work, tasks, repos, args.isolation, args.test_command)
                runs: dict[str, list[dict[str, Any]]] = {runner: [] for runner in runners}
                for _ in range(args.repeats):  # runners alternate: machine noise hits all
                    for runner in runners:
                        r = measure(runner, work, url, concurrency, tasks, args.warm)
                        runs[runner].append(r)
                        print(
                            f"{runner} at {concurrency}: {r['ok']}/{tasks} ok, "
                            f"{r['eps']:.2f} ep/s, {r['total_ms']:.1f} ms CPU/ep",
                            flush=True,
                        )
                rows.extend(median_row(runs[runner]) for runner in runners)
        finally:
            server.terminate()
            server.wait()
    report(rows, costs)
    if args.isolation == "bwrap":
        print(
            "\nunder bubblewrap the child CPU misses the sandboxes' own processes (their PID "
            "namespace's init reaps them): compare the uniagent rows by ep/s and mach ms"
        )
    if args.json:
        rows = with_ratios(rows)
        figures["write"](args.json, "bench/run.py", args, where, rows=rows, reward_command=costs)


if __name__ == "__main__":
    main()
