"""Built-in sandbox backends: ``host``, ``local`` (docker/podman) and ``remote`` (swerex-remote)."""

from __future__ import annotations

from collections.abc import Iterator

from uniagent.env.host import HostDeployment, HostDeploymentConfig
from uniagent.env.local import LocalDeployment, LocalDeploymentConfig
from uniagent.env.remote import RemoteDeployment, RemoteDeploymentConfig
from uniagent.hookspecs import hookimpl
from uniagent.specs import DeploymentSpec

#: What ``local`` and ``remote`` import when they start: SWE-ReX's runtime and its client.
SWEREX_NEEDS = {"swerex": "uniagent[swerex]", "aiohttp": "uniagent[swerex]"}


@hookimpl
def uniagent_deployments() -> Iterator[DeploymentSpec]:
    """The built-in deployments; ``local`` and ``remote`` need ``uniagent[swerex]`` to start."""
    yield DeploymentSpec(name="host", config=HostDeploymentConfig, factory=HostDeployment)
    yield DeploymentSpec(
        name="local", config=LocalDeploymentConfig, factory=LocalDeployment, needs=SWEREX_NEEDS
    )
    yield DeploymentSpec(
        name="remote", config=RemoteDeploymentConfig, factory=RemoteDeployment, needs=SWEREX_NEEDS
    )
