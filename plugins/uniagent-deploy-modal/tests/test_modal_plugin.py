"""Discovery of the installed distribution and validation of the ``modal`` config."""

from __future__ import annotations

import pytest
from uniagent_deploy_modal import ModalDeploymentConfig

from uniagent import (
    ConfigError,
    get_registry,
    load_plugins,
    reset_plugins,
)

DIST = "uniagent-deploy-modal"


def test_plugin_is_discovered() -> None:
    spec = get_registry().deployments()["modal"]
    assert spec.distribution == DIST
    assert not spec.builtin
    assert spec.config is ModalDeploymentConfig
    info = next(i for i in load_plugins().report() if i.distribution == DIST)
    assert info.status == "loaded"
    assert info.version == "0.2.0"
    assert info.hooks == ["uniagent_deployments"]


def test_config_validates_when_the_plugin_is_installed() -> None:
    config = get_registry().validate_deployment_config(
        {"type": "modal", "image": "python:3.12-slim", "modal_sandbox_kwargs": {"cpu": 4}}
    )
    assert isinstance(config, ModalDeploymentConfig)
    assert config.image == "python:3.12-slim"
    assert config.modal_sandbox_kwargs == {"cpu": 4}


def test_config_is_unknown_without_the_plugin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UNIAGENT_DISABLE_PLUGINS", DIST)
    reset_plugins()
    blocked = r"unknown deployment 'modal'.*uniagent-deploy-modal, which is installed but blocked"
    with pytest.raises(ConfigError, match=blocked):
        get_registry().validate_deployment_config({"type": "modal", "image": "python:3.12-slim"})


def test_config_rejects_unknown_fields() -> None:
    with pytest.raises(ConfigError, match="startup_timout"):
        get_registry().validate_deployment_config({"type": "modal", "startup_timout": 10})


def test_config_rejects_sandbox_kwargs_the_deployment_owns() -> None:
    with pytest.raises(ConfigError, match="may not set app, timeout"):
        get_registry().validate_deployment_config(
            {"type": "modal", "modal_sandbox_kwargs": {"timeout": 5, "app": "x"}}
        )


def test_config_rejects_non_positive_timeouts() -> None:
    with pytest.raises(ConfigError, match="deployment_timeout"):
        get_registry().validate_deployment_config({"type": "modal", "deployment_timeout": 0})


def test_config_defaults_follow_swerex() -> None:
    from swerex.deployment.config import ModalDeploymentConfig as Upstream

    ours, theirs = ModalDeploymentConfig(), Upstream()
    assert ours.sandbox_start_timeout == theirs.startup_timeout  # renamed: what it times
    for name in (
        "image",
        "runtime_timeout",
        "deployment_timeout",
        "modal_sandbox_kwargs",
        "install_pipx",
    ):
        assert getattr(ours, name) == getattr(theirs, name), name


def test_discovery_does_not_import_swerex() -> None:
    import subprocess
    import sys

    code = (
        "import sys; from uniagent import get_registry; get_registry().deployments()['modal'];"
        "print(sorted(m for m in ('modal', 'swerex') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
