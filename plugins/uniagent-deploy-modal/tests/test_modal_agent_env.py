"""``AgentEnv`` on ``{"type": "modal"}``: uniagent's sandbox API over a (faked) Modal sandbox."""

from __future__ import annotations

import pytest

from uniagent import open_env

pytestmark = pytest.mark.asyncio

CONFIG = {"type": "modal", "image": "python:3.11", "install_pipx": False}


async def test_agent_env_runs_commands_in_a_modal_sandbox(fake_modal) -> None:
    async with open_env(CONFIG) as env:
        obs = await env.run_action("echo $((6 * 7)) && false", timeout=30)
        assert obs.output.strip() == "42"
        assert obs.exit_code == 1
        cd = await env.run_action("mkdir -p /tmp/uniagent-modal-test && cd $_ && pwd", timeout=30)
        assert cd.output.strip() == "/tmp/uniagent-modal-test"
        # The session persists between actions, as in any uniagent sandbox.
        assert (await env.run_action("pwd", timeout=30)).output.strip() == cd.output.strip()
        assert await env.is_alive()
    assert not fake_modal.sandbox.running


async def test_agent_env_reads_and_writes_files(fake_modal, tmp_path) -> None:
    target = tmp_path / "sub" / "note.txt"
    async with open_env(CONFIG) as env:
        await env.write_file(str(target), "written through the Modal runtime\n")
        assert await env.read_file(str(target)) == "written through the Modal runtime\n"
        assert (await env.run_action(f"cat {target}", timeout=30)).output.strip() == (
            "written through the Modal runtime"
        )


async def test_agent_env_close_terminates_the_running_sandbox(fake_modal) -> None:
    env = open_env(CONFIG)
    await env.start()
    sandbox = fake_modal.sandbox
    assert sandbox.running
    await env.close()
    assert sandbox.terminate_calls == 1
    assert not sandbox.running
    assert not await env.is_alive()
