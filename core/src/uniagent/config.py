"""The agent configuration (YAML), with per-task overrides.

A config names plugins (tool parser, tools, deployment, reward) by the names
they register; validation checks those names against what is installed, so a
typo fails before any sandbox starts. Unknown keys are rejected with their path.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from uniagent.errors import ConfigError
from uniagent.grading.settings import GradeIn, IntegritySettings
from uniagent.interaction.exit import DEFAULT_EXIT_POLICY, ExitReason, Treatment

DEFAULT_SYSTEM_PROMPT = (
    "You are a careful software engineer working in a sandboxed shell. "
    "Use the tools to inspect and change files and to run commands. "
    "Call exactly one tool per turn. When the task is done, call the submit tool."
)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class InteractionConfig(_Strict):
    """Limits of the ReAct loop."""

    max_turns: int = Field(30, ge=1, description="model turns before max_step_limit")
    action_timeout: float = Field(120.0, gt=0, description="seconds one command may run")
    timeout_budget: float = Field(
        600.0, ge=0, description="seconds of timed-out commands allowed before timeout_error ends"
    )
    max_tool_calls_per_turn: int = Field(1, ge=1, description="calls allowed in one model turn")
    max_format_errors: int | None = Field(
        None,
        ge=1,
        description="consecutive unparsable turns before format_error ends (None: never)",
    )


class EnvSection(_Strict):
    """The sandbox: a deployment (by ``type``) plus environment settings."""

    model_config = ConfigDict(extra="allow", frozen=True)

    deployment: dict[str, Any] = Field(default_factory=lambda: {"type": "host"})

    @field_validator("deployment")
    @classmethod
    def _known_deployment(cls, value: dict[str, Any]) -> dict[str, Any]:
        from uniagent.registry import validate_deployment_config

        validate_deployment_config(value)
        return value

    def settings(self) -> dict[str, Any]:
        """The environment settings besides the deployment (``EnvConfig`` fields)."""
        return dict(self.model_extra or {})


class RewardConfig(_Strict):
    """Which reward runs at the end of an episode, its settings, and how it is graded."""

    name: str
    config: dict[str, Any] = Field(default_factory=dict)
    grade_in: GradeIn = Field(
        "episode",
        description="'episode': grade in the episode's sandbox after stopping the agent's "
        "processes, in a clean shell; 'fresh': apply the agent's patch to a new sandbox built "
        "from the task's deployment and set-up, and grade there",
    )
    integrity: IntegritySettings = IntegritySettings()


class AgentConfig(_Strict):
    """Everything that defines an agent run; loaded from YAML."""

    tool_parser: str = "hermes"
    tools: tuple[str, ...] = ("execute_bash", "str_replace_editor", "submit")
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    instance_template: str = Field(
        "{problem_statement}", description="the first user message; task fields in {braces}"
    )
    interaction: InteractionConfig = InteractionConfig()
    env: EnvSection = EnvSection()
    reward: RewardConfig | None = None
    exit_policy: dict[ExitReason, Treatment] = Field(default_factory=dict)
    sampling: dict[str, Any] = Field(
        default_factory=dict, description="sampling parameters passed to the model backend"
    )
    concurrency: int = Field(8, ge=1, description="episodes at once")
    services: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="process-wide services to start before the first episode, by name, with "
        "their settings (see uniagent.services)",
    )
    log_dir: Path | None = None

    @model_validator(mode="after")
    def _known_plugins(self) -> AgentConfig:
        from uniagent.registry import get_registry

        registry = get_registry()
        registry.tool_parsers()[self.tool_parser]
        tools = registry.tools()
        for name in self.tools:
            tools[name]
        if self.reward is not None:
            registry.rewards()[self.reward.name]
        from uniagent.services import resolve_services

        resolve_services(self.services)  # unknown names and bad settings fail here
        return self

    def treatment(self, reason: ExitReason) -> Treatment:
        """Whether an episode that ended this way is trained on or masked."""
        return self.exit_policy.get(reason, DEFAULT_EXIT_POLICY[reason])

    # -- loading ---------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, source: str = "config") -> AgentConfig:
        """Validate a mapping; errors name the path of each bad key."""
        try:
            return cls.model_validate(dict(data))
        except ValidationError as exc:
            raise ConfigError(format_validation_error(exc, source)) from None

    @classmethod
    def from_yaml(cls, path: str | Path) -> AgentConfig:
        """Load a YAML file."""
        path = Path(path)
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except FileNotFoundError:
            raise ConfigError(f"config file {path} does not exist") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {path} is not valid YAML: {exc}") from None
        if not isinstance(data, Mapping):
            raise ConfigError(f"config file {path} must hold a mapping, not {type(data).__name__}")
        return cls.from_dict(data, source=str(path))

    def with_overrides(
        self, overrides: Mapping[str, Any] | None, *, source: str = "overrides"
    ) -> AgentConfig:
        """A copy with ``overrides`` deep-merged in (e.g. a task's ``tools_kwargs``)."""
        if not overrides:
            return self
        merged = deep_merge(self.model_dump(mode="python", exclude_unset=False), overrides)
        return type(self).from_dict(merged, source=source)


def deep_merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """Merge ``override`` into a copy of ``base``; nested mappings merge, the rest replaces."""
    out = copy.deepcopy(dict(base))
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def format_validation_error(exc: ValidationError, source: str) -> str:
    """One line per problem: the dotted key path, then what was wrong."""
    lines = [f"invalid {source}:"]
    for err in exc.errors():
        path = ".".join(str(p) for p in err["loc"]) or "(top level)"
        message = str(err["msg"]).removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            message = "unknown key"
        lines.append(f"  {path}: {message}")
    return "\n".join(lines)
