"""The local deployment: a real container (docker, else podman) running ``swerex-remote``.

No registry is reachable here, so the image is built offline on first use:
``debootstrap --variant=minbase bookworm`` plus swe-rex installed from wheels
that pip downloads on the host, imported with ``podman import`` (about 2-3
minutes, then cached by the engine). ``UNIAGENT_TEST_IMAGE`` names another
image that has ``swerex-remote`` on PATH. Where no engine works, the tests
are skipped and the reason is printed.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import BaseModel

from uniagent import ToolSpec, open_env
from uniagent.env import (
    ActionTimeoutError,
    AgentEnv,
    EnvStartError,
    LocalDeployment,
    ShellKilledError,
)
from uniagent.env.local import LocalDeploymentConfig
from uniagent.testing.images import TEST_IMAGE, engine_with_test_image, run

IMAGE = TEST_IMAGE

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def engine() -> Iterator[str]:
    yield engine_with_test_image(IMAGE)


def _containers(engine: str, name: str) -> str:
    return run([engine, "ps", "-a", "--filter", f"name={name}", "-q"], timeout=60).stdout.strip()


class _NoArgs(BaseModel):
    pass


async def test_a_container_episode(engine: str, tmp_path: Path) -> None:
    deployment = LocalDeployment(LocalDeploymentConfig(image=IMAGE, engine=engine, pull="never"))
    env = AgentEnv(deployment, {"workdir": "/testbed"})
    await env.start()
    try:
        name = deployment.container_name
        assert name and _containers(engine, name)
        assert (await env.run_action("pwd")).output.strip() == "/testbed"
        await env.run_action("mkdir -p src && cd src && export V=1")
        assert (await env.run_action("echo $PWD $V $PAGER")).output.strip() == "/testbed/src 1 cat"

        script = tmp_path / "inside"
        script.write_text('#!/bin/sh\necho "tool at $0"\n')
        tool = ToolSpec(name="inside", description="d", arguments=_NoArgs, scripts=(script,))
        await env.install_tools([tool])
        assert (await env.run_action("inside")).output.strip() == (
            "tool at /usr/local/uniagent/tools/inside"
        )

        await env.write_file("notes.txt", "héllo\n")
        assert await env.read_file("/testbed/notes.txt") == "héllo\n"

        with pytest.raises(ActionTimeoutError):
            await env.run_action("sleep 100", timeout=2)
        assert (await env.run_action("echo $V")).output.strip() == "1"
    finally:
        await env.close()
    assert not _containers(engine, name)


async def test_a_missing_image_fails_to_start_with_the_reason(engine: str) -> None:
    config = {"type": "local", "image": "localhost/uniagent-no-such-image:1", "engine": engine,
              "pull": "never", "retries": 1, "server_start_timeout": 30}  # fmt: skip
    with pytest.raises(EnvStartError) as info:
        await open_env(config).start()
    assert "2 tries" in str(info.value)


async def test_stopping_the_agent_ends_every_process_in_the_container(engine: str) -> None:
    deployment = LocalDeployment(LocalDeploymentConfig(image=IMAGE, engine=engine, pull="never"))
    env = AgentEnv(deployment, {"workdir": "/testbed"})
    await env.start()
    try:
        await env.run_action("setsid sleep 1000 >/dev/null 2>&1 < /dev/null & sleep 999 & true")
        await env.stop_agent()
        listing = await env.execute(
            ["/bin/sh", "-c", "cat /proc/[0-9]*/cmdline | tr '\\0' ' '"],
            env={"PATH": "/usr/bin:/bin"},
        )
        assert "sleep" not in listing.stdout, listing.stdout
        assert await env.sandbox_alive(), "the container and its server stay up for grading"
    finally:
        await env.close()


async def test_limits_reach_the_container(engine: str) -> None:
    config = LocalDeploymentConfig(
        image=IMAGE, engine=engine, pull="never", limits={"pids": 64, "memory": "128m"}
    )
    env = AgentEnv(LocalDeployment(config), {"workdir": "/testbed"})
    await env.start()
    try:
        obs = await env.run_action(
            "cat /sys/fs/cgroup/pids.max /sys/fs/cgroup/pids/pids.max 2>/dev/null; "
            "cat /sys/fs/cgroup/memory.max /sys/fs/cgroup/memory/memory.limit_in_bytes "
            "2>/dev/null; true"
        )
        assert "64" in obs.output.split() and str(128 << 20) in obs.output.split()
    finally:
        await env.close()


@pytest.mark.parametrize("kill", ["kill -9 $PPID", "kill -KILL -1"], ids=["server", "all"])
async def test_a_command_that_kills_the_containers_server_killed_its_own_shell(
    engine: str, kill: str
) -> None:
    # The policy's doing (agent_killed_shell, trained on), as on the host: not a sandbox
    # that died under it (masked and retried).
    deployment = LocalDeployment(LocalDeploymentConfig(image=IMAGE, engine=engine, pull="never"))
    env = AgentEnv(deployment, {"workdir": "/testbed"})
    await env.start()
    try:
        with pytest.raises(ShellKilledError):
            await env.run_action(f"{kill}; sleep 5", timeout=60)
        assert not await env.sandbox_alive()
        assert await env.ended_from_inside()
    finally:
        await env.close()
    assert not await env.ended_from_inside(), "closing it is not an end from inside"


async def test_a_container_forks_with_its_files_cwd_and_exports(engine: str) -> None:
    """``fork()`` commits the container's changes to an image and starts a new container
    from it; the shell's cwd, exports and umask are carried, the writes are not shared,
    and both containers and the image are gone once closed."""
    config = LocalDeploymentConfig(image=IMAGE, engine=engine, pull="never")
    async with AgentEnv(LocalDeployment(config), {"workdir": "/testbed"}) as parent:
        setup = "mkdir -p pkg && echo one > pkg/a.txt && cd pkg && export V='a b' && umask 027"
        assert (await parent.run_action(setup)).exit_code == 0
        fork = await parent.fork()
        child_deployment = fork.env.deployment
        image = child_deployment._fork_image
        async with fork.env as child:
            names = [parent.deployment.container_name, child_deployment.container_name]
            assert names[0] != names[1] and all(_containers(engine, n) for n in names)
            state = "pwd; echo $V; umask; cat a.txt"
            assert await child.communicate(state) == await parent.communicate(state)
            assert await child.communicate(state) == "/testbed/pkg\na b\n0027\none\n"
            await child.communicate("echo child > a.txt")
            await parent.communicate("echo parent > b.txt")
            assert await parent.communicate("cat a.txt; ls -1") == "one\na.txt\nb.txt\n"
            assert await child.communicate("cat a.txt; ls -1") == "child\na.txt\n"
        assert not _containers(engine, names[1])
        assert run([engine, "image", "exists", image], timeout=60).returncode != 0
        assert await parent.communicate("cat a.txt") == "one\n"


async def test_a_fork_of_a_fork_outlives_its_parent_and_leaves_no_image(engine: str) -> None:
    """A fork's image is the base of its own forks' images: removed when that fork closes
    (the engine keeps the layers its forks' images are built on), and the fork of the fork
    runs on; once all are closed, no fork image is left."""
    config = LocalDeploymentConfig(image=IMAGE, engine=engine, pull="never")
    async with AgentEnv(LocalDeployment(config), {"workdir": "/testbed"}) as parent:
        await parent.communicate("echo 0 > gen")
        first = (await parent.fork()).env
        second = None
        try:
            await first.communicate("echo 1 > gen")
            second = (await first.fork()).env
            images = [first.deployment._fork_image, second.deployment._fork_image]
            await first.close()
            assert run([engine, "image", "exists", images[0]], timeout=60).returncode != 0
            assert await second.communicate("cat gen; echo 2 > gen; cat gen") == "1\n2\n"
        finally:
            if second is not None:
                await second.close()
            await first.close()
        for image in images:
            assert run([engine, "image", "exists", image], timeout=60).returncode != 0, image
        assert await parent.communicate("cat gen") == "0\n"
