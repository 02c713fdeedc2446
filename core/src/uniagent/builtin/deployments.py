"""Built-in sandbox backends: ``host``, ``local`` (docker/podman) and ``remote`` (swerex-remote)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from uniagent.env.containers import remove_leftovers
from uniagent.env.host import HostDeployment, HostDeploymentConfig, cleanup_leftovers
from uniagent.env.host_check import check_host_config
from uniagent.env.local import LocalDeployment, LocalDeploymentConfig
from uniagent.env.remote import RemoteDeployment, RemoteDeploymentConfig
from uniagent.hookspecs import hookimpl
from uniagent.specs import DeploymentSpec

#: What ``local`` and ``remote`` import when they start: SWE-ReX's runtime and its client.
SWEREX_NEEDS = {"swerex": "uniagent[swerex]", "aiohttp": "uniagent[swerex]"}


def _clean_host(config: HostDeploymentConfig | None, run_ids: Iterable[str]) -> list[str]:
    """Episode directories and cgroups whose owner process is gone."""
    return cleanup_leftovers(config.base_dir if config is not None else None)


def _clean_local(config: LocalDeploymentConfig | None, run_ids: Iterable[str]) -> list[str]:
    """Containers of dead runs (and of ``run_ids``), on the config's engine or on every one."""
    engine = config.engine if config is not None else "auto"
    return remove_leftovers(None if engine == "auto" else [engine], run_ids=run_ids)


@hookimpl
def uniagent_deployments() -> Iterator[DeploymentSpec]:
    """The built-in deployments; ``local`` and ``remote`` need ``uniagent[swerex]`` to start."""
    yield DeploymentSpec(
        name="host", config=HostDeploymentConfig, factory=HostDeployment, cleanup=_clean_host,
        check=check_host_config, can_fork=True,
    )  # fmt: skip
    yield DeploymentSpec(
        name="local",
        config=LocalDeploymentConfig,
        factory=LocalDeployment,
        cleanup=_clean_local,
        needs=SWEREX_NEEDS,
        can_fork=True,
    )
    yield DeploymentSpec(
        name="remote", config=RemoteDeploymentConfig, factory=RemoteDeployment, needs=SWEREX_NEEDS
    )
