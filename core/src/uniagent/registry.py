"""Typed look-ups of what the installed plugins contribute."""

from __future__ import annotations

import dataclasses
import difflib
import threading
import warnings
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Annotated, Any, Generic, TypeVar, Union

from pydantic import BaseModel, BeforeValidator, Field, TypeAdapter, ValidationError

from uniagent.errors import ConfigError, PluginConflictError, UnknownPluginNameError
from uniagent.plugins import PluginManager, load_plugins
from uniagent.specs import (
    KINDS,
    AgentSpec,
    DeploymentSpec,
    Kind,
    ParserSpec,
    RewardSpec,
    ServiceSpec,
    ToolSpec,
)

if TYPE_CHECKING:  # pragma: no cover
    from uniagent.parsers.base import ToolCallParser

R = TypeVar("R", ToolSpec, DeploymentSpec, ParserSpec, RewardSpec, ServiceSpec, AgentSpec)

_SINGULAR: dict[Kind, str] = {
    "tools": "tool",
    "deployments": "deployment",
    "tool_parsers": "tool parser",
    "rewards": "reward",
    "services": "service",
    "agents": "agent",
}


class PluginOverrideWarning(UserWarning):
    """An external plugin replaced a built-in record of the same name."""


#: What our plugin distributions (``plugins/*`` in uniagent's repository) provide, by kind:
#: a config naming one of these without it gets the distribution to install. The core never
#: imports them; ``tests/test_first_party_plugins.py`` checks this table against their
#: registrations (and docs/plugins.md's table against this one).
FIRST_PARTY_PLUGINS: dict[str, dict[Kind, tuple[str, ...]]] = {
    "uniagent-agents-cli": {"agents": ("claude-code", "codex", "mini-swe-agent", "openhands")},
    "uniagent-deploy-modal": {"deployments": ("modal",)},
    "uniagent-reward-swebench": {"rewards": ("r2e_gym", "swe_bench", "swe_rebench")},
    "uniagent-tools-search": {
        "tools": ("fetch_document", "search", "search_arxiv"),
        "rewards": ("search_qa",),
        "services": ("search",),
    },
    "uniagent-tools-swe": {"tools": ("execute_bash", "finish", "str_replace_editor", "submit")},
}


def first_party_provider(kind: Kind, name: str) -> str | None:
    """The distribution of ours (:data:`FIRST_PARTY_PLUGINS`) that provides ``name``."""
    return next(
        (dist for dist, kinds in FIRST_PARTY_PLUGINS.items() if name in kinds.get(kind, ())),
        None,
    )


class Records(Mapping[str, R], Generic[R]):
    """A read-only name → record mapping whose misses explain what is installed."""

    def __init__(
        self, kind: Kind, records: dict[str, R], manager: PluginManager | None = None
    ) -> None:
        self.kind = kind
        self._records: dict[str, R] = records
        self._manager = manager

    def __getitem__(self, name: str) -> R:
        try:
            return self._records[name]
        except KeyError:
            raise UnknownPluginNameError(
                unknown_name_message(self.kind, name, self._records, self._manager)
            ) from None

    def __contains__(self, name: object) -> bool:
        return name in self._records

    def __iter__(self) -> Iterator[str]:
        return iter(self._records)

    def __len__(self) -> int:
        return len(self._records)

    def __repr__(self) -> str:
        return f"Records({self.kind!r}, {sorted(self._records)!r})"


def unknown_name_message(
    kind: Kind, name: str, installed: Mapping[str, Any], manager: PluginManager | None = None
) -> str:
    """Explain an unknown name: what is installed, then the distribution of ours that
    provides it and why it is not here (``manager``: where it looked; default: this
    process's ``sys.path``), or a close installed name and where to look."""
    what = _SINGULAR[kind]
    listing = ", ".join(sorted(installed)) or "none"
    message = f"unknown {what} {name!r}; installed {kind.replace('_', ' ')}: {listing}."
    provider = first_party_provider(kind, name)
    if provider is not None:
        why = (manager or PluginManager()).absence(provider)
        return f"{message} {name!r} comes with {provider}, {why}"
    close = difflib.get_close_matches(name, list(installed), n=1)
    if close:
        message += f" Did you mean {close[0]!r}?"
    return message + (
        f" A plugin may provide {name!r}: `uniagent plugins` lists what each installed one "
        'provides, and docs/plugins.md ("First-party plugins") what each of ours adds.'
    )


class Registry:
    """Records of every kind, collected from one plugin manager and cached."""

    def __init__(self, manager: PluginManager) -> None:
        self.manager = manager
        self._cache: dict[Kind, Records[Any]] = {}
        self._lock = threading.Lock()

    def get(self, kind: Kind) -> Records[Any]:
        """All records of one kind; conflicts raise, built-in overrides warn."""
        with self._lock:
            if kind not in self._cache:
                self._cache[kind] = Records(kind, self._collect(kind), self.manager)
            return self._cache[kind]

    def _collect(self, kind: Kind) -> dict[str, Any]:
        found: dict[str, Any] = {}
        for info, records in self.manager.contributions(kind):
            for record in records:
                record = dataclasses.replace(
                    record, distribution=info.distribution, builtin=info.builtin
                )
                previous = found.get(record.name)
                if previous is not None:
                    if previous.builtin != record.builtin:
                        override = record if previous.builtin else previous
                        warnings.warn(
                            f"{_SINGULAR[kind]} {record.name!r} from {override.distribution} "
                            f"overrides the built-in one",
                            PluginOverrideWarning,
                            stacklevel=2,
                        )
                        found[record.name] = override
                        continue
                    else:
                        raise PluginConflictError(
                            f"{_SINGULAR[kind]} {record.name!r} is provided by both "
                            f"{previous.distribution} and {record.distribution}; uninstall one, "
                            f"or block one with UNIAGENT_DISABLE_PLUGINS={record.distribution}"
                        )
                found[record.name] = record
        return found

    def tools(self) -> Records[ToolSpec]:
        """Tools by name."""
        return self.get("tools")

    def deployments(self) -> Records[DeploymentSpec]:
        """Deployments (sandbox backends) by name."""
        return self.get("deployments")

    def tool_parsers(self) -> Records[ParserSpec]:
        """Tool-call parsers by name."""
        return self.get("tool_parsers")

    def rewards(self) -> Records[RewardSpec]:
        """Rewards by name."""
        return self.get("rewards")

    def services(self) -> Records[ServiceSpec]:
        """Process-wide services by name."""
        return self.get("services")

    def agents(self) -> Records[AgentSpec]:
        """Agents (the built-in loop, harnesses) by name."""
        return self.get("agents")

    def contributions(self) -> dict[str, dict[Kind, list[str]]]:
        """Per plugin key (distribution, or ``uniagent:<module>`` for built-ins), names per kind."""
        out: dict[str, dict[Kind, list[str]]] = {}
        for kind in KINDS:
            for info, records in self.manager.contributions(kind):
                names = out.setdefault(info.key, {k: [] for k in KINDS})[kind]
                names.extend(sorted(r.name for r in records))
        return out

    # -- deployment configs ---------------------------------------------------
    def deployment_config_adapter(self) -> TypeAdapter[Any]:
        """A ``TypeAdapter`` for the union of installed deployment configs (by ``type``)."""
        configs = tuple(spec.config for spec in self.deployments().values())
        if not configs:
            raise ConfigError(
                "no deployment backend is installed; install uniagent or a deploy plugin"
            )
        union: Any = (
            configs[0]
            if len(configs) == 1
            else Annotated[
                Union[configs], Field(discriminator="type")  # noqa: UP007
            ]
        )
        installed = self.deployments()

        def known_type(data: Any) -> Any:
            # Without this, pydantic's own message neither lists the installed
            # types nor says which package would add the missing one.
            if isinstance(data, Mapping):
                kind = data.get("type")
                if kind is None:
                    raise ValueError(
                        "deployment config has no 'type'; installed types: "
                        + ", ".join(sorted(installed))
                    )
                if kind not in installed:
                    raise ValueError(
                        unknown_name_message("deployments", str(kind), installed, self.manager)
                    )
            return data

        return TypeAdapter(Annotated[union, BeforeValidator(known_type)])

    def validate_deployment_config(self, data: Mapping[str, Any] | BaseModel) -> BaseModel:
        """Validate a deployment config; an unknown ``type`` names the installed ones."""
        if isinstance(data, BaseModel):
            data = data.model_dump()
        if not isinstance(data, Mapping):
            raise ConfigError(f"a deployment config must be a mapping with a 'type', got {data!r}")
        try:
            return self.deployment_config_adapter().validate_python(dict(data))
        except ValidationError as exc:
            problems = "; ".join(_error_text(err) for err in exc.errors())
            raise ConfigError(f"invalid deployment config {dict(data)!r}: {problems}") from None


def _error_text(err: Any) -> str:
    """One pydantic error as ``key: message``, without pydantic's union plumbing."""
    loc = [str(p) for p in err["loc"] if not str(p).startswith(("function-", "tagged-union"))]
    message = str(err["msg"]).removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        message = "unknown key"
    return f"{'.'.join(loc[1:] if len(loc) > 1 else loc)}: {message}" if loc else message


_registry: Registry | None = None
_registry_lock = threading.Lock()


def get_registry() -> Registry:
    """The process-wide registry over :func:`uniagent.plugins.load_plugins`.

    It follows the plugin manager: after :func:`uniagent.plugins.reset_plugins`, the next
    call builds a registry over the manager that loads then.
    """
    global _registry
    manager = load_plugins()
    with _registry_lock:
        if _registry is None or _registry.manager is not manager:
            _registry = Registry(manager)
        return _registry


def reset_registry() -> None:
    """Forget the process-wide registry."""
    global _registry
    with _registry_lock:
        _registry = None


def get_parser(name: str) -> ToolCallParser:
    """A new parser of the installed kind ``name`` (raises ``UnknownPluginNameError``)."""
    return get_registry().tool_parsers()[name].factory()


def _deprecated_lookup(name: str, kind: str) -> None:
    warnings.warn(
        f"uniagent.{name}() is deprecated since uniagent 0.3 and goes in 0.4: "
        f"use uniagent.get_registry().{kind}",
        DeprecationWarning,
        stacklevel=3,
    )


def get_tools() -> Records[ToolSpec]:
    """Deprecated: ``get_registry().tools()``."""
    _deprecated_lookup("get_tools", "tools()")
    return get_registry().tools()


def get_deployments() -> Records[DeploymentSpec]:
    """Deprecated: ``get_registry().deployments()``."""
    _deprecated_lookup("get_deployments", "deployments()")
    return get_registry().deployments()


def get_tool_parsers() -> Records[ParserSpec]:
    """Deprecated: ``get_registry().tool_parsers()``."""
    _deprecated_lookup("get_tool_parsers", "tool_parsers()")
    return get_registry().tool_parsers()


def get_rewards() -> Records[RewardSpec]:
    """Deprecated: ``get_registry().rewards()``."""
    _deprecated_lookup("get_rewards", "rewards()")
    return get_registry().rewards()


def get_services() -> Records[ServiceSpec]:
    """Deprecated: ``get_registry().services()``."""
    _deprecated_lookup("get_services", "services()")
    return get_registry().services()


def deployment_config_adapter() -> TypeAdapter[Any]:
    """The deployment-config union over the installed backends."""
    return get_registry().deployment_config_adapter()


def validate_deployment_config(data: Mapping[str, Any] | BaseModel) -> BaseModel:
    """Deprecated: ``get_registry().validate_deployment_config(data)``."""
    _deprecated_lookup("validate_deployment_config", "validate_deployment_config(data)")
    return get_registry().validate_deployment_config(data)
