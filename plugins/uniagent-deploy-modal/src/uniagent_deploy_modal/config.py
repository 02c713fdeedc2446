"""The ``deployment: {type: modal, ...}`` config."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from uniagent.sandbox import renamed_keys

#: ``modal.Sandbox.create`` arguments that SWE-ReX's ModalDeployment sets itself.
RESERVED_SANDBOX_KWARGS: frozenset[str] = frozenset(
    {"image", "timeout", "unencrypted_ports", "app"}
)


class ModalDeploymentConfig(BaseModel):
    """Settings of one Modal sandbox per episode (fields mirror SWE-ReX's ModalDeploymentConfig)."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any) -> Any:
        renames = {"startup_timeout": "sandbox_start_timeout"}
        return renamed_keys(data, renames, "env.deployment", kind="modal")

    type: Literal["modal"] = "modal"
    image: str = Field(
        default="python:3.11",
        min_length=1,
        description=(
            "A registry image (e.g. 'python:3.11', 'swebench/sweb.eval.x86_64.<id>:latest'), "
            "an ECR image (contains 'amazonaws.com'), or the path of a Dockerfile on this machine."
        ),
    )
    sandbox_start_timeout: float = Field(
        default=180.0,
        gt=0,
        description=(
            "Seconds for sandbox creation plus the swerex-remote server inside it to answer."
        ),
    )
    runtime_timeout: float = Field(
        default=60.0,
        gt=0,
        description=(
            "HTTP timeout (seconds) of runtime calls other than commands: liveness probes, "
            "file reads and writes, uploads, closing."
        ),
    )
    request_margin: float = Field(
        default=60.0,
        ge=0,
        description=(
            "Added to a command's own timeout to get its HTTP timeout (commands are not cut "
            "at aiohttp's 300 s default)."
        ),
    )
    retries: int = Field(
        default=3, ge=0, description="Retries of a runtime request whose connection failed."
    )
    deployment_timeout: float = Field(
        default=3600.0,
        gt=0,
        description=(
            "Modal kills the sandbox after this many seconds no matter what: the cost cap "
            "should a process die before calling stop()."
        ),
    )
    modal_sandbox_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description=(
            "Extra keyword arguments for modal.Sandbox.create (cpu, memory, gpu, region, "
            "secrets, ...). image, timeout, unencrypted_ports and app are set by the deployment."
        ),
    )
    install_pipx: bool = Field(
        default=True,
        description=(
            "apt-install pipx into the image so that `pipx run swe-rex` can start the server "
            "when the image lacks swerex-remote; turn off for images that ship it."
        ),
    )

    @field_validator("modal_sandbox_kwargs")
    @classmethod
    def _no_reserved_kwargs(cls, value: dict[str, Any]) -> dict[str, Any]:
        clash = sorted(RESERVED_SANDBOX_KWARGS & value.keys())
        if clash:
            raise ValueError(
                f"modal_sandbox_kwargs may not set {', '.join(clash)}: the deployment sets them "
                "(use the image and deployment_timeout fields instead)"
            )
        return value
