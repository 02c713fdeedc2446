"""``EnvConfig``: how an episode's sandbox is prepared and how commands run in it."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

#: Environment of every session: no pagers or colours, nothing that waits for input.
DEFAULT_ENV: dict[str, str] = {
    "PAGER": "cat",
    "GIT_PAGER": "cat",
    "MANPAGER": "cat",
    "SYSTEMD_PAGER": "cat",
    "LESS": "-R",
    "TERM": "dumb",
    "NO_COLOR": "1",
    "PIP_PROGRESS_BAR": "off",
    "PIP_NO_INPUT": "1",
    "TQDM_DISABLE": "1",
    "GIT_TERMINAL_PROMPT": "0",
    "DEBIAN_FRONTEND": "noninteractive",
    "PYTHONUNBUFFERED": "1",
}

#: Tools dir inside containers when neither the config nor the deployment names one.
DEFAULT_TOOLS_DIR = "/usr/local/uniagent/tools"


def renamed_keys(
    data: Any, renames: Mapping[str, str], where: str, *, kind: str | None = None
) -> Any:
    """``data`` (a config section's raw mapping) with each deprecated key of ``renames``
    (old name -> new name) under its new name, with a ``FutureWarning`` (shown by default:
    the user's config says it); both names given is an error. For a ``mode="before"``
    model validator; ``kind``: a deployment config's ``type`` (data of another type is left
    to its own model: a union tries every member)."""
    if not isinstance(data, Mapping) or not any(old in data for old in renames):
        return data
    if kind is not None and data.get("type", kind) != kind:
        return data
    data = dict(data)
    for old, new in renames.items():
        if old not in data:
            continue
        if new in data:
            raise ValueError(f"give `{new}` (`{old}` is its deprecated name), not both")
        warnings.warn(
            f"{where}.{old} is deprecated since uniagent 0.3 and goes in 0.4: rename it to "
            f"{where}.{new}",
            FutureWarning,
            stacklevel=2,
        )
        data[new] = data.pop(old)
    return data


#: The agent config's sections' renamed keys (section -> old name -> new name), taken with a
#: warning until 0.4; a backend's renamed deployment keys are its config model's.
RENAMED_KEYS: dict[str, dict[str, str]] = {
    "env": {"startup_timeout": "start_timeout"},
    "reward": {"config": "settings"},
}


def section_renamed(data: Any, section: str) -> Any:
    """``data`` (the raw mapping of the agent config's ``section``, or a task's override of
    it) with its renamed keys under their new names (:func:`renamed_keys`). The one place
    that warns of them: Python's default filter says each once a process, however many
    tasks' overrides use one too."""
    return renamed_keys(data, RENAMED_KEYS[section], section)


class EnvConfig(BaseModel):
    """The agent config's ``env`` section: the sandbox backend and the session's settings.

    ``deployment`` is raw data here (``type`` names an installed backend, the rest is its
    config): the resolve step validates it with that backend's model. Everything else is
    what :class:`uniagent.env.AgentEnv` does with a started sandbox.
    """

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any) -> Any:
        return section_renamed(data, "env")

    deployment: dict[str, Any] = Field(
        default_factory=lambda: {"type": "host"},
        description="the sandbox backend: `type` names an installed deployment, the rest is "
        "its config",
    )

    env: dict[str, str] = Field(
        default_factory=dict,
        description="variables exported in the session, on top of (and overriding) DEFAULT_ENV",
    )
    default_env: bool = Field(True, description="export DEFAULT_ENV (PAGER=cat, TERM=dumb, ...)")
    post_setup: list[str] = Field(
        default_factory=list, description="commands run once after start (each must exit 0)"
    )
    workdir: str | None = Field(
        None,
        description="cd here at start (created if missing); default: the deployment's work dir "
        "(the host deployment's temp dir), else the image's",
    )
    tools_dir: str | None = Field(
        None,
        description="where tool scripts go (on PATH); default: the deployment's, else "
        + DEFAULT_TOOLS_DIR,
    )
    max_output_chars: int = Field(
        30_000, ge=0, description="longer outputs keep their head and tail (0: no limit)"
    )
    action_timeout: float = Field(120.0, gt=0, description="run_action's default timeout (s)")
    start_timeout: float = Field(
        300.0, gt=0, description="seconds for the sandbox to start (its backend and its shell)"
    )
    setup_timeout: float = Field(
        600.0, gt=0, description="seconds for each post_setup or tool install command"
    )
    interrupt_timeout: float = Field(
        1.0, gt=0, description="seconds to wait after each interrupt signal of a timed-out command"
    )
    interrupt_retries: int = Field(
        2, ge=1, description="SIGINTs before escalating to SIGTERM/SIGKILL"
    )
    probe_timeout: float = Field(
        10.0, gt=0, description="seconds for the liveness probe after a timeout"
    )
    close_timeout: float = Field(60.0, gt=0, description="seconds for stopping the sandbox")

    @field_validator("post_setup", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    def session_env(self) -> dict[str, str]:
        """The variables exported in the session."""
        return {**(DEFAULT_ENV if self.default_env else {}), **self.env}
