"""The toolchain check answered from the grader's process without isolation: line for line
what the script prints in the sandbox, on the tools of this machine and on a ``PATH`` made
to tell bash's ``hash`` apart from a plain search."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import types
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from uniagent import open_env
from uniagent.env import AgentEnv
from uniagent.grading import hosttools, integrity, scripts, testenv, walks
from uniagent.grading.sandbox import GradingSandbox
from uniagent.protect.settings import TestEnv
from uniagent.testing import MAKE_PREFIX
from uniagent.testing.grading import wait_ctime_after


@pytest.fixture
async def env() -> AsyncIterator[AgentEnv]:
    async with open_env({"type": "host", "isolation": "none"}) as sandbox:
        yield sandbox


async def _both(env: AgentEnv, path: str) -> tuple[str | None, str]:
    sandbox = await GradingSandbox.open(
        env, {"PATH": path, "LANG": "C.UTF-8"}, workdir=env.workdir, lazy=True
    )
    try:
        here = await hosttools.toolchain_output(sandbox, 60)
        variables = {"TOOLS": scripts.TOOLCHAIN_TOOLS, "PYCODE": scripts.TOOLCHAIN_PY}
        script = await integrity.run_script(
            sandbox, scripts.TOOLCHAIN, variables, what="the toolchain check", resident=False
        )
    finally:
        await sandbox.close()
    return here, script


def _lines(output: str) -> list[str]:
    return sorted(output.splitlines())


async def test_the_answer_from_here_is_the_scripts_on_this_machines_tools(env: AgentEnv) -> None:
    path = f"{os.path.dirname(sys.executable)}:/usr/local/bin:/usr/bin:/bin"
    here, script = await _both(env, path)
    assert here is not None
    assert _lines(here) == _lines(script)
    assert any(line.startswith("bin git ") for line in _lines(here))
    assert sum(line.startswith("stat ") for line in _lines(here)) > 20  # pytest's sources


async def test_the_answer_from_here_follows_bashs_hash(env: AgentEnv, tmp_path: Path) -> None:
    """An executable later on PATH wins over a file that is not one (which is not found
    where nothing of its name is executable); a directory is passed over; a link is
    followed to its target; a dangling link is passed over as bash's hash does."""
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    (first / "git").write_text("not executable\n")
    (second / "git").symlink_to("/usr/bin/git")
    (first / "tar").mkdir()  # a directory named like a tool
    (first / "pytest").write_text("only this one\n")  # not executable, and no other
    (second / "find").symlink_to(tmp_path / "nowhere")
    (second / "rm").write_text("#!/bin/sh\n")
    (second / "rm").chmod(0o755)
    path = f"{first}:{second}:/usr/bin:/bin"
    here, script = await _both(env, path)
    assert here is not None
    assert _lines(here) == _lines(script)
    bins = dict(line.split(" ", 2)[1:] for line in _lines(here) if line.startswith("bin "))
    assert bins["git"] == os.path.realpath("/usr/bin/git")
    assert bins["rm"] == str(second / "rm")
    assert bins["tar"] == os.path.realpath("/usr/bin/tar")
    assert bins["find"] == os.path.realpath("/usr/bin/find")
    assert "pytest" not in bins


async def test_a_relative_entry_or_a_pyenv_shim_leaves_it_to_the_script(
    env: AgentEnv, tmp_path: Path
) -> None:
    here, _ = await _both(env, "bin:/usr/bin:/bin")
    assert here is None
    shims = tmp_path / "shims"
    shims.mkdir()
    (shims / "python3").write_text(
        '#!/usr/bin/env bash\nexec "/opt/pyenv/libexec/pyenv" exec "$program" "$@"\n'
    )
    (shims / "python3").chmod(0o755)
    sandbox = await GradingSandbox.open(
        env, {"PATH": f"{shims}:/usr/bin:/bin"}, workdir=env.workdir, lazy=True
    )
    try:
        assert await hosttools.toolchain_output(sandbox, 60) is None
    finally:
        await sandbox.close()


async def test_under_bubblewrap_the_script_runs() -> None:
    async with open_env({"type": "host", "isolation": "bwrap"}) as env:
        sandbox = await GradingSandbox.open(
            env, {"PATH": "/usr/bin:/bin"}, workdir=env.workdir, lazy=True
        )
        try:
            assert await hosttools.toolchain_output(sandbox, 60) is None
        finally:
            await sandbox.close()


def test_a_timestamp_is_finds() -> None:
    assert hosttools._timestamp(1_796_565_810_020_582_866) == "1796565810.0205828660"
    assert hosttools._timestamp(5_000_000_000) == "5.0000000000"


def _counted(sandbox: GradingSandbox, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The commands ``sandbox`` runs from now on."""
    ran: list[str] = []
    run = sandbox.run

    async def counting(command: str, **kwargs: object) -> object:
        ran.append(command)
        return await run(command, **kwargs)

    monkeypatch.setattr(sandbox, "run", counting)
    return ran


async def test_an_interpreters_answer_is_kept_while_the_names_it_read_hold(
    env: AgentEnv, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No slack here (a directory's ctime is before a run that started after it changed);
    a name added to a package it listed, or its pyvenv.cfg changed, asks it again."""
    monkeypatch.setattr(walks, "CTIME_SLACK_NS", 0)
    prefix = tmp_path / "prefix"  # its own site-packages, which `-I -S` reads (a venv's not)
    made = [sys.executable, "-c", MAKE_PREFIX, str(prefix)]
    package = Path(subprocess.run(made, capture_output=True, text=True, check=True).stdout.strip())
    (package / "pytest").mkdir()
    (package / "pytest" / "__init__.py").write_text("")
    path = f"{prefix}/bin:/usr/bin:/bin"
    sandbox = await GradingSandbox.open(env, {"PATH": path}, workdir=env.workdir, lazy=True)
    try:
        # (its first run writes its standard library's bytecode, changing those directories)
        await hosttools.toolchain_output(sandbox, 60)
        ran = _counted(sandbox, monkeypatch)
        first = await hosttools.toolchain_output(sandbox, 60)
        assert first is not None and len(ran) == 1
        assert f"{package}/pytest/__init__.py" in first
        assert await hosttools.toolchain_output(sandbox, 60) == first
        assert len(ran) == 1, "the kept answer was given again"
        wait_ctime_after(time.time_ns(), tmp_path)
        (package / "pytest" / "added.py").write_text("")
        again = await hosttools.toolchain_output(sandbox, 60)
        assert again is not None and len(ran) == 2
        assert f"{package}/pytest/added.py" in again
        wait_ctime_after(time.time_ns(), tmp_path)
        (prefix / "pyvenv.cfg").write_text("# made\n")  # (read above the interpreter)
        assert await hosttools.toolchain_output(sandbox, 60) == again
        assert len(ran) == 3, "a pyvenv.cfg made: asked again"
    finally:
        await sandbox.close()
    here, script = await _both(env, path)
    assert here is not None and _lines(here) == _lines(script)


async def _both_checks(
    env: AgentEnv, path: str, repo: Path, words: tuple[str, ...], roots: list[str], files: list[str]
) -> tuple[str | None, str]:
    """The test-environment check before grading (``verify``), answered from here and by the
    script in the sandbox."""
    here = testenv._verify_output(path, str(repo), words, roots, files)
    sandbox = await GradingSandbox.open(
        env, {"PATH": path, "LANG": "C.UTF-8"}, workdir=env.workdir, lazy=True
    )
    try:
        s = sandbox.scratch
        await sandbox.stage_bytes(f"{s}/roots", "".join(f"{r}\n" for r in roots).encode())
        await sandbox.stage_bytes(f"{s}/files", "".join(f"{f}\n" for f in files).encode())
        spec = TestEnv(activate="", interpreters=words)
        baseline: Any = types.SimpleNamespace(repo=str(repo))  # (the repository alone)
        variables = testenv._variables(baseline, spec, s, "verify", "", str(repo), shared=True)
        script = await integrity.run_script(sandbox, testenv.TEST_ENV, variables, what="check")
    finally:
        await sandbox.close()
    return here, script


async def test_the_test_environment_check_from_here_is_the_scripts(
    env: AgentEnv, tmp_path: Path
) -> None:
    """Words found on PATH, by an absolute path and by one relative to the repository (a
    link followed to its target), one not found and one not executable; files there, missing
    and behind a link; the roots the grader walks itself."""
    repo = tmp_path / "repo"
    (repo / "venv" / "bin").mkdir(parents=True)
    (repo / "venv" / "bin" / "python").symlink_to(sys.executable)
    (repo / "plain").write_text("not executable\n")
    (tmp_path / "start.pth").write_text("\n")
    (tmp_path / "linked.pth").symlink_to(tmp_path / "start.pth")
    path = f"{os.path.dirname(sys.executable)}:/usr/local/bin:/usr/bin:/bin"
    words = ("python", "python3", "./venv/bin/python", "/usr/bin/env", "python9.99", "./plain")
    files = [str(tmp_path / "start.pth"), str(tmp_path / "gone.pth"), str(tmp_path / "linked.pth")]
    roots = [os.path.dirname(os.__file__), str(tmp_path / "elsewhere")]
    here, script = await _both_checks(env, path, repo, words, roots, files)
    assert here is not None and here == script
    assert f"env-bin ./venv/bin/python {os.path.realpath(sys.executable)}" in here.splitlines()
    assert sum(line.startswith("stat ") for line in here.splitlines()) == 2
    assert "python9.99" not in here and "plain" not in here


async def test_the_script_checks_what_it_reads_otherwise(env: AgentEnv, tmp_path: Path) -> None:
    """A pattern for a word, a shell builtin's name (bash's hash finds no program for it), a
    relative PATH entry, a pyenv shim, a root that holds the repository: the script
    answers."""
    repo = tmp_path / "repo"
    repo.mkdir()
    shims = tmp_path / "shims"
    shims.mkdir()
    (shims / "python3").write_text(
        '#!/usr/bin/env bash\nexec "/opt/pyenv/libexec/pyenv" exec "$program" "$@"\n'
    )
    (shims / "python3").chmod(0o755)
    usual = ("python3",), "/usr/bin:/bin", [os.path.dirname(os.__file__)]
    assert testenv._verify_output(usual[1], str(repo), usual[0], usual[2], []) is not None
    for words, path, roots in [
        (("python*",), usual[1], usual[2]),
        (("test",), usual[1], usual[2]),
        (usual[0], f"bin:{usual[1]}", usual[2]),
        (usual[0], f"{shims}:{usual[1]}", usual[2]),
        (usual[0], usual[1], [str(tmp_path)]),
    ]:
        assert testenv._verify_output(path, str(repo), words, roots, []) is None, (words, path)


async def test_the_discovery_from_here_is_the_scripts(
    env: AgentEnv, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once the interpreters' answers are kept, the baseline's discovery answered from here
    is what the script prints: words on PATH, by an absolute path and relative to the
    repository, a script whose ``#!`` line runs ``env python3``, an interpreter asked once
    for several words, the venv's roots, the files' keys."""
    monkeypatch.setattr(testenv, "KEPT_SLACK_NS", 0)  # the venv was made just now
    kept = testenv._KeptAnswers()
    venv = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "tool").write_text("#!/usr/bin/env python3\nprint('a tool')\n")
    (repo / "tool").chmod(0o755)
    words = ("python", "python3", "pytest", f"{venv}/bin/python", "./tool", "python9.99")
    if os.path.exists("/usr/bin/python3"):
        words += ("/usr/bin/python3",)
    environment = {
        "PATH": f"{venv}/bin:/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8",
        "VIRTUAL_ENV": str(venv),
    }  # fmt: skip
    sandbox = await GradingSandbox.open(env, environment, workdir=env.workdir, lazy=True)
    try:
        spec = TestEnv(activate="", interpreters=words)
        baseline: Any = types.SimpleNamespace(repo=str(repo))  # (the repository alone)
        variables = testenv._variables(
            baseline, spec, sandbox.scratch, "discover", "", None, (), True, keep=True
        )
        started = time.time_ns()
        said = await integrity.run_script(sandbox, testenv.TEST_ENV, variables, what="found")
        kept.keep(("key",), said, sandbox.scratch, str(repo), started)
        answers = kept.holding(("key",))
        here = testenv._discover_output(environment, str(repo), sandbox.scratch, words, answers, ())
    finally:
        await sandbox.close()
    assert len(answers) == (2 if "/usr/bin/python3" in words else 1)
    # (what the script prints besides, for the grader to keep: each new answer, indented)
    script = "".join(
        f"{line}\n" for line in said.splitlines() if not line.startswith(("answer\t", "\t"))
    )
    assert script != said and here is not None and here == script
    lines = script.splitlines()
    assert f"root {venv}/bin" in lines and f"env-bin ./tool {repo}/tool" in lines
    assert any(line.startswith("stat ") for line in lines)
    assert testenv._discover_output(environment, str(repo), sandbox.scratch, words, {}, ()) is None


def test_a_fifo_where_a_file_was_is_never_waited_on(tmp_path: Path) -> None:
    """A FIFO put where an interpreter was (without isolation an agent of another episode
    can write there) is not a file: the grader leaves that case to the script, whose reads
    are bounded, instead of waiting on it in a thread for ever."""
    bin_dir, scratch = tmp_path / "bin", tmp_path / "scratch"
    (scratch / "tmp").mkdir(parents=True)
    bin_dir.mkdir()
    os.mkfifo(bin_dir / "python3")
    (bin_dir / "python3").chmod(0o755)
    outcome: list[object] = []

    def check() -> None:
        environment = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
        repo = str(tmp_path)
        outcome.append(
            testenv._discover_output(environment, repo, str(scratch), ("python3",), {}, ())
        )

    worker = threading.Thread(target=check, daemon=True)
    worker.start()
    worker.join(timeout=120)  # (a guard: the check returns at once, or never)
    assert not worker.is_alive(), "the grader waited on a FIFO"
    assert outcome == [None]
    assert hosttools.read_regular(str(bin_dir / "python3"), 256) is None
