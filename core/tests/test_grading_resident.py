"""The grader's resident shell: under bubblewrap, with a read-only grading ``PATH``, the
grader's own commands run one after another in one shell in a PID namespace of its own,
which the agent's session and the tested code cannot see; each runs exactly as a one-off
command would, and the tested code never runs in it."""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
import types
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from uniagent import RewardSpec, hookimpl, open_env
from uniagent.env import AgentEnv
from uniagent.env.errors import EnvError
from uniagent.grading.sandbox import GradingSandbox
from uniagent.plugins import load_plugins, reset_plugins
from uniagent.reward import RewardContext, RewardResult
from uniagent.testing.grading import SAME_COMMANDS, grade, prepare_grader

READ_ONLY_PATH = "/usr/bin:/bin"
#: The pid namespace a command runs in.
PID_NS = "readlink /proc/self/ns/pid"
#: Counts the processes of this pid namespace that are a resident shell (the pattern does
#: not match its own command line).
SHELLS = "grep -a -l 'wrapper=[$]1' /proc/[0-9]*/cmdline 2>/dev/null | wc -l"
SETUP = (
    "git init -q && git config user.email t@t && git config user.name t && "
    "printf 'x = 1\\n' > calc.py && git add -A && git commit -qm base"
)


pytestmark = pytest.mark.usefixtures("new_process")


@pytest.fixture
async def env() -> AsyncIterator[AgentEnv]:
    async with open_env({"type": "host", "isolation": "bwrap"}, {"post_setup": [SETUP]}) as sandbox:
        yield sandbox


async def _sandbox(env: AgentEnv, path: str = READ_ONLY_PATH) -> GradingSandbox:
    variables = {"PATH": path, "LANG": "C.UTF-8", "ONLY_HERE": "a b\nc é 中"}
    return await GradingSandbox.open(env, variables, workdir=env.workdir, lazy=True)


async def test_the_grader_commands_share_one_shell_in_a_namespace_of_their_own(
    env: AgentEnv,
) -> None:
    sandbox = await _sandbox(env)
    try:
        first = await sandbox.run(PID_NS, timeout=60, cwd="/", resident=True)
        second = await sandbox.run(PID_NS, timeout=60, cwd="/", resident=True)
        one_off = await sandbox.run(PID_NS, timeout=60, cwd="/")
        assert first.exit_code == second.exit_code == one_off.exit_code == 0
        assert first.output == second.output  # one shell, one namespace
        assert one_off.output != first.output  # a bwrap of its own, as before
        agent = await env.run_action(f"{PID_NS}; {SHELLS}")
        namespace, shells = agent.output.split()
        assert namespace not in (first.output.strip(), one_off.output.strip())
        assert shells == "0"  # the agent's session sees no resident shell
        seen = await sandbox.run(SHELLS, timeout=60, cwd="/", resident=True)
        assert int(seen.output) >= 1  # (where it runs, the count finds the shell)
    finally:
        await sandbox.close()


#: Commands whose outcome must be the same in the resident shell and as a one-off (their
#: output cut at 3000 bytes: exactly that many, and one NUL byte more).
SAME = [
    *SAME_COMMANDS,
    "env | LC_ALL=C sort",
    "head -c 3000 /dev/zero | tr '\\0' y",
    "head -c 3001 /dev/zero",
    "head -c 3000 /dev/zero; printf '\\n'",
]


@pytest.mark.parametrize("command", SAME)
async def test_a_command_runs_the_same_in_the_resident_shell(env: AgentEnv, command: str) -> None:
    sandbox = await _sandbox(env)
    try:
        for cwd in ("/", "/tmp"):
            resident = await sandbox.run(
                command, timeout=60, cwd=cwd, max_bytes=3000, resident=True
            )
            one_off = await sandbox.run(command, timeout=60, cwd=cwd, max_bytes=3000)
            assert resident == one_off
        assert sandbox._shell is not None
    finally:
        await sandbox.close()


async def test_variables_the_shell_cannot_export_reach_the_command_as_they_would_one_off(
    env: AgentEnv,
) -> None:
    """Names that are bash's own (read-only or set at start-up) or the resident shell's
    loop variables: the command gets them as a one-off command does (under ``env -i``)."""
    variables = {"PATH": READ_ONLY_PATH, "UID": "5", "SHLVL": "7", "fields": "a b", "OK": "1"}
    sandbox = await GradingSandbox.open(env, variables, workdir=env.workdir, lazy=True)
    try:
        command = "env | LC_ALL=C sort; echo $UID $SHLVL"
        resident = await sandbox.run(command, timeout=60, cwd="/", resident=True)
        one_off = await sandbox.run(command, timeout=60, cwd="/")
        assert resident == one_off and resident.exit_code == 0
        assert "fields=a b\n" in resident.output and "OK=1\n" in resident.output
        assert sandbox._shell is not None
    finally:
        await sandbox.close()


@pytest.mark.parametrize("resident", [True, False], ids=["resident", "one-off"])
async def test_a_command_that_closes_its_output_is_still_killed_on_time(
    env: AgentEnv, resident: bool
) -> None:
    """The time-out does not hang on the output: a command that closes it and goes on is
    killed with its group when its time runs out."""
    sandbox = await _sandbox(env)
    try:
        done = await sandbox.run(
            "echo before; exec >&- 2>&-; sleep 300", timeout=1, cwd="/", resident=resident
        )
        assert done.timed_out and done.exit_code == 137 and done.output == "before\n"
        after = await sandbox.run("echo still here", timeout=60, cwd="/", resident=resident)
        assert after.output == "still here\n" and not after.timed_out
    finally:
        await sandbox.close()


async def test_staged_files_limits_and_timeouts_in_the_resident_shell(env: AgentEnv) -> None:
    sandbox = await _sandbox(env)
    try:
        data = bytes(range(256)) * 700  # more than goes inline: a staged file too
        await sandbox.stage_bytes(f"{sandbox.scratch}/small", b"\x00\xff\n")
        await sandbox.stage_bytes(f"{sandbox.scratch}/big", data)
        done = await sandbox.run(
            f"od -An -tx1 {sandbox.scratch}/small; sha256sum < {sandbox.scratch}/big",
            timeout=60,
            cwd="/",
            resident=True,
        )
        assert done.exit_code == 0
        assert done.output.split("\n")[0].split() == ["00", "ff", "0a"]
        assert hashlib.sha256(data).hexdigest() in done.output
        assert await sandbox.read_bytes(f"{sandbox.scratch}/big") == data
        cut = await sandbox.run("yes | head -c 100000", timeout=60, cwd="/", resident=True,
                                max_bytes=1000)  # fmt: skip
        assert cut.truncated and len(cut.output) == 1000 and cut.exit_code == 0
        for size, truncated in ((1000, False), (1001, True)):  # (past the limit: a NUL byte)
            nul = await sandbox.run(f"head -c {size} /dev/zero", timeout=60, cwd="/",
                                    resident=True, max_bytes=1000)  # fmt: skip
            assert (nul.truncated, nul.output) == (truncated, "\0" * 1000)
        slow = await sandbox.run("sleep 30", timeout=1, cwd="/", resident=True)
        assert slow.timed_out
        after = await sandbox.run("echo still here", timeout=60, cwd="/", resident=True)
        assert after.output == "still here\n"
        assert sandbox._shell is not None  # the wrapper's own time-out: the shell goes on
    finally:
        await sandbox.close()
    gone = await env.execute(["ls", "-d", sandbox.scratch], env=None, timeout=60)
    assert gone.exit_code != 0  # removed through the shell, which then ended


async def test_a_broken_shell_is_an_error_and_later_commands_run_as_one_offs(
    env: AgentEnv,
) -> None:
    sandbox = await _sandbox(env)
    try:
        first = await sandbox.run(PID_NS, timeout=60, cwd="/", resident=True)
        assert sandbox._shell is not None
        os.killpg(sandbox._shell._process.pid, signal.SIGKILL)
        # Ended (bwrap, killed; what runs in its PID namespace, killed as it ends): on a busy
        # machine the next command could otherwise still be answered before the kill lands.
        await asyncio.wait_for(sandbox._shell._process.wait(), 60)
        with pytest.raises(EnvError, match="grading shell"):
            await sandbox.run("echo lost", timeout=60, cwd="/", resident=True)
        again = await sandbox.run(PID_NS, timeout=60, cwd="/", resident=True)
        other = await sandbox.run(PID_NS, timeout=60, cwd="/", resident=True)
        assert again.exit_code == 0 and again.output not in (first.output, other.output)
        assert sandbox._shell is None
    finally:
        await sandbox.close()


async def test_no_resident_shell_where_the_path_could_be_written(env: AgentEnv) -> None:
    assert env.workdir is not None
    sandbox = await _sandbox(env, f"{env.workdir}:{READ_ONLY_PATH}")  # the agent writes there
    try:
        first = await sandbox.run(PID_NS, timeout=60, cwd="/", resident=True)
        second = await sandbox.run(PID_NS, timeout=60, cwd="/", resident=True)
        assert first.exit_code == 0 and first.output != second.output
        assert sandbox._shell is None
    finally:
        await sandbox.close()
    sandbox = await _sandbox(env)
    try:
        shell = await sandbox.run(PID_NS, timeout=60, cwd="/", resident=True)
        sandbox.environment["PATH"] = f"{env.workdir}:{READ_ONLY_PATH}"  # (as a pin would)
        later = await sandbox.run(PID_NS, timeout=60, cwd="/", resident=True)
        assert sandbox._shell is not None and later.output != shell.output
    finally:
        await sandbox.close()


async def test_no_resident_shell_without_isolation() -> None:
    env = open_env({"type": "host", "isolation": "none"})
    await env.start()
    try:
        sandbox = await _sandbox(env)
        try:
            done = await sandbox.run("echo one-off", timeout=60, cwd="/", resident=True)
            assert done.output == "one-off\n" and sandbox._shell is None
        finally:
            await sandbox.close()
    finally:
        await env.close()


async def test_a_shell_that_broke_at_close_is_not_handed_over(env: AgentEnv) -> None:
    first, second = await _sandbox(env), await _sandbox(env)
    try:
        await first.run(PID_NS, timeout=60, cwd="/", resident=True)
        assert first._shell is not None
        os.killpg(first._shell._process.pid, signal.SIGKILL)
        # Until the kill has landed, the shell inside bwrap (its own session) may still answer
        # the removal: wait for the shell's end, an event, not for the kernel's timing.
        await first._shell._process.wait()
        await first.close(hand_to=second)
        assert second._shell is None
        done = await second.run("echo fine", timeout=60, cwd="/", resident=True)
        assert done.output == "fine\n" and second._shell is not None  # a shell of its own
    finally:
        await first.close()
        await second.close()


@pytest.fixture
def probe_reward() -> Iterator[str]:
    """A reward whose test counts the resident shells it can see."""
    reset_plugins()

    async def looks(ctx: RewardContext[Any]) -> RewardResult:
        sandbox = ctx.require_sandbox()
        done = await sandbox.run(SHELLS, timeout=60)
        shell = sandbox._shell is not None  # the grader's checks before this one ran there
        return RewardResult(1.0, {"seen": done.output.strip(), "shell": shell})

    @hookimpl
    def uniagent_rewards() -> Iterator[RewardSpec]:
        yield RewardSpec(name="looks-for-the-shell", fn=looks)

    load_plugins().register(types.SimpleNamespace(uniagent_rewards=uniagent_rewards), "t")
    yield "looks-for-the-shell"
    reset_plugins()


async def test_the_tested_code_never_runs_beside_the_resident_shell(
    env: AgentEnv, probe_reward: str
) -> None:
    """The reward's own commands are one-offs: the grader's scripts before them ran in the
    resident shell, which the tested code cannot see, so it cannot reach its pipes."""
    grader = await prepare_grader(env, probe_reward, {})
    result = await grade(grader, env)
    assert result.score == 1.0, result.info
    assert result.info["shell"] and result.info["seen"] == "0"


async def test_in_a_fresh_sandbox_the_reward_takes_over_the_checks_shell(
    env: AgentEnv, probe_reward: str
) -> None:
    """``grade_in: fresh``: the checks and the patch run in one resident shell of the fresh
    sandbox, which the reward's grading sandbox then takes over (one ``bwrap`` for both);
    the tests still cannot see it."""

    def fresh() -> AgentEnv:
        return open_env({"type": "host", "isolation": "bwrap"}, {"post_setup": [SETUP]})

    grader = await prepare_grader(env, probe_reward, {}, grade_in="fresh", fresh_env=fresh)
    result = await grade(grader, env)
    assert result.score == 1.0, result.info
    assert result.info["integrity"]["grade_in"] == "fresh"
    assert result.info["shell"] and result.info["seen"] == "0"
