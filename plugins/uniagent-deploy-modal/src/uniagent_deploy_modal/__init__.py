"""Modal cloud sandboxes for uniagent: ``deployment: {type: modal, image: ...}``.

The deployment classes load SWE-ReX and modal (~0.8 s), so they are imported on
first use; plugin discovery only needs the config.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from uniagent_deploy_modal.config import ModalDeploymentConfig

if TYPE_CHECKING:  # pragma: no cover
    from uniagent_deploy_modal.deployment import (
        ModalDeployment,
        ModalDeploymentError,
        PatchedModalDeployment,
    )

__all__ = [
    "ModalDeployment",
    "ModalDeploymentConfig",
    "ModalDeploymentError",
    "PatchedModalDeployment",
]


def __getattr__(name: str) -> Any:
    if name in {"ModalDeployment", "ModalDeploymentError", "PatchedModalDeployment"}:
        from uniagent_deploy_modal import deployment

        return getattr(deployment, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
