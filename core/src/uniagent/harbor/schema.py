"""The typed model of a Harbor ``task.toml`` (schema 1.4), parsed strictly with ``tomllib``.

Every section and key of the format is known here, and an unknown key is an error naming
its path (``verifier.timeout``). Keys the format has but ``uniagent`` cannot honour
(multi-step tasks, compose services, MCP servers, GPUs)
parse, and :func:`unsupported` names them, so a task that needs one is reported instead
of run without it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import tomllib
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from uniagent.errors import ConfigError

#: The schema versions this model reads (Harbor's 1.0 to 1.4 differ only in added keys).
SCHEMA_VERSIONS = ("1.0", "1.1", "1.2", "1.3", "1.4")
_PACKAGE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")

NetworkMode = Literal["no-network", "public", "allowlist"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Author(_Strict):
    name: str
    email: str | None = None


class Package(_Strict):
    """``[task]``: the package name (``org/name``) and its description."""

    name: str
    version: str | None = Field(None, min_length=1)
    description: str = ""
    authors: list[Author] = Field(default_factory=list)
    keywords: list[str] = Field(default_factory=list)

    @field_validator("name")
    @classmethod
    def _org_name(cls, value: str) -> str:
        if not _PACKAGE_NAME.match(value) or ".." in value:
            raise ValueError(f"must be 'org/name' (letters, digits, . _ -), got {value!r}")
        return value


class _Network(_Strict):
    network_mode: NetworkMode | None = None
    allowed_hosts: list[str] | None = None


class Healthcheck(_Strict):
    command: str
    interval_sec: float = 5.0
    timeout_sec: float = 30.0
    start_period_sec: float = 0.0
    start_interval_sec: float = 5.0
    retries: int = 3


class Tpu(_Strict):
    type: str
    topology: str


class McpServer(_Strict):
    name: str
    transport: Literal["stdio", "sse", "streamable-http", "http"] = "sse"
    url: str | None = None
    command: str | None = None
    args: list[str] = Field(default_factory=list)
    headers: dict[str, str] = Field(default_factory=dict)


class Environment(_Network):
    """``[environment]``: the image (a Dockerfile in ``environment/`` or ``docker_image``)."""

    build_timeout_sec: float = Field(600.0, gt=0)
    docker_image: str | None = None
    os: Literal["linux", "windows", "Linux", "Windows", "LINUX", "WINDOWS"] = "linux"
    cpus: int | float | None = None
    memory_mb: int | None = Field(None, gt=0)
    storage_mb: int | None = Field(None, gt=0)
    gpus: int | None = None
    gpu_types: list[str] | None = None
    tpu: Tpu | None = None
    mcp_servers: list[McpServer] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    skills_dir: str | None = None
    healthcheck: Healthcheck | None = None
    workdir: str | None = None
    allow_internet: bool | None = None
    #: Deprecated spellings (``memory = "2G"``) that Harbor still reads.
    memory: str | None = None
    storage: str | None = None


class Collect(_Strict):
    command: str
    service: str = "main"
    timeout_sec: float = 60.0
    user: str | int | None = None


class Verifier(_Network):
    """``[verifier]``: how long ``tests/test.sh`` may run, its environment and its user."""

    timeout_sec: float = Field(600.0, gt=0)
    env: dict[str, str] = Field(default_factory=dict)
    user: str | int | None = None
    environment_mode: Literal["shared", "separate"] | None = None
    environment: Environment | None = None
    collect: list[Collect] = Field(default_factory=list)


class Agent(_Network):
    """``[agent]``: the agent's time limit and user."""

    timeout_sec: float | None = Field(None, gt=0)
    user: str | int | None = None


class Solution(_Strict):
    env: dict[str, str] = Field(default_factory=dict)


class Artifact(_Strict):
    source: str
    destination: str | None = None
    exclude: list[str] = Field(default_factory=list)
    service: str | None = None


class Step(_Strict):
    name: str
    agent: Agent = Field(default_factory=Agent)
    verifier: Verifier = Field(default_factory=Verifier)
    min_reward: float | dict[str, float] | None = None
    healthcheck: Healthcheck | None = None
    artifacts: list[str | Artifact] = Field(default_factory=list)


class TaskToml(_Strict):
    """A whole ``task.toml``."""

    schema_version: str = "1.4"
    #: The old name of ``schema_version``.
    version: str | None = None
    task: Package | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    verifier: Verifier = Field(default_factory=Verifier)
    agent: Agent = Field(default_factory=Agent)
    environment: Environment = Field(default_factory=Environment)
    solution: Solution = Field(default_factory=Solution)
    source: str | None = None
    multi_step_reward_strategy: Literal["mean", "final"] | None = None
    steps: list[Step] | None = None
    artifacts: list[str | Artifact] = Field(default_factory=list)

    @field_validator("schema_version", "version")
    @classmethod
    def _known_version(cls, value: str | None) -> str | None:
        if value is not None and value not in SCHEMA_VERSIONS:
            raise ValueError(f"schema version {value!r} is not one of {', '.join(SCHEMA_VERSIONS)}")
        return value

    def network_mode(self) -> str:
        """The agent's network policy: ``network_mode``, else ``allow_internet``, else public."""
        env = self.environment
        if env.network_mode is not None:
            return env.network_mode
        if env.allow_internet is not None:
            return "public" if env.allow_internet else "no-network"
        return "public"


def verifier_mode(config: TaskToml) -> Literal["shared", "separate"]:
    """Where the verifier runs: its own environment when ``environment_mode`` says so or a
    ``[verifier.environment]`` is given (Harbor's rule), else the agent's."""
    verifier = config.verifier
    if verifier.environment_mode is not None:
        return verifier.environment_mode
    return "separate" if verifier.environment is not None else "shared"


def artifact_sources(config: TaskToml) -> list[str]:
    """The agent's paths the task's ``artifacts`` name (each an absolute path)."""
    return [a if isinstance(a, str) else a.source for a in config.artifacts]


def _environment_problems(env: Environment, where: str) -> list[str]:
    found = []
    if env.os.lower() != "linux":
        found.append(f"{where}.os: {env.os!r} tasks are not supported")
    if env.gpus or env.gpu_types or env.tpu:
        found.append(f"{where}.gpus/tpu: accelerators are not supported")
    if env.mcp_servers:
        found.append(f"{where}.mcp_servers: task-declared MCP servers are not supported yet")
    if env.healthcheck is not None:
        found.append(f"{where}.healthcheck: health checks are not supported")
    if env.skills_dir is not None:
        found.append(f"{where}.skills_dir: skills are not supported")
    return found


def unsupported(config: TaskToml, task_dir: Path) -> list[str]:
    """What the task needs that ``uniagent`` does not do (each a key path and why)."""
    found = []
    if config.steps:
        found.append("steps: multi-step tasks are not supported")
    verifier = config.verifier
    if verifier.environment_mode == "shared" and verifier.environment is not None:
        found.append(
            "verifier.environment: a verifier environment needs environment_mode = "
            '"separate" (it is "shared")'
        )
    if verifier.environment is not None:
        found += _environment_problems(verifier.environment, "verifier.environment")
    if verifier.collect:
        found.append("verifier.collect: compose services are not supported")
    found += _environment_problems(config.environment, "environment")
    env = config.environment
    if "allowlist" in (env.network_mode, config.agent.network_mode, config.verifier.network_mode):
        found.append("network_mode: allowlist is not supported (public or no-network)")
    if config.artifacts and verifier_mode(config) == "shared":
        found.append(
            "artifacts: collected only as the inputs of a separate verifier "
            '(verifier.environment_mode = "separate")'
        )
    for i, artifact in enumerate(config.artifacts):
        if not isinstance(artifact, str) and (artifact.exclude or artifact.service):
            found.append(f"artifacts[{i}]: exclude and service are not supported")
        source = artifact if isinstance(artifact, str) else artifact.source
        if not source.startswith("/") or ".." in source.split("/"):
            found.append(f"artifacts[{i}]: {source!r} is not an absolute path")
    for name in ("docker-compose.yaml", "docker-compose.yml", "compose.yaml"):
        for folder in ("environment", "tests"):
            if (task_dir / folder / name).exists():
                found.append(f"{folder}/{name}: compose environments are not supported")
    return found


def load_task_toml(path: Path) -> TaskToml:
    """Parse and validate ``path``; a :class:`ConfigError` names the file and the key path."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read it: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    try:
        return TaskToml.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '(top)'}: "
            f"{'unknown key' if err['type'] == 'extra_forbidden' else err['msg']}"
            for err in exc.errors()
        )
        raise ConfigError(f"{path}: {problems}") from None


#: ``${VAR}`` and ``${VAR:-default}`` in the values of ``[verifier] env`` and ``[solution] env``.
_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def unset_variables(env: Mapping[str, Any], where: str) -> list[str]:
    """``WHERE.KEY: ${NAME} is not set`` for each variable a value names that this process's
    environment lacks and that has no default: a task that cannot run, said when the task
    is loaded (before any sandbox starts)."""
    return [
        f"{where}.{key}: ${{{match.group(1)}}} is not set"
        for key, value in env.items()
        for match in _VARIABLE.finditer(str(value))
        if match.group(2) is None and match.group(1) not in os.environ
    ]


def expand_variables(env: Mapping[str, Any], where: str) -> dict[str, str]:
    """The values with their variables put in from this process's environment. They are
    put in when the values are used, not when the task is loaded, so that a secret (an API
    key for an LLM-judged verifier) is never written into a task row or a run's files.
    Raises ``KeyError`` with :func:`unset_variables`' message for an unset one."""
    problems = unset_variables(env, where)
    if problems:
        raise KeyError(problems[0])

    def value(match: re.Match[str]) -> str:
        return os.environ.get(match.group(1), match.group(2) or "")

    return {key: _VARIABLE.sub(value, str(text)) for key, text in env.items()}
