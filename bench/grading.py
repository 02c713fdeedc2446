# ruff: noqa: E402 - imports follow the sys.path fix below
"""What the grader costs per episode: the baseline, ``grade_in: episode`` and ``grade_in: fresh``.

    python bench/grading.py                      # host backend, isolation none and bwrap
    python bench/grading.py --episodes 20 --local   # also a podman container (builds an image)

Each episode: a sandbox whose set-up puts a small git repository (a bug, its
pytest tests, history that holds the fix) in place; the grader's baseline
(history scrub, snapshot of the protected files, toolchain checksums); "the
agent" writes the fix; then the ``swe_bench`` reward grades it, once per mode
on the same kind of sandbox. ``fresh`` is measured as episodes run it: its
sandbox is started at the baseline, and grading begins once it is up (the
agent's working time, which hides its start, is not counted). Printed: medians
in ms of sandbox start, baseline, grading in the episode's sandbox, grading in
the fresh one started ahead, their ratio against the target (1.2x), for
reference fresh grading whose sandbox starts only when grading begins, and what
the status channel adds to grading in the episode's sandbox (the same grading
with ``status_channel: false``).

The figures measured on our machines, and how to read them, are in
docs/rewards.md ("Cost").
"""

from __future__ import annotations

import sys

sys.path[:] = [p for p in sys.path if not p or not p.rstrip("/").endswith("bench")]

import argparse
import asyncio
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from uniagent import open_env
from uniagent.env import AgentEnv
from uniagent.testing.grading import grade, prepare_grader

BUGGY = "def add(a, b):\n    return a - b\n\n\ndef sub(a, b):\n    return a - b\n"
FIXED = BUGGY.replace("return a - b", "return a + b", 1)
BASE_TESTS = "from calc import sub\n\n\ndef test_sub():\n    assert sub(5, 3) == 2\n"
TESTS = BASE_TESTS.replace("import sub", "import add, sub") + (
    "\n\ndef test_add():\n    assert add(2, 3) == 5\n"
)
IMAGE = "localhost/uniagent-bench-grading:bookworm"
#: The acceptance target: ``fresh`` (started ahead) costs at most this times ``episode``.
TARGET = 1.2


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=b", "-c", "user.email=b@b", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
        text=True,
    ).stdout


def make_repo(path: Path) -> tuple[str, str]:
    """The task's repository: its base commit and the test patch (a fix sits on a branch)."""
    path.mkdir(parents=True)
    git(path, "init", "-q")
    (path / "calc.py").write_text(BUGGY)
    (path / "test_calc.py").write_text(BASE_TESTS)
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "base")
    base = git(path, "rev-parse", "HEAD").strip()
    (path / "test_calc.py").write_text(TESTS)
    test_patch = git(path, "diff")
    git(path, "checkout", "-q", "--", ".")
    git(path, "checkout", "-q", "-b", "fix")
    (path / "calc.py").write_text(FIXED)
    git(path, "commit", "-q", "-am", "fix")
    git(path, "checkout", "-q", base)
    return base, test_patch


def task(base: str, test_patch: str, python: str) -> dict[str, Any]:
    return {
        "instance_id": "bench__calc-1",
        "repo": "bench/calc",
        "base_commit": base,
        "FAIL_TO_PASS": ["test_calc.py::test_add"],
        "PASS_TO_PASS": ["test_calc.py::test_sub"],
        "test_cmd": f"PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 {python} -m pytest -rA -p no:cacheprovider",
        "log_parser": "parse_log_pytest",
        "test_patch": test_patch,
    }


#: The modes measured: ``fresh`` as episodes run it (its sandbox started at the baseline,
#: up by the time the agent is done), and, for reference, a fresh sandbox started only when
#: grading begins (an agent quicker than a sandbox start) and ``episode`` without the status
#: channel (the test runner's own record of each status, checked against the log): the
#: channel's cost is the difference.
MODES = ("episode", "fresh", "fresh-not-ahead", "episode-no-channel")


async def one(
    make_env: Callable[[], AgentEnv], row: dict[str, Any], workdir: str | None, mode: str
) -> dict[str, float]:
    """One episode's timings (ms)."""
    times: dict[str, float] = {}
    started = time.perf_counter()
    env = make_env()
    await env.start()
    times["start"] = (time.perf_counter() - started) * 1000
    grader = None
    try:
        started = time.perf_counter()
        grader = await prepare_grader(
            env,
            "swe_bench",
            row,
            settings={"workdir": workdir, "status_channel": mode != "episode-no-channel"},
            grade_in="fresh" if mode.startswith("fresh") else "episode",
            fresh_env=make_env if mode != "fresh-not-ahead" else None,
        )
        times["baseline"] = (time.perf_counter() - started) * 1000
        if mode == "fresh-not-ahead":
            grader.plan.fresh_env = make_env  # asked for only when grading begins
        await env.write_file(f"{grader.baseline.repo}/calc.py", FIXED)
        await grader.fresh_started()  # the agent's working time, longer than a sandbox start
        started = time.perf_counter()
        result = await grade(grader, env)
        times["grade"] = (time.perf_counter() - started) * 1000
        assert result.score == 1.0, result.info
    finally:
        if grader is not None:
            await grader.close()
        await env.close()
    return times


async def measure(
    name: str,
    make_env: Callable[[], AgentEnv],
    row: dict[str, Any],
    workdir: str | None,
    episodes: int,
) -> list[str]:
    samples: dict[str, dict[str, list[float]]] = {mode: {} for mode in MODES}
    for _ in range(episodes):  # alternate the modes so machine noise hits them alike
        for mode in MODES:
            for key, value in (await one(make_env, row, workdir, mode)).items():
                samples[mode].setdefault(key, []).append(value)
    med = {m: {k: statistics.median(v) for k, v in s.items()} for m, s in samples.items()}
    start = statistics.median(x for m in MODES for x in samples[m]["start"])
    baseline = statistics.median(x for m in MODES for x in samples[m]["baseline"])
    episode, fresh, late, bare = (med[m]["grade"] for m in MODES)
    return [
        f"| {name} | {start:.0f} | {baseline:.0f} | {episode:.0f} | {fresh:.0f} | "
        f"{fresh / episode:.2f}x{'' if fresh / episode <= TARGET else ' (over target)'} | "
        f"{late:.0f} ({late / episode:.2f}x) | {episode - bare:+.0f} ({episode / bare:.2f}x) |"
    ]


def host_env(repo: Path, isolation: str, python_dirs: list[str]) -> Callable[[], AgentEnv]:
    deployment: dict[str, Any] = {"type": "host", "isolation": isolation}
    if isolation == "bwrap":
        # This Python may live under /work (the sandbox's default work dir): move that.
        deployment.update(
            ro_binds=[str(repo.parent), *python_dirs], sandbox_workdir="/sandbox/work"
        )
    settings = {"post_setup": [f"git clone -q {repo} . && git fetch -q origin fix"]}
    return lambda: open_env(deployment, settings)


def local_env() -> Callable[[], AgentEnv]:
    return lambda: open_env(
        {"type": "local", "image": IMAGE, "pull": "never"}, {"workdir": "/testbed"}
    )


def ensure_local_image(repo: Path) -> None:
    from uniagent.testing.images import build_image, container_engine, image_exists

    engine, reason = container_engine()
    if engine is None:
        raise SystemExit(f"--local: {reason}")
    if not image_exists(engine, IMAGE):
        print(f"building {IMAGE} (debootstrap, a few minutes) ...", file=sys.stderr)
        build_image(
            engine,
            IMAGE,
            packages=("python3", "python3-venv", "python3-pytest", "git"),
            copy={"/testbed": repo},
        )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=10)
    parser.add_argument("--isolation", default="none,bwrap")
    parser.add_argument("--local", action="store_true", help="also a podman/docker container")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="uniagent-bench-grading-") as tmp:
        repo = Path(tmp) / "repos" / "calc"
        base, test_patch = make_repo(repo)
        python_dirs = sorted({sys.prefix, sys.base_prefix})
        rows = [
            "| backend | start | baseline | grade episode | grade fresh (started ahead) "
            f"| fresh / episode (target <= {TARGET}x) | grade fresh, not started ahead "
            "| status channel (episode against episode without it) |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for isolation in args.isolation.split(","):
            rows += await measure(
                f"host, isolation {isolation}",
                host_env(repo, isolation, python_dirs),
                task(base, test_patch, sys.executable),
                None,
                args.episodes,
            )
        if args.local:
            ensure_local_image(repo)
            row = task(base, test_patch, "python3")
            rows += await measure("local (container)", local_env(), row, "/testbed", args.episodes)
    print(f"grading cost per episode, median ms over {args.episodes} episodes per mode")
    print("\n".join(rows))


if __name__ == "__main__":
    asyncio.run(main())
