"""Entry point of uniagent-deploy-modal: contributes the ``modal`` deployment."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from uniagent import DeploymentSpec, hookimpl
from uniagent_deploy_modal.config import ModalDeploymentConfig

if TYPE_CHECKING:  # pragma: no cover
    from uniagent_deploy_modal.deployment import ModalDeployment


def _make_deployment(config: ModalDeploymentConfig) -> ModalDeployment:
    """Build the deployment lazily (SWE-ReX and modal load only when a sandbox is wanted)."""
    from uniagent_deploy_modal.deployment import ModalDeployment

    return ModalDeployment(config)


@hookimpl
def uniagent_deployments() -> Iterator[DeploymentSpec]:
    """The ``modal`` sandbox backend."""
    yield DeploymentSpec(
        name="modal", config=ModalDeploymentConfig, factory=_make_deployment, can_fork=True
    )
