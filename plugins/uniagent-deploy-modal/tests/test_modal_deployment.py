"""The ``modal`` deployment, through real SWE-ReX code down to a faked Modal API."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
from modal_fakes import Method
from swerex.deployment.modal import ModalDeployment as SwerexModalDeployment
from swerex.runtime.abstract import Command
from uniagent_deploy_modal import ModalDeployment

from uniagent import get_registry

pytestmark = pytest.mark.asyncio


def make_deployment(**overrides: Any) -> ModalDeployment:
    """A deployment built the way AgentEnv builds one: registry record → config → factory."""
    spec = get_registry().deployments()["modal"]
    config = get_registry().validate_deployment_config(
        {"type": "modal", "install_pipx": False, **overrides}
    )
    return spec.factory(config)


async def run(deployment: ModalDeployment, command: str) -> str:
    """``command``'s output, run by the sandbox's server as a one-off process (SWE-ReX's
    pexpect session gives a prompt 0.1 s after the exit code, and fails on a loaded machine:
    AgentEnv re-synchronises it, a bare session does not)."""
    done = await deployment.runtime.execute(Command(command=command, shell=True, timeout=60))
    assert done.exit_code == 0, done
    return done.stdout.strip()


async def test_factory_does_no_network_io(fake_modal) -> None:
    deployment = make_deployment()
    assert fake_modal.lookups == []
    assert fake_modal.sandboxes == []
    assert isinstance(deployment, ModalDeployment)


async def test_start_runs_commands_in_the_sandbox(fake_modal) -> None:
    deployment = make_deployment()
    await deployment.start()
    try:
        assert await run(deployment, "echo hello from modal") == "hello from modal"
        assert fake_modal.sandbox.running
    finally:
        await deployment.stop()


async def test_sandbox_is_created_with_the_config(fake_modal) -> None:
    deployment = make_deployment(deployment_timeout=1234, modal_sandbox_kwargs={"cpu": 2})
    await deployment.start()
    try:
        kwargs = fake_modal.sandbox.kwargs
        assert kwargs["timeout"] == 1234
        assert kwargs["cpu"] == 2
        assert kwargs["unencrypted_ports"] == [8880]
        assert kwargs["app"] is fake_modal.app
        assert fake_modal.lookups == [(("swe-rex",), {"create_if_missing": True})]
        assert "swerex-remote" in fake_modal.sandbox.args[-1]
    finally:
        await deployment.stop()


async def test_commands_use_the_cores_runtime_without_the_300_s_cap(fake_modal) -> None:
    from uniagent.sandbox import retrying_runtime_class

    deployment = make_deployment(runtime_timeout=20, request_margin=5, retries=1)
    await deployment.start()
    try:
        runtime = deployment.runtime
        # SWE-ReX's own RemoteRuntime would leave a command to aiohttp's 300 s total timeout.
        assert isinstance(runtime, retrying_runtime_class())
        assert (runtime.request_timeout, runtime.request_margin, runtime.retries) == (20, 5, 1)
        assert await run(deployment, "sleep 1 && echo slept") == "slept"
    finally:
        await deployment.stop()


async def test_stop_terminates_a_running_sandbox(fake_modal) -> None:
    deployment = make_deployment()
    await deployment.start()
    assert fake_modal.sandbox.running
    await deployment.stop()
    assert fake_modal.sandbox.terminate_calls == 1
    assert not fake_modal.sandbox.running


async def test_upstream_stop_leaks_a_running_sandbox(fake_modal) -> None:
    """Why the plugin overrides stop(): SWE-ReX 1.4.0's own stop() leaves it running.

    When this test fails, SWE-ReX fixed the bug and the override can go.
    """
    upstream = SwerexModalDeployment(image="python:3.11", install_pipx=False, startup_timeout=60)
    await upstream.start()
    await upstream.stop()
    assert fake_modal.sandbox.terminate_calls == 0
    assert fake_modal.sandbox.running


async def test_stop_twice_is_harmless(fake_modal) -> None:
    deployment = make_deployment()
    await deployment.start()
    await deployment.stop()
    await deployment.stop()
    assert fake_modal.sandbox.terminate_calls == 1


async def test_stop_terminates_even_when_the_server_is_gone(fake_modal) -> None:
    deployment = make_deployment(runtime_timeout=2)
    await deployment.start()
    fake_modal.sandbox.kill_server()
    await deployment.stop()
    assert fake_modal.sandbox.terminate_calls == 1
    assert not fake_modal.sandbox.running


async def test_stop_terminates_even_when_the_server_hangs(fake_modal) -> None:
    deployment = make_deployment(runtime_timeout=2)
    await deployment.start()
    fake_modal.sandbox.freeze_server()
    await asyncio.wait_for(deployment.stop(), timeout=30)
    assert fake_modal.sandbox.terminate_calls == 1
    assert not fake_modal.sandbox.running


async def test_is_alive_follows_the_sandbox(fake_modal) -> None:
    deployment = make_deployment()
    assert await deployment.is_alive() is False
    await deployment.start()
    assert await deployment.is_alive() is True
    fake_modal.sandbox.kill()
    assert await deployment.is_alive() is False
    await deployment.stop()
    assert await deployment.is_alive() is False


async def test_failed_start_terminates_the_sandbox(fake_modal, monkeypatch) -> None:
    # The server never comes up: the command exits, the "container" stays (like `sleep`).
    monkeypatch.setattr(SwerexModalDeployment, "_start_swerex_cmd", lambda self, token: "sleep 600")
    deployment = make_deployment(sandbox_start_timeout=1.5)
    with pytest.raises(TimeoutError, match="sandbox_start_timeout"):
        await deployment.start()
    assert fake_modal.sandbox.terminate_calls == 1
    assert not fake_modal.sandbox.running
    with pytest.raises(RuntimeError, match="not started"):
        deployment.runtime  # noqa: B018 - the property raises


async def test_start_never_blocks_the_event_loop(fake_modal, monkeypatch) -> None:
    loop_thread = threading.get_ident()
    lookup_threads: list[int] = []
    real_lookup = fake_modal.lookup

    def lookup(*args: Any, **kwargs: Any) -> object:
        lookup_threads.append(threading.get_ident())
        return real_lookup(*args, **kwargs)

    fake_modal.lookup = lookup  # type: ignore[method-assign]
    import modal

    monkeypatch.setattr(modal.App, "lookup", Method(lookup))
    real_sleep = time.sleep

    def sleep(seconds: float) -> None:
        assert threading.get_ident() != loop_thread, "time.sleep on the event loop thread"
        real_sleep(seconds)

    monkeypatch.setattr(time, "sleep", sleep)
    fake_modal.boot_seconds = 2.5  # several probes fail before the server answers
    deployment = make_deployment()
    await deployment.start()
    try:
        assert lookup_threads and loop_thread not in lookup_threads
        await asyncio.sleep(0)
    finally:
        await deployment.stop()


async def test_missing_credentials_read_like_instructions(monkeypatch) -> None:
    import modal

    def no_token(*args: Any, **kwargs: Any) -> object:
        raise modal.exception.AuthError("Token missing")

    monkeypatch.setattr(modal.App, "lookup", no_token)
    deployment = make_deployment()
    with pytest.raises(RuntimeError, match=r"modal token new.*MODAL_TOKEN_ID"):
        await deployment.start()
