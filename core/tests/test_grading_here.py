"""Without isolation a grading command runs with its bounds kept by the grader's process
(``AgentEnv.run_bounded``), not by the wrapper's processes in the sandbox: the same output,
status, cut, time-out, held output and cleanup as through the wrapper."""

from __future__ import annotations

import os
import select
from collections.abc import AsyncIterator

import pytest

from uniagent import open_env
from uniagent.env import AgentEnv
from uniagent.grading.sandbox import GradingSandbox
from uniagent.testing.grading import SAME_COMMANDS


@pytest.fixture
async def env() -> AsyncIterator[AgentEnv]:
    async with open_env({"type": "host", "isolation": "none"}) as sandbox:
        yield sandbox


async def _sandbox(env: AgentEnv) -> GradingSandbox:
    variables = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "ONLY_HERE": "a b\nc é 中"}
    return await GradingSandbox.open(env, variables, workdir=env.workdir, lazy=True)


#: Commands whose outcome must be the same with and without the wrapper (the shell level
#: and ``$_`` aside: the wrapper is one more bash), and one that leaves a process behind.
SAME = [
    *SAME_COMMANDS,
    "env | grep -v -e '^SHLVL=' -e '^_=' | LC_ALL=C sort",
    "sleep 1000 > /dev/null 2>&1 & echo started",
]


@pytest.mark.parametrize("command", SAME)
async def test_a_command_runs_the_same_without_its_wrapper(
    env: AgentEnv, command: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    sandbox = await _sandbox(env)
    try:
        for cwd in ("/", "/tmp"):
            here = await sandbox.run(command, timeout=60, cwd=cwd, max_bytes=3000)
            with monkeypatch.context() as patch:
                patch.setattr(env, "sees_host_files", lambda: False)
                wrapped = await sandbox.run(command, timeout=60, cwd=cwd, max_bytes=3000)
            assert here == wrapped
    finally:
        await sandbox.close()


async def test_the_bounds_are_kept_without_the_wrapper(env: AgentEnv) -> None:
    """Cut at the limit (the rest read and counted), killed at the time-out, what the command
    left in its process group killed when it ends, a command that killed itself not timed
    out. (An output held open by a process that left the group: test_grading.py's
    ``test_a_process_left_holding_the_output_cannot_hang_a_command``, without isolation.)"""
    sandbox = await _sandbox(env)
    calls: list[str] = []
    real = env.execute

    async def counted(*args: object, **kwargs: object) -> object:
        calls.append(repr(args))
        return await real(*args, **kwargs)  # type: ignore[arg-type]

    env.execute = counted  # type: ignore[method-assign]
    try:
        cut = await sandbox.run("yes | head -c 100000", timeout=60, max_bytes=1000)
        assert cut.truncated and cut.output == "y\n" * 500 and cut.exit_code == 0
        slow = await sandbox.run("echo before; sleep 30", timeout=1)
        assert (slow.output, slow.exit_code, slow.timed_out) == ("before\n", 137, True)
        left = await sandbox.run("sleep 1000 > /dev/null 2>&1 & echo $!", timeout=60)
        assert _ends(int(left.output)), "killed with its group as the command ended"
        itself = await sandbox.run("echo hi; kill -KILL $$", timeout=60)
        assert (itself.output, itself.exit_code, itself.timed_out) == ("hi\n", 137, False)
        assert calls == [], "no wrapper ran"
    finally:
        env.execute = real  # type: ignore[method-assign]
        await sandbox.close()
    assert not os.path.exists(sandbox.scratch)


async def test_staged_files_are_written_from_here(env: AgentEnv) -> None:
    sandbox = await _sandbox(env)
    try:
        small, big = b"\x00\xff\n", bytes(range(256)) * 700  # big: more than goes inline
        await sandbox.stage_bytes(f"{sandbox.scratch}/small", small)
        await sandbox.stage_bytes(f"{sandbox.scratch}/big", big)
        done = await sandbox.run(f"ls {sandbox.scratch}", timeout=60, cwd="/")
        assert done.output.split() == ["big", "home", "small", "tmp"]
        assert await sandbox.read_bytes(f"{sandbox.scratch}/big") == big
        assert await sandbox.read_bytes(f"{sandbox.scratch}/small") == small
        modes = [os.stat(f"{sandbox.scratch}{d}").st_mode & 0o777 for d in ("", "/home", "/tmp")]
        assert modes == [0o700] * 3
    finally:
        await sandbox.close()


def _ends(pid: int) -> bool:
    """Whether process ``pid`` ends (or has ended) within a minute: its pidfd is readable
    once it has exited (it may stay a zombie of whoever inherited it)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([fd], [], [], 60)[0])
    finally:
        os.close(fd)
