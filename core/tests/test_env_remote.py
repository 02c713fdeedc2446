"""The remote deployment against a real ``swerex-remote`` server (needs ``uniagent[swerex]``)."""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import swerex  # noqa: F401 - the swerex extra is part of the core test environment
from pydantic import BaseModel

from uniagent import ToolSpec, open_env
from uniagent.env import (
    ActionSyntaxError,
    ActionTimeoutError,
    AgentEnv,
    EnvStartError,
    RemoteDeployment,
    RemoteDeploymentConfig,
    TerminalNotAliveError,
)
from uniagent.env.remote import make_runtime
from uniagent.env.runtime import BashAction, ReadFileRequest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def swerex_remote() -> str:
    found = shutil.which("swerex-remote", path=os.path.dirname(sys.executable))
    return found or shutil.which("swerex-remote") or "swerex-remote"


def start_server(
    port: int, token: str, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [swerex_remote(), "--host", "127.0.0.1", "--port", str(port), "--auth-token", token],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env=env,
    )


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def server() -> Iterator[dict[str, Any]]:
    port, token = free_port(), secrets.token_hex(8)
    proc = start_server(port, token)
    try:
        yield {"type": "remote", "host": "http://127.0.0.1", "port": port, "auth_token": token}
    finally:
        stop_server(proc)


@pytest_asyncio.fixture
async def env(server: dict[str, Any]) -> AsyncIterator[AgentEnv]:
    async with open_env(server, {"workdir": "/tmp"}) as env:
        yield env


async def test_commands_state_and_exit_codes(env: AgentEnv) -> None:
    assert (await env.run_action("pwd")).output.strip() == "/tmp"
    await env.run_action("mkdir -p uniagent-remote && cd uniagent-remote && export V=7")
    obs = await env.run_action("echo $PWD $V; echo err >&2")
    assert obs.output.strip() == "/tmp/uniagent-remote 7\nerr"
    assert (await env.run_action("false")).exit_code == 1
    assert (await env.run_action("echo $PAGER")).output.strip() == "cat"


async def test_late_prompts_lose_no_exit_code_and_leave_none_behind(env: AgentEnv) -> None:
    # Every prompt 0.3 s late, as on a busy machine: SWE-ReX's own exit-status step waits
    # 0.1 s for its last prompt (the status was then lost, the output kept SWE-ReX's mark,
    # and the prompt left over answered the next command before it ran).
    await env.run_action("PROMPT_COMMAND='sleep 0.3'")
    for command, output, code in [
        ("pwd", "/tmp\n", 0),
        ("echo out; false", "out\n", 1),
        ("printf no-newline; (exit 7)", "no-newline", 7),
        ("echo $PWD", "/tmp\n", 0),
        ("[[ -n x ]] && echo yes; (exit 5)", "yes\n", 5),  # bashlex cannot split these
        ("echo $((6 * 7))\necho two lines", "42\ntwo lines\n", 0),
        ("echo $PWD", "/tmp\n", 0),
    ]:
        obs = await env.run_action(command)
        assert (obs.output, obs.exit_code) == (output, code), command
    with pytest.raises(ActionTimeoutError):
        await env.run_action("sleep 100", timeout=1)
    obs = await env.run_action("echo after the timeout")
    assert (obs.output, obs.exit_code) == ("after the timeout\n", 0)


async def test_output_that_holds_the_prompts_mark_is_kept_whole(env: AgentEnv) -> None:
    # `env`, `set` and `echo $PS1` print SWE-ReX's mark: SWE-ReX takes it for the prompt.
    obs = await env.run_action("echo $PS1; echo after; (exit 4)")
    assert obs.exit_code == 4
    assert obs.output.endswith("SHELLPS1PREFIX\nafter\n") and "$?" in obs.output, obs
    assert (await env.run_action("env | grep -c '^PS1='")).output == "1\n"
    obs = await env.run_action("echo aligned; false")
    assert (obs.output, obs.exit_code) == ("aligned\n", 1)


def test_a_shell_whose_first_prompt_is_the_mark_is_aligned(tmp_path: Path) -> None:
    # No start-up file sets another PS1 (an image without a bashrc; here a ~/.bashrc that
    # sets SWE-ReX's own): SWE-ReX's start reads the first of two prompts, and the second
    # answered the next command before it ran.
    home = tmp_path / "home"
    home.mkdir()
    (home / ".bashrc").write_text("PS1=SHELLPS1PREFIX\n")
    port, token = free_port(), secrets.token_hex(8)
    proc = start_server(port, token, {**os.environ, "HOME": str(home)})

    async def commands() -> list[tuple[str, int | None]]:
        config = {"type": "remote", "host": "http://127.0.0.1", "port": port,
                  "auth_token": token, "server_start_timeout": 60}  # fmt: skip
        async with open_env(config, {"workdir": "/tmp"}) as env:
            return [
                ((obs := await env.run_action(c)).output, obs.exit_code)
                for c in ("pwd", "echo one; false", "echo two")
            ]

    try:
        assert asyncio.run(commands()) == [("/tmp\n", 0), ("one\n", 1), ("two\n", 0)]
    finally:
        stop_server(proc)


async def test_commands_bashlex_cannot_split_keep_output_and_status(env: AgentEnv) -> None:
    # SWE-ReX sends these line by line and awaits a mark of its own (not one prompt).
    for command, output, code in [
        ("[[ -n x ]] && echo yes", "yes\n", 0),
        ("echo $((6 * 7)); (exit 3)", "42\n", 3),
        ("case a in a) echo one;; esac", "one\n", 0),
    ]:
        obs = await env.run_action(command)
        assert (obs.output, obs.exit_code) == (output, code), command
    assert (await env.run_action("echo aligned")).output == "aligned\n"


async def test_syntax_errors(env: AgentEnv) -> None:
    with pytest.raises(ActionSyntaxError) as info:
        await env.run_action("if true; then echo x")
    assert "syntax error" in str(info.value)


async def test_timeout_recovers_the_session(env: AgentEnv) -> None:
    await env.run_action("cd / && W=kept")
    with pytest.raises(ActionTimeoutError) as info:
        await env.run_action("echo before; sleep 100", timeout=2)
    assert "before" in info.value.partial_output
    assert (await env.run_action("echo $PWD $W")).output.strip() == "/ kept"


async def test_files_and_tools(env: AgentEnv, tmp_path: Path) -> None:
    await env.write_file("/tmp/uniagent-remote-file.txt", "héllo\n")
    assert await env.read_file("/tmp/uniagent-remote-file.txt") == "héllo\n"
    tree = tmp_path / "tree"
    (tree / "pkg").mkdir(parents=True)
    (tree / "pkg" / "m.py").write_text("m = 1\n")
    target = f"/tmp/uniagent-remote-{secrets.token_hex(4)}"
    await env.upload(tree, target)
    assert (await env.run_action(f"cat {target}/pkg/m.py")).output == "m = 1\n"

    class NoArgs(BaseModel):
        pass

    script = tmp_path / "hello-remote"
    script.write_text("#!/bin/sh\necho remote says hi\n")
    tool = ToolSpec(name="hello", description="d", arguments=NoArgs, scripts=(script,))
    await env.install_tools([tool])
    assert (await env.run_action("hello-remote")).output.strip() == "remote says hi"


async def test_exit_is_terminal_not_alive(server: dict[str, Any]) -> None:
    async with open_env(server) as env:
        with pytest.raises(TerminalNotAliveError):
            await env.run_action("exit 0")
            await env.run_action("echo still here?")  # SWE-ReX may notice only on the next call


async def test_a_wrong_token_is_a_start_error(server: dict[str, Any]) -> None:
    config = {**server, "auth_token": "wrong", "server_start_timeout": 2}
    with pytest.raises(EnvStartError, match="did not answer"):
        await open_env(config).start()


async def test_start_waits_for_a_server_that_comes_up_later() -> None:
    port, token = free_port(), secrets.token_hex(8)
    deployment = RemoteDeployment(
        RemoteDeploymentConfig(port=port, auth_token=token, server_start_timeout=60)
    )
    env = AgentEnv(deployment)
    starting = asyncio.ensure_future(env.start())
    await asyncio.sleep(1.0)
    assert not starting.done()
    proc = start_server(port, token)
    try:
        await starting
        assert (await env.run_action("echo up")).output.strip() == "up"
        await env.close()
    finally:
        stop_server(proc)


async def test_requests_are_retried_until_the_server_answers() -> None:
    port, token = free_port(), secrets.token_hex(8)
    runtime = make_runtime(host="127.0.0.1", port=port, auth_token=token, retries=8)
    proc: subprocess.Popen[bytes] | None = None

    async def late_server() -> None:
        nonlocal proc
        await asyncio.sleep(1.0)
        proc = start_server(port, token)

    try:
        starter = asyncio.ensure_future(late_server())
        started = time.monotonic()
        response = await runtime.read_file(ReadFileRequest(path="/etc/hostname"))
        await starter
        assert response.content and time.monotonic() - started >= 1.0
    finally:
        if proc is not None:
            stop_server(proc)


def test_command_http_timeout_outlasts_the_command() -> None:
    runtime = make_runtime(host="127.0.0.1", port=1, auth_token="t", request_margin=30)
    assert runtime._http_timeout(BashAction(command="x", timeout=1000)).total == 1030
    assert runtime._http_timeout(BashAction(command="x", timeout=None)).total is None
    assert runtime._http_timeout(ReadFileRequest(path="/x")).total == 120
