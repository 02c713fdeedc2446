"""The one resolve step: config + registry → a resolved agent, before any sandbox starts.

An :class:`~uniagent.config.AgentConfig` is plain, strict data: names of plugins
and their raw settings. :func:`resolve` is the only place that consults the
registry: it looks every name up, validates every plugin's settings with the
plugin's own model, and returns a :class:`ResolvedAgent` whose parts
(``run_episode``, ``AgentEnv``, the grader, the verl adapter) never look
anything up again. Every problem is a :class:`~uniagent.errors.ConfigError`
naming the key path and the source (file, or task)::

    agent = resolve(AgentConfig.from_yaml("agent.yaml"), source="agent.yaml")
    per_task = agent.for_task(row["tools_kwargs"], source="task django-123")

A run resolves once per process (``uniagent run``: once; a verl worker: once per agent
loop) and hands the :class:`ResolvedAgent` down; a task's overrides go through
:meth:`ResolvedAgent.for_task`, which resolves each distinct override once. Each resolve
logs one ``resolved SOURCE`` line (``resolved SOURCE (overrides)`` for a task's) at
DEBUG level on this module's logger.

:func:`open_env` is the one way to open a sandbox from a raw deployment config.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ValidationError

from uniagent.config import AgentConfig, RewardConfig, ToolRef, format_validation_error
from uniagent.env.agent_env import AgentEnv
from uniagent.env.config import EnvConfig
from uniagent.errors import ConfigError, UnknownPluginNameError
from uniagent.mcp.config import McpServerConfig
from uniagent.parsers.base import CallReader, ToolCallParser
from uniagent.registry import Registry, get_registry
from uniagent.rubric import Component, Rubric, rubric_spec
from uniagent.specs import (
    AgentSpec,
    DeploymentSpec,
    ParserSpec,
    RewardSpec,
    ServiceSpec,
    ToolSpec,
    _installed,
)

log = logging.getLogger(__name__)

#: Distinct task overrides each resolved agent keeps resolved (most recently used first).
FOR_TASK_CACHE = 256


@dataclass(frozen=True)
class ResolvedReward:
    """The reward of an agent: its record, its validated settings, how it is graded."""

    spec: RewardSpec[Any]
    settings: Any
    grade_in: str
    integrity: Any


@dataclass(frozen=True)
class ResolvedAgent:
    """An agent config with every name resolved and every setting validated."""

    config: AgentConfig
    tools: tuple[ToolSpec, ...]
    parser: ParserSpec
    deployment: DeploymentSpec[Any]
    deployment_config: BaseModel
    env: EnvConfig
    reward: ResolvedReward | None
    #: The agent that runs the episode (``agent.name``: the built-in loop by default).
    agent: AgentSpec[Any]
    services: tuple[tuple[ServiceSpec[Any], Any], ...] = ()
    #: MCP servers whose tools each episode lists at its start (:mod:`uniagent.mcp`).
    mcp_servers: tuple[McpServerConfig, ...] = ()
    source: str = "config"
    agent_settings: Any = None
    registry: Registry | None = field(default=None, compare=False, repr=False)
    _per_task: dict[str, ResolvedAgent] = field(
        default_factory=dict, compare=False, repr=False, init=False
    )
    _lock: threading.Lock = field(
        default_factory=threading.Lock, compare=False, repr=False, init=False
    )

    def __getstate__(self) -> dict[str, Any]:
        """What a Ray actor receives: everything resolved, without this process's registry
        (a plugin manager), its lock and its cache of resolved task overrides; the actor's
        own registry resolves a task's overrides there."""
        state = dict(self.__dict__)
        state.update(registry=None, _per_task={}, _lock=None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _lock=threading.Lock())

    def new_parser(self) -> ToolCallParser:
        """A fresh tool-call parser (parsers may keep per-episode state)."""
        return self.parser.factory()

    def new_env(self) -> AgentEnv:
        """A new, unstarted sandbox for one episode."""
        return AgentEnv(self.deployment.factory(self.deployment_config), self.env)

    def for_task(self, overrides: Mapping[str, Any] | None, *, source: str) -> ResolvedAgent:
        """This agent with a task's overrides (``tools_kwargs``) merged in and resolved.

        Each distinct override is resolved once (the last :data:`FOR_TASK_CACHE` kept);
        errors name ``source``. Services cannot be overridden: they run once per process.
        """
        if not overrides:
            return self
        key = json.dumps(overrides, sort_keys=True, default=repr)
        with self._lock:
            cached = self._per_task.pop(key, None)
            if cached is not None:
                self._per_task[key] = cached  # most recently used last
                return cached
        merged = self.config.with_overrides(overrides, source=source)
        if merged.services != self.config.services:
            raise ConfigError(
                f"{source}: services cannot be changed per task (they run once per process "
                "for every task); set them in the agent config"
            )
        agent = _resolve(merged, self.registry or get_registry(), source, overrides=True)
        with self._lock:
            self._per_task[key] = agent
            while len(self._per_task) > FOR_TASK_CACHE:
                self._per_task.pop(next(iter(self._per_task)))
        return agent

    def cleanup_leftovers(self, run_ids: list[str]) -> list[str]:
        """What sandboxes of killed runs left behind, removed by this agent's backend."""
        if self.deployment.cleanup is None:
            return []
        return self.deployment.cleanup(self.deployment_config, run_ids)


def resolve(
    config: AgentConfig, registry: Registry | None = None, *, source: str | None = None
) -> ResolvedAgent:
    """Resolve ``config`` against ``registry`` (default: the installed plugins).

    Errors name ``source`` (default: where the config was loaded from).
    """
    return _resolve(config, registry or get_registry(), source or config.source)


def _resolve(
    config: AgentConfig, registry: Registry, source: str, *, overrides: bool = False
) -> ResolvedAgent:
    log.debug("resolved %s%s", source, " (overrides)" if overrides else "")
    tools = tuple(
        _tool(registry, ref, f"tools.{i}", source)
        for i, ref in enumerate(config.tools)
        if ref.mcp is None
    )
    mcp_servers = tuple(ref.mcp for ref in config.tools if ref.mcp is not None)
    if mcp_servers and not _installed("jsonschema"):  # it checks the calls, in this process
        raise ConfigError(
            f"invalid {source}:\n  tools: MCP servers need uniagent's `mcp` extra here: "
            "pip install 'uniagent[mcp]'"
        )
    names = [t.name for t in tools] + [f"mcp:{m.name}" for m in mcp_servers]
    duplicate = next((n for n in names if names.count(n) > 1), None)
    if duplicate is not None:
        raise ConfigError(f"invalid {source}:\n  tools: {duplicate!r} is listed twice")
    parser = _lookup(registry.tool_parsers(), config.tool_parser, "tool_parser", source)
    deployment_config = _deployment_config(registry, config.env.deployment, source)
    deployment = registry.deployments()[deployment_config.type]  # type: ignore[attr-defined]
    missing = deployment.missing()
    if missing:  # or every episode would fail at its sandbox's start
        installs = " ".join(f"'{package}'" for package in missing)
        raise ConfigError(
            f"invalid {source}:\n  env.deployment.type: the {deployment.name!r} backend needs "
            f"{', '.join(missing)}, which is not installed: pip install {installs}"
        )
    deployment_config = _with_mcp_sockets(config, deployment_config, source)
    if deployment.check is not None:  # what every sandbox would fail with at start
        problems = deployment.check(deployment_config, config.env)
        if problems:
            listed = "\n  ".join(f"env.{problem}" for problem in problems)
            raise ConfigError(f"invalid {source}:\n  {listed}")
    reward = None
    if config.reward is not None:
        reward = _reward(registry, config.reward, source)
        if reward.grade_in == "fresh":
            _fresh_sandbox_apart(config, deployment_config, source)
    services = tuple(
        (
            spec := _lookup(registry.services(), name, f"services.{name}", source),
            _settings(spec.settings, raw, f"services.{name}", source, what=f"service {name!r}"),
        )
        for name, raw in config.services.items()
    )
    agent, agent_settings = _agent(registry, config, deployment_config, source)
    if agent.is_harness and not isinstance(parser.factory(), CallReader):
        raise ConfigError(
            f"invalid {source}:\n  tool_parser: agent {agent.name!r} is a harness, whose model "
            f"is the gateway: tool parser {parser.name!r} cannot serve it (it has no "
            "read_calls())"
        )
    _check_branching(config, agent, deployment, deployment_config, source)
    return ResolvedAgent(
        agent=agent,
        agent_settings=agent_settings,
        config=config,
        tools=tools,
        parser=parser,
        deployment=deployment,
        deployment_config=deployment_config,
        env=config.env,
        reward=reward,
        services=services,
        mcp_servers=mcp_servers,
        source=source,
        registry=registry,
    )


def _check_branching(
    config: AgentConfig, agent: Any, deployment: Any, deployment_config: Any, source: str
) -> None:
    """Tree rollouts need the built-in loop and a sandbox backend that forks."""
    branching = config.interaction.branching
    if branching is None or not branching.enabled:
        return
    where = f"invalid {source}:\n  interaction.branching"
    if agent.is_harness or not getattr(agent.runner, "runs_branching", False):
        raise ConfigError(
            f"{where}: tree rollouts run in the built-in loop (agent `react`), not in agent "
            f"{agent.name!r}"
        )
    if not deployment.can_fork:
        raise ConfigError(
            f"{where}: the {deployment.name!r} sandbox backend cannot fork its sandboxes "
            "(`uniagent plugins --json` shows can_fork); use one that can (host, local, modal)"
        )
    if getattr(deployment_config, "binds", None):
        raise ConfigError(
            f"{where}: env.deployment.binds are shared by a sandbox and its forks (each "
            "leaf would see the others' writes there); use ro_binds, or copy what the "
            "agent writes into the work dir"
        )


def _with_mcp_sockets(config: AgentConfig, deployment_config: Any, source: str) -> Any:
    """The deployment config that shows this process's MCP sockets (``scope: process``)."""
    scoped = [i for i, ref in enumerate(config.tools) if ref.mcp and ref.mcp.scope == "process"]
    if not scoped:
        return deployment_config
    if "ro_binds" not in type(deployment_config).model_fields:
        raise ConfigError(
            f"invalid {source}:\n  tools.{scoped[0]}.mcp.scope: process needs a host "
            f"deployment (its sandbox reaches the server through a Unix socket of this "
            f"machine), not {deployment_config.type!r}"
        )
    from uniagent.mcp.process import socket_dir

    binds = list(deployment_config.ro_binds)
    folder = str(socket_dir())
    if folder not in binds:
        binds.append(folder)
    return deployment_config.model_copy(update={"ro_binds": binds})


def _reward(registry: Registry, config: RewardConfig, source: str) -> ResolvedReward:
    if config.rubric is None:
        spec = _component(registry, config.name, "reward", source)
        settings = _settings(
            spec.settings, config.settings, "reward.settings", source, what=f"reward {spec.name!r}"
        )
        grade_in = config.grade_in or spec.integrity.grade_in
        return ResolvedReward(spec, settings, grade_in, config.integrity)
    parts: list[tuple[str, Any, float, bool]] = [
        (f"reward.rubric.{i}", c, c.weight, False) for i, c in enumerate(config.rubric)
    ] + [(f"reward.metrics.{i}", m, 0.0, True) for i, m in enumerate(config.metrics)]
    components = []
    for path, part, weight, metric in parts:
        spec = _component(registry, part.name, path, source)
        settings = _settings(
            spec.settings, part.settings, f"{path}.settings", source, what=f"reward {spec.name!r}"
        )
        components.append(Component(part.key, spec, settings, weight, metric))
    rubric = Rubric(tuple(components), config.aggregate, config.pass_score)
    spec = rubric_spec(rubric)
    grade_in = config.grade_in or spec.integrity.grade_in
    return ResolvedReward(spec, rubric, grade_in, config.integrity)


def _fresh_sandbox_apart(config: AgentConfig, deployment: BaseModel, source: str) -> None:
    """``grade_in: fresh`` starts a second sandbox of the episode's config: refused where
    that one would work in the episode's own directory (a host sandbox without isolation
    and a fixed ``env.workdir``): its set-up would meet the episode's files, every episode
    an ``env_error``. A directory of its own would not do: the tests and set-up commands of
    a task that fixes its work dir may name that path."""
    from uniagent.env.host import HostDeploymentConfig
    from uniagent.env.host_check import shared_workdir

    if not isinstance(deployment, HostDeploymentConfig):
        return
    workdir = shared_workdir(deployment, config.env)
    if workdir is None:
        return
    defaulted = config.reward is not None and config.reward.grade_in is None
    default = " (the reward's default)" if defaulted else ""
    isolation = "none" if deployment.isolation == "none" else "auto, and bwrap does not work here"
    raise ConfigError(
        f"invalid {source}:\n  env.workdir: {workdir} is one directory of this machine for "
        f"every sandbox (isolation: {isolation}), and reward.grade_in: fresh"
        f"{default} grades in a second sandbox that would start there, in the episode's own "
        "directory, so every episode would fail; set reward.grade_in: episode, or drop "
        "env.workdir (each sandbox then works in a directory of its own), "
        f"or use isolation: bwrap with sandbox_workdir: {workdir} in place of env.workdir "
        "(each sandbox then sees its own directory at that path)"
    )


def _component(registry: Registry, name: str, path: str, source: str) -> RewardSpec[Any]:
    spec: RewardSpec[Any] = _lookup(registry.rewards(), name, f"{path}.name", source)
    return spec


def _agent(
    registry: Registry, config: AgentConfig, deployment: BaseModel, source: str
) -> tuple[AgentSpec[Any], Any]:
    """The agent record and its validated settings; a harness's sandbox needs checked."""
    name = config.agent.name
    agents = registry.agents()
    spec: AgentSpec[Any] = _lookup(agents, name, "agent.name", source)
    settings = _settings(
        spec.settings, config.agent.settings, "agent.settings", source, what=f"agent {name!r}"
    )
    if not spec.is_harness:
        return spec, settings
    kind = str(getattr(deployment, "type", ""))
    if kind not in spec.deployments:
        raise ConfigError(
            f"invalid {source}:\n  env.deployment.type: agent {name!r} runs in "
            f"{', '.join(spec.deployments)} sandboxes, not {kind!r}"
        )
    if kind == "local":
        from uniagent.env.local import network_of

        if network_of(list(getattr(deployment, "run_args", []))) == "none":
            raise ConfigError(
                f"invalid {source}:\n  env.deployment.run_args: agent {name!r} reaches its "
                "model through the gateway on this machine: its container needs a network, "
                "not `--network none` (a Harbor task's no-network policy)"
            )
    isolation = getattr(deployment, "isolation", None)
    if kind == "host" and isolation != "none" and getattr(deployment, "network", None) is not True:
        raise ConfigError(
            f"invalid {source}:\n  env.deployment.network: agent {name!r} reaches its model "
            "through the gateway on this machine's network: set `network: true` (the sandbox "
            "then shares this machine's network)"
        )
    return spec, settings


def _lookup(records: Mapping[str, Any], name: str, path: str, source: str) -> Any:
    try:
        return records[name]
    except UnknownPluginNameError as exc:
        raise UnknownPluginNameError(f"invalid {source}:\n  {path}: {exc}") from None


def _tool(registry: Registry, ref: ToolRef, path: str, source: str) -> ToolSpec:
    spec: ToolSpec = _lookup(registry.tools(), ref.name, f"{path}.name", source)
    if ref.settings is None:
        return spec
    if spec.settings is None or spec.configure is None:
        raise ConfigError(
            f"invalid {source}:\n  {path}.settings: tool {spec.name!r} takes no settings"
        )
    settings = _settings(
        spec.settings, ref.settings, f"{path}.settings", source, what=f"tool {spec.name!r}"
    )
    configured = spec.configure(settings)
    if configured.name != spec.name:
        raise ConfigError(f"tool {spec.name!r}: its configure() renamed it {configured.name!r}")
    return configured


def _settings(
    model: type[BaseModel] | None,
    raw: Mapping[str, Any] | None,
    path: str,
    source: str,
    *,
    what: str,
) -> Any:
    if model is None:
        if raw:
            raise ConfigError(f"invalid {source}:\n  {path}: {what} takes no settings")
        return None
    try:
        return model.model_validate(dict(raw or {}))
    except ValidationError as exc:
        message = format_validation_error(exc, source, prefix=path)
        raise ConfigError(message) from None


def _deployment_config(registry: Registry, data: Mapping[str, Any], source: str) -> BaseModel:
    try:
        return registry.validate_deployment_config(data)
    except ConfigError as exc:
        raise ConfigError(f"invalid {source}:\n  env.deployment: {exc}") from None


def open_env(
    deployment: Mapping[str, Any] | BaseModel,
    settings: EnvConfig | Mapping[str, Any] | None = None,
    *,
    registry: Registry | None = None,
) -> AgentEnv:
    """A new, unstarted sandbox of the installed backend ``deployment['type']``.

    ``settings`` are the ``env`` settings (post-set-up commands, variables, work dir); an
    unknown type or key is a :class:`~uniagent.errors.ConfigError` naming the installed
    backends. Episodes get theirs from :meth:`ResolvedAgent.new_env`; this is for scripts,
    tests and tools::

        async with open_env({"type": "host", "isolation": "bwrap"}) as env:
            print((await env.run("uname -a")).output)
    """
    spec, config = resolve_deployment(deployment, registry=registry)
    env = settings if isinstance(settings, EnvConfig) else EnvConfig.model_validate(settings or {})
    if spec.check is not None:  # what the sandbox would fail with at start, said now
        problems = spec.check(config, env)
        if problems:
            raise ConfigError("invalid settings:\n  " + "\n  ".join(f"env.{p}" for p in problems))
    return AgentEnv(spec.factory(config), env)


def resolve_deployment(
    data: Mapping[str, Any] | BaseModel, *, registry: Registry | None = None
) -> tuple[DeploymentSpec[Any], Any]:
    """The installed backend for a deployment config, and the config validated by it."""
    registry = registry or get_registry()
    config = registry.validate_deployment_config(data)
    return registry.deployments()[config.type], config  # type: ignore[attr-defined]
