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


async def test_a_fork_is_a_new_sandbox_from_a_snapshot_in_the_shells_state(fake_modal) -> None:
    """``fork()`` snapshots the sandbox's file system (``snapshot_filesystem``) and starts a
    new sandbox from that image; the child's shell takes the parent's cwd, exports and
    umask. (The fakes share this machine's files, so the copy itself is Modal's part.)"""
    async with open_env(CONFIG) as parent:
        await parent.run_action("mkdir -p /tmp/uniagent-modal-fork && cd $_", timeout=30)
        await parent.run_action("export FORKED='a b' && umask 027", timeout=30)
        fork = await parent.fork()
        first, second = fake_modal.sandboxes
        assert len(first.snapshots) == 1
        assert second.kwargs["image"] is first.snapshots[0]
        async with fork.env as child:
            state = "pwd; echo $FORKED; umask"
            assert await child.communicate(state) == "/tmp/uniagent-modal-fork\na b\n0027\n"
            assert second.running and first.running
        assert not second.running and first.running
        assert await parent.communicate("echo $FORKED") == "a b\n"
    assert not first.running
