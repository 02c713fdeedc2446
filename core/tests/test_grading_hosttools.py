"""The toolchain check answered from the grader's process without isolation: line for line
what the script prints in the sandbox, on the tools of this machine and on a ``PATH`` made
to tell bash's ``hash`` apart from a plain search."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from uniagent import open_env
from uniagent.env import AgentEnv
from uniagent.grading import hosttools, integrity, scripts, walks
from uniagent.grading.sandbox import GradingSandbox
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
        return await run(command, **kwargs)  # type: ignore[arg-type]

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
