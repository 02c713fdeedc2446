"""The host deployment through AgentEnv, against real bash processes."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest
from pydantic import BaseModel

from uniagent import ToolSpec, open_env
from uniagent.env import (
    ActionSyntaxError,
    ActionTimeoutError,
    AgentEnv,
    EnvConfig,
    EnvError,
    EnvStartError,
    HostDeployment,
    HostDeploymentConfig,
    NonZeroExitError,
    TerminalNotAliveError,
    ToolInstallError,
    procfs,
)
from uniagent.env.runtime import Command


def running(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie (dead but not yet reaped by its parent)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] not in "ZX"


#: These tests are about the host runtime itself (host paths): no bubblewrap.
HOST = {"type": "host", "isolation": "none"}


async def host_env(**env_settings: object) -> AgentEnv:
    deployment = HostDeployment(HostDeploymentConfig(isolation="none"))
    env = AgentEnv(deployment, EnvConfig(**env_settings))
    await env.start()
    return env


async def test_cd_and_variables_persist() -> None:
    async with open_env(HOST) as env:
        assert env.workdir is not None and env.cwd == env.workdir
        assert (await env.run_action("pwd")).output.strip() == env.workdir
        await env.run_action("mkdir sub && cd sub && export GREETING=hello; COUNT=3")
        obs = await env.run_action('echo "$PWD $GREETING $COUNT"')
        assert obs.output == f"{env.workdir}/sub hello 3\n"
        assert obs.exit_code == 0
        assert (await env.run_action("false")).exit_code == 1
        assert (await env.run_action("(exit 7)")).exit_code == 7
        assert (await env.run_action("echo $PAGER $GIT_PAGER $TERM")).output == "cat cat dumb\n"


async def test_stdout_and_stderr_are_merged_in_order() -> None:
    async with open_env(HOST) as env:
        obs = await env.run_action("echo out; echo err >&2; echo out2")
        assert obs.output == "out\nerr\nout2\n"


async def test_timeout_interrupts_and_the_session_goes_on() -> None:
    async with open_env(HOST) as env:
        await env.run_action("cd /tmp && X=kept")
        with pytest.raises(ActionTimeoutError) as info:
            await env.run_action(f"echo before; sleep 1000; touch {env.workdir}/after", timeout=1)
        # (on a saturated machine the interrupt may even beat `echo before`)
        assert info.value.partial_output in ("before\n", "")
        obs = await env.run_action("echo $PWD $X")
        assert obs.output == "/tmp kept\n"
        # Nothing after the interrupted part ran, and nothing of the line still runs.
        assert not Path(env.workdir or "", "after").exists()
        session = env.runtime.sessions["default"]
        assert session.pid is not None and procfs.children(session.pid) == []


async def test_timeout_aborts_a_whole_loop() -> None:
    async with open_env(HOST) as env:
        with pytest.raises(ActionTimeoutError):
            await env.run_action("for i in $(seq 100); do sleep 0.2; echo $i >> n.txt; done", 1)
        count = (await env.run_action("wc -l < n.txt")).output.strip()
        # bash answered, so the loop (run by bash itself) is not running; nor is a sleep.
        session = env.runtime.sessions["default"]
        assert session.pid is not None and procfs.children(session.pid) == []
        assert (await env.run_action("wc -l < n.txt")).output.strip() == count


async def test_a_command_ignoring_sigint_is_still_stopped() -> None:
    async with open_env(HOST) as env:
        with pytest.raises(ActionTimeoutError):
            await env.run_action("trap '' INT; sleep 100", timeout=1)
        assert (await env.run_action("echo alive")).output == "alive\n"


async def test_a_command_ignoring_sigint_and_sigterm_is_killed() -> None:
    async with open_env(HOST) as env:
        with pytest.raises(ActionTimeoutError):
            await env.run_action("trap '' INT TERM; echo stubborn; sleep 100", timeout=1)
        await env.run_action("trap - INT TERM")
        assert (await env.run_action("echo alive")).output == "alive\n"


async def test_exit_ends_the_session() -> None:
    env = await host_env()
    try:
        with pytest.raises(TerminalNotAliveError) as info:
            await env.run_action("echo bye; exit 3")
        assert "bye" in info.value.partial_output
        with pytest.raises(TerminalNotAliveError):
            await env.run_action("echo again")
        assert not await env.is_alive()
    finally:
        await env.close()


async def test_unicode_and_binary_output() -> None:
    async with open_env(HOST) as env:
        text = "héllo wörld 你好 🎉"
        assert (await env.run_action(f"echo '{text}'")).output == text + "\n"
        obs = await env.run_action(r"printf 'a\xff\xfe\x00b\n'")
        assert obs.output == "a\\xff\\xfeb\n"  # invalid UTF-8 escaped, NUL dropped


async def test_huge_output_is_truncated_with_the_exact_count() -> None:
    env = await host_env(max_output_chars=1000)
    try:
        obs = await env.run_action("head -c 100000 /dev/zero | tr '\\0' x; echo; echo END")
        total = 100000 + 1 + 4  # the x's, a newline, "END\n"
        assert obs.output.startswith("x" * 500)
        assert obs.output.endswith("x" * 495 + "\nEND\n")
        assert f"[... {total - 1000} characters of output omitted" in obs.output
    finally:
        await env.close()


async def test_output_beyond_the_runtime_buffer_is_counted() -> None:
    deployment = HostDeployment(HostDeploymentConfig(isolation="none", max_output_bytes=100_000))
    async with AgentEnv(deployment, EnvConfig(max_output_chars=1000)) as env:
        obs = await env.run_action("head -c 3000000 /dev/zero | tr '\\0' y")
        assert obs.output == "y" * 500 + obs.output[500:-500] + "y" * 500
        assert "[... 2999000 characters of output omitted" in obs.output
        assert (await env.run_action("echo ok")).output == "ok\n"


async def test_ansi_codes_and_carriage_returns_are_cleaned() -> None:
    async with open_env(HOST) as env:
        obs = await env.run_action(
            r"printf '\033[1;31mred\033[0m\nprogress 10%%\rprogress 100%%\r\nwin\r\n'"
        )
        assert obs.output == "red\nprogress 100%\nwin\n"


async def test_syntax_error_raises_before_anything_runs() -> None:
    async with open_env(HOST) as env:
        with pytest.raises(ActionSyntaxError) as info:
            await env.run_action("touch ran.txt\nif true; then echo x")
        assert "syntax error" in str(info.value) or "unexpected" in str(info.value)
        assert (await env.run_action("ls")).output == ""  # touch did not run
        with pytest.raises(ActionSyntaxError):
            await env.run_action("echo 'unterminated")
        assert (await env.run_action("echo fine")).output == "fine\n"


async def test_commands_do_not_read_the_sessions_input() -> None:
    async with open_env(HOST) as env:
        obs = await env.run_action("cat; read -r line; echo read=$?", timeout=5)
        assert obs.output == "read=1\n"


async def test_file_round_trips_and_uploads(tmp_path: Path) -> None:
    async with open_env(HOST) as env:
        await env.write_file("notes/a.txt", "héllo\nworld\n")
        assert await env.read_file("notes/a.txt") == "héllo\nworld\n"
        assert (await env.run_action("cat notes/a.txt")).output == "héllo\nworld\n"
        absolute = f"{env.workdir}/notes/a.txt"
        assert await env.read_file(absolute) == "héllo\nworld\n"

        single = tmp_path / "one.py"
        single.write_text("print('one')\n")
        await env.upload(single, "up/one.py")
        assert (await env.run_action("cat up/one.py")).output == "print('one')\n"

        tree = tmp_path / "tree"
        (tree / "pkg").mkdir(parents=True)
        (tree / "pkg" / "mod.py").write_text("x = 1\n")
        (tree / "top.txt").write_text("top\n")
        await env.upload(tree, "repo")
        listing = await env.run_action("cd repo && find . -type f | sort")
        assert listing.output == "./pkg/mod.py\n./top.txt\n"
        with pytest.raises(FileNotFoundError):
            await env.read_file("missing.txt")


async def test_communicate_check_raises_on_nonzero() -> None:
    async with open_env(HOST) as env:
        assert await env.communicate("echo yes", check=True) == "yes\n"
        with pytest.raises(NonZeroExitError) as info:
            await env.communicate("echo no; exit_code() { return 4; }; exit_code", check=True)
        assert info.value.exit_code == 4 and "no" in info.value.output


async def test_execute_runs_a_one_off_command() -> None:
    async with open_env(HOST) as env:
        response = await env.runtime.execute(Command(command="pwd; echo err >&2", shell=True))
        assert response.stdout == f"{env.workdir}\n" and response.stderr == "err\n"
        assert response.exit_code == 0
        assert (await env.runtime.execute(Command(command="pwd"))).stdout == f"{env.workdir}\n"


class _NoArgs(BaseModel):
    pass


async def test_install_tools_uploads_scripts_and_runs_install_once(tmp_path: Path) -> None:
    script = tmp_path / "greet"
    script.write_text('#!/bin/sh\necho "hello $1"\n')
    counter = tmp_path / "installs"
    tool = ToolSpec(
        name="greet",
        description="d",
        arguments=_NoArgs,
        scripts=(script,),
        install=f"echo x >> {counter}",
    )
    async with open_env(HOST) as env:
        await env.install_tools([tool])
        await env.install_tools([tool])
        assert (await env.run_action("greet world")).output == "hello world\n"
        assert (await env.run_action("command -v greet")).output == f"{env.tools_dir}/greet\n"
        assert counter.read_text() == "x\n"


async def test_a_failing_tool_install_names_the_tool(tmp_path: Path) -> None:
    bad = ToolSpec(name="broken", description="d", arguments=_NoArgs, install="echo oops; exit 2")
    async with open_env(HOST) as env:
        with pytest.raises(ToolInstallError) as info:
            await env.install_tools([bad])
        assert info.value.tool == "broken" and "oops" in info.value.output
        missing = ToolSpec(
            name="ghost", description="d", arguments=_NoArgs, scripts=(tmp_path / "nope",)
        )
        with pytest.raises(ToolInstallError, match="ghost"):
            await env.install_tools([missing])


async def test_post_setup_and_its_failure() -> None:
    env = await host_env(post_setup="export READY=yes", env={"EXTRA": "1"})
    try:
        assert (await env.run_action("echo $READY $EXTRA")).output == "yes 1\n"
    finally:
        await env.close()
    failing = open_env(HOST, {"post_setup": ["false"]})
    with pytest.raises(EnvStartError, match="false"):
        await failing.start()


async def test_not_started_and_closed_envs_refuse_commands() -> None:
    env = open_env(HOST)
    with pytest.raises(EnvError, match="not started"):
        await env.run_action("echo hi")
    await env.close()  # closing a never-started env is fine
    with pytest.raises(TerminalNotAliveError):
        await env.run_action("echo hi")


async def test_close_removes_the_work_dir_and_every_process() -> None:
    deployment = HostDeployment(HostDeploymentConfig(isolation="none"))
    env = AgentEnv(deployment)
    await env.start()
    root = deployment.root
    assert root is not None and root.is_dir()
    bash_pid = int((await env.run_action("echo $$")).output)
    job_pid = int((await env.run_action("sleep 1000 & echo $!")).output.split()[-1])
    nohup = await env.run_action("nohup sleep 1000 >/dev/null 2>&1 & echo $!")
    nohup_pid = int(nohup.output.split()[-1])
    assert all(running(p) for p in (bash_pid, job_pid, nohup_pid))
    await env.close()
    await env.close()  # idempotent
    deadline = time.monotonic() + 60  # an upper bound for SIGKILL to land, not a timing
    while time.monotonic() < deadline and any(running(p) for p in (bash_pid, job_pid, nohup_pid)):
        await asyncio.sleep(0.05)
    assert not any(running(p) for p in (bash_pid, job_pid, nohup_pid))
    assert not root.exists()
    assert not await env.is_alive()


async def test_close_on_a_dead_session_does_not_raise() -> None:
    env = await host_env()
    with pytest.raises(TerminalNotAliveError):
        await env.run_action("kill -9 $$")
    await env.close()


async def test_config_validation() -> None:
    with pytest.raises(ValueError, match="bwrap"):
        HostDeploymentConfig(isolation="none", network=False)
    with pytest.raises(ValueError, match="HOST:INSIDE applies only with isolation: bwrap"):
        HostDeploymentConfig(isolation="none", ro_binds=["/opt:/data"])
    assert HostDeploymentConfig(ro_binds=["/opt"]).ro_binds == ["/opt"]  # visible anyway
    with pytest.raises(ValueError):
        HostDeploymentConfig(bogus=1)  # type: ignore[call-arg]
    assert EnvConfig(post_setup="a").post_setup == ["a"]


async def test_a_missing_bash_is_a_start_error() -> None:
    env = AgentEnv(HostDeployment(HostDeploymentConfig(bash="no-such-bash-here")))
    with pytest.raises(EnvStartError, match="no-such-bash-here"):
        await env.start()


async def test_base_dir_is_used(tmp_path: Path) -> None:
    deployment = HostDeployment(
        HostDeploymentConfig(isolation="none", base_dir=str(tmp_path / "episodes"))
    )
    async with AgentEnv(deployment) as env:
        assert env.workdir is not None and env.workdir.startswith(str(tmp_path / "episodes"))
    assert os.listdir(tmp_path / "episodes") == []


@pytest.mark.parametrize("isolation", ["none", "bwrap"])
async def test_the_session_never_preempts_the_event_loop(isolation: str) -> None:
    """bash (and every command it starts) is SCHED_BATCH: waking it to run a command does
    not take the CPU from the loop driving the other sessions."""
    async with open_env({"type": "host", "isolation": isolation}) as env:
        pid = env.deployment.runtime.sessions["default"].pid  # type: ignore[attr-defined]
        assert os.sched_getscheduler(pid) == os.SCHED_BATCH
        # A command's own processes inherit it (policy 3 is SCHED_BATCH in /proc).
        obs = await env.run_action("cut -d' ' -f41 /proc/self/stat")
        assert obs.output == f"{os.SCHED_BATCH}\n"
