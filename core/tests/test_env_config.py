"""Deployment configs through the registry, and the built-in deployments plugin."""

from __future__ import annotations

import inspect
import sys
from collections.abc import Iterator

import pytest

from uniagent import open_env
from uniagent.env import (
    AgentEnv,
    EnvConfig,
    EnvStartError,
    HostDeployment,
    HostDeploymentConfig,
    LocalDeployment,
    LocalDeploymentConfig,
    RemoteDeployment,
    RemoteDeploymentConfig,
)
from uniagent.env.runtime import Deployment
from uniagent.errors import ConfigError
from uniagent.plugins import load_plugins, reset_plugins
from uniagent.registry import get_registry


@pytest.fixture
def builtins_only(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Only the core's own plugins (an installed uniagent-deploy-modal would add 'modal')."""
    monkeypatch.setenv("UNIAGENT_LOAD_PLUGINS", "")
    reset_plugins()
    yield
    monkeypatch.delenv("UNIAGENT_LOAD_PLUGINS")
    reset_plugins()


def test_the_builtin_deployments_plugin_loads(builtins_only: None) -> None:
    infos = {i.module: i for i in load_plugins().report(include_builtins=True)}
    info = infos["uniagent.builtin.deployments"]
    assert info.status == "loaded", info.error
    assert info.hooks == ["uniagent_deployments"]
    assert sorted(get_registry().deployments()) == ["host", "local", "remote"]


def test_configs_validate_through_the_union(builtins_only: None) -> None:
    host = get_registry().validate_deployment_config(
        {"type": "host", "isolation": "bwrap", "network": True}
    )
    assert isinstance(host, HostDeploymentConfig) and host.network is True
    local = get_registry().validate_deployment_config({"type": "local", "image": "python:3.11"})
    assert isinstance(local, LocalDeploymentConfig) and local.engine == "auto"
    remote = get_registry().validate_deployment_config(
        {"type": "remote", "port": 8000, "auth_token": "t"}
    )
    assert isinstance(remote, RemoteDeploymentConfig)
    assert (
        get_registry().validate_deployment_config(HostDeploymentConfig()) == HostDeploymentConfig()
    )


def test_unknown_types_name_the_installed_ones_and_where_to_look(builtins_only: None) -> None:
    with pytest.raises(ConfigError) as info:
        get_registry().validate_deployment_config({"type": "modal", "image": "x"})
    message = str(info.value)
    assert "host, local, remote" in message
    assert "'modal' comes with uniagent-deploy-modal, which" in message


@pytest.mark.parametrize(
    ("config", "needle"),
    [
        ({"type": "host", "bogus": 1}, "bogus"),
        ({"type": "host", "isolation": "docker"}, "isolation"),
        ({"type": "host", "isolation": "none", "network": False}, "bwrap"),
        ({"type": "local"}, "image"),
    ],
)
def test_invalid_configs_name_the_key(builtins_only: None, config: dict, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        get_registry().validate_deployment_config(config)


@pytest.mark.parametrize("cls", [HostDeployment, LocalDeployment, RemoteDeployment])
def test_deployments_have_the_protocols_members(cls: type) -> None:
    for name in ("start", "stop", "runtime", "is_alive"):
        assert inspect.getattr_static(cls, name) is not None
        assert hasattr(Deployment, name)


@pytest.mark.parametrize(
    ("config", "new"),
    [
        ({"type": "host"}, "shell_start_timeout"),
        ({"type": "local", "image": "python:3.11"}, "server_start_timeout"),
        ({"type": "remote", "port": 8000, "auth_token": "t"}, "server_start_timeout"),
    ],
)
def test_the_old_startup_timeout_key_still_works_with_a_warning(
    builtins_only: None, config: dict, new: str
) -> None:
    with pytest.warns(FutureWarning, match=rf"env.deployment.startup_timeout .*\.{new}"):
        old = get_registry().validate_deployment_config({**config, "startup_timeout": 7})
    assert getattr(old, new) == 7
    with pytest.raises(ConfigError, match=f"give `{new}`"):
        get_registry().validate_deployment_config({**config, "startup_timeout": 7, new: 8})
    with pytest.warns(FutureWarning, match=r"env.startup_timeout .* env.start_timeout"):
        assert EnvConfig(startup_timeout=9).start_timeout == 9  # type: ignore[call-arg]


def test_env_config_defaults_and_overrides() -> None:
    config = EnvConfig(env={"PAGER": "less", "FOO": "1"}, post_setup="cd /x")
    assert config.session_env()["PAGER"] == "less"
    assert config.session_env()["GIT_PAGER"] == "cat"
    assert config.session_env()["FOO"] == "1"
    assert config.post_setup == ["cd /x"]
    assert EnvConfig(default_env=False).session_env() == {}
    with pytest.raises(ValueError):
        EnvConfig(max_output=3)  # type: ignore[call-arg]


async def test_from_config_accepts_models_and_env_settings() -> None:
    env = open_env(HostDeploymentConfig(), {"max_output_chars": 10})
    assert isinstance(env.deployment, HostDeployment)
    assert env.config.max_output_chars == 10
    async with env:
        obs = await env.run_action("printf '%.0s-' $(seq 100)")
        assert obs.output.startswith("-----") and "90 characters" in obs.output


async def test_a_deployment_that_fails_to_start_is_an_env_start_error() -> None:
    class Broken:
        async def start(self) -> None:
            raise RuntimeError("no capacity")

        async def stop(self) -> None:
            self.stopped = True

        @property
        def runtime(self) -> None:
            raise AssertionError("not started")

        async def is_alive(self) -> bool:
            return False

    broken = Broken()
    env = AgentEnv(broken)  # type: ignore[arg-type]
    with pytest.raises(EnvStartError, match="no capacity"):
        await env.start()
    assert broken.stopped  # cleaned up after the failed start


async def test_without_swerex_the_container_deployments_say_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from uniagent.env import remote

    remote.retrying_runtime_class.cache_clear()
    monkeypatch.setitem(sys.modules, "swerex", None)
    monkeypatch.setitem(sys.modules, "swerex.runtime.remote", None)
    try:
        for config in ({"type": "remote", "port": 1}, {"type": "local", "image": "x"}):
            with pytest.raises(EnvStartError, match=r"pip install 'uniagent\[swerex\]'"):
                await open_env(config).start()
        async with open_env({"type": "host"}) as env:  # host needs no swe-rex
            assert (await env.run_action("echo ok")).output == "ok\n"
    finally:
        monkeypatch.undo()
        remote.retrying_runtime_class.cache_clear()
