# ruff: noqa: E402 - imports follow the sys.path fix below
"""Fork benchmark: ``AgentEnv.fork()`` against a new sandbox plus a replay.

    python bench/fork.py                    # none, bwrap, layered; 10 and 6,000 files
    python bench/fork.py --isolation bwrap --changed 0,1M,100M --forks 20

For each isolation (``layered``: bubblewrap, ``AgentEnv.layered()`` after the set-up),
repository size (``--repo-size FILES:COMMITS[:MB]``, the synthetic repository of
``bench/run.py``: about 2 KB a file, a ``.git`` that grows with the commits and MB of
random data in its history) and amount the agent wrote before the fork (``--changed``: a
file of that many random bytes): the median and p95 wall time of a fork (the child started
and in its parent's state, then closed outside the timing), beside the cost of what a fork
saves: a new sandbox, the task's set-up (a clone of the repository, as the tiny tasks do
it) and the agent's writes replayed (one command: the least a replay costs; a real episode
replays its builds and test runs too). Prints a table and the ratio; nothing is asserted.
"""

from __future__ import annotations

import sys

# Running `python bench/fork.py` puts bench/ first on sys.path, where a sibling script
# named like a stdlib module (bench/tokenize.py) would shadow it.
sys.path[:] = [p for p in sys.path if not p or not p.rstrip("/").endswith("bench")]

import argparse
import asyncio
import importlib.util
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from uniagent import open_env
from uniagent.env import AgentEnv

HERE = Path(__file__).resolve().parent


def bench_run() -> Any:
    """``bench/run.py`` as a module (its synthetic repository maker)."""
    spec = importlib.util.spec_from_file_location("bench_run", HERE / "run.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def size(text: str) -> int:
    """``0``, ``4096``, ``1M``, ``100M``, ``1G`` as bytes."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper()
    if text[-1:] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


async def prepared(isolation: str, base: Path, repo: Path, changed: int) -> list[AgentEnv]:
    """A started sandbox with ``repo`` in its work dir and ``changed`` bytes written (the
    first of the list; the rest are closed after it). ``layered``: bubblewrap, the sandbox
    layered (``AgentEnv.layered()``) after the repository is in and before the writes, as a
    tree rollout does before the agent's first command."""
    bwrap = "bwrap" if isolation == "layered" else isolation
    config = {"type": "host", "isolation": bwrap, "base_dir": str(base), "ro_binds": [str(repo)]}
    env = await open_env(config).__aenter__()
    # The task's set-up, as the tiny tasks do it: a clone of the repository, bound read-only.
    cloned = await env.run_action(f"git clone -q {repo} . && git checkout -q main", timeout=600)
    assert cloned.exit_code == 0, cloned.output
    envs = [env]
    if isolation == "layered":
        layered = await env.layered()
        if layered is None:
            await env.close()
            raise SystemExit("layered: this machine cannot layer sandboxes (bwrap and root)")
        envs.insert(0, layered)
    await write(envs[0], changed)
    return envs


async def close(envs: list[AgentEnv]) -> None:
    for env in envs:
        await env.close()


async def write(env: AgentEnv, changed: int) -> None:
    write = f"head -c {changed} /dev/urandom > changed.bin && " if changed else ""
    obs = await env.run_action(write + "cd pkg00 && export BENCH=1", timeout=600)
    assert obs.exit_code == 0, obs.output


def pad_history(repo: Path, megabytes: int) -> None:
    """Add ``megabytes`` of random data to ``repo``'s history only: a commit adds it, the
    next removes it (a SWE-bench checkout's .git is tens of MB beside its files)."""
    if not megabytes:
        return
    blob = repo / "history.bin"
    blob.write_bytes(os.urandom(megabytes << 20))
    for args in (["add", "history.bin"], ["commit", "-qm", "history"], ["rm", "-q", "history.bin"],
                 ["commit", "-qm", "history gone"]):  # fmt: skip
        subprocess.run(["git", "-C", str(repo), "-c", "user.name=b", "-c", "user.email=b@b",
                        *args], check=True)  # fmt: skip


def stats(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]


async def measure(
    isolation: str, base: Path, repo: Path, changed: int, forks: int
) -> dict[str, Any]:
    envs = await prepared(isolation, base, repo, changed)
    parent = envs[0]
    try:
        fork_ms, replay_ms = [], []
        for _ in range(forks):
            started = time.perf_counter()
            child = (await parent.fork()).env
            fork_ms.append((time.perf_counter() - started) * 1000)
            assert (await child.run_action("pwd")).output.rstrip().endswith("/pkg00")
            await child.close()
        for _ in range(max(3, forks // 4)):
            started = time.perf_counter()
            fresh = await prepared(isolation, base, repo, changed)
            replay_ms.append((time.perf_counter() - started) * 1000)
            await close(fresh)
    finally:
        await close(envs)
    fork_median, fork_p95 = stats(fork_ms)
    replay_median, _ = stats(replay_ms)
    return {
        "fork_median": fork_median,
        "fork_p95": fork_p95,
        "replay_median": replay_median,
        "ratio": replay_median / fork_median,
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--isolation",
        default="none,bwrap,layered",
        help="comma list: none, bwrap, layered (bwrap, AgentEnv.layered() before the writes)",
    )
    parser.add_argument(
        "--repo-size",
        default="10:1,6000:3000:75",
        help="FILES:COMMITS[:MB], comma list; MB: random data added to the history (.git)",
    )
    parser.add_argument(
        "--changed", default="0,1M", help="bytes written before the fork, comma list"
    )
    parser.add_argument("--forks", type=int, default=10, help="forks measured per row")
    args = parser.parse_args()
    run = bench_run()
    sizes = []
    for item in args.repo_size.split(","):  # FILES:COMMITS[:MB of extra .git history]
        files_commits, _, mb = item.rpartition(":") if item.count(":") == 2 else (item, "", "0")
        ((files, commits),) = run.repo_sizes(files_commits)
        if not mb.isdigit():
            raise SystemExit(f"--repo-size: {item!r}: the history's MB must be a whole number")
        sizes.append((files, commits, int(mb)))
    changes = [size(c) for c in args.changed.split(",")]
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-fork-") as tmp:
        work = Path(tmp)
        # Readable by the sandbox's user, as a task set's repositories are: a source it
        # cannot reach is staged by a helper shell at every start and fork (about 20 ms).
        work.chmod(0o755)
        for files, commits, history_mb in sizes:
            repo = work / f"repo-{files}-{commits}-{history_mb}"
            run.make_repo(repo, files, commits)
            pad_history(repo, history_mb)
            git_mb = sum(p.stat().st_size for p in (repo / ".git").rglob("*") if p.is_file()) / 1e6
            for isolation in args.isolation.split(","):
                for changed in changes:
                    base = work / "episodes"
                    base.mkdir(exist_ok=True)
                    row = await measure(isolation, base, repo, changed, args.forks)
                    row |= {"isolation": isolation, "files": files, "git_mb": git_mb,
                            "changed": changed}  # fmt: skip
                    rows.append(row)
                    print(
                        f"{isolation:7}  {files:>5} files ({git_mb:5.1f} MB .git)  "
                        f"changed {changed / 1e6:7.1f} MB  fork {row['fork_median']:8.1f} ms "
                        f"(p95 {row['fork_p95']:8.1f})  new + replay {row['replay_median']:8.1f} ms"
                        f"  x{row['ratio']:5.1f}",
                        flush=True,
                    )
    print("\nfork: the median of", args.forks, "forks; new + replay: a new sandbox, the task's")
    print("set-up (git clone) and the writes replayed; x: how many times a fork is cheaper")


if __name__ == "__main__":
    asyncio.run(main())
