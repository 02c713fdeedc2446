"""The typed, frozen records that plugins contribute through the hooks.

Each hook in :mod:`uniagent.hookspecs` returns an iterable of one of these
records. The registry fills in ``distribution`` (the pip distribution that
contributed the record) and ``builtin`` (shipped with the core); plugin authors
leave both at their defaults.
"""

from __future__ import annotations

import copy
import functools
import importlib.util
import json
import re
import shlex
import warnings
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, Literal, Protocol, TypeVar, get_args

from pydantic import BaseModel

from uniagent.protect.settings import IntegrityDefaults

if TYPE_CHECKING:  # pragma: no cover - imports for type checkers only
    from uniagent.agent_run import EpisodeAgent, EpisodeContext
    from uniagent.env.runtime import Deployment
    from uniagent.parsers.base import ToolCallParser
    from uniagent.reward import RewardContext, RewardResult

#: A plugin's settings model (``None`` where it takes none).
S = TypeVar("S")

Kind = Literal["tools", "deployments", "tool_parsers", "rewards", "services", "agents"]
KINDS: tuple[Kind, ...] = get_args(Kind)


@dataclass(frozen=True, kw_only=True)
class _Record:
    name: str
    distribution: str = field(default="", compare=False)
    builtin: bool = field(default=False, compare=False)

    def __post_init__(self) -> None:
        if not self.name or not self.name.replace("_", "").replace("-", "").isalnum():
            raise ValueError(
                f"{type(self).__name__} name {self.name!r} must be non-empty and use only "
                "letters, digits, '_' and '-'"
            )


class _SettingsRecord(_Record):
    """A record whose plugin settings model is ``settings`` (``config``: its deprecated name).

    ``config=`` is still taken, with a ``DeprecationWarning``, and ``.config`` still reads
    the model, until 0.4 (docs/plugins.md, "Compatibility").
    """

    settings: Any
    config: Any

    def _take_deprecated_config(self) -> None:
        if self.config is not None and self.settings is None:
            kind = type(self).__name__
            warnings.warn(
                f"{kind}(config=...) is deprecated since uniagent 0.3 and goes in 0.4: "
                f"pass the settings model as {kind}(settings=...)",
                DeprecationWarning,
                stacklevel=4,
            )
            object.__setattr__(self, "settings", self.config)
        elif self.config is not None and self.config is not self.settings:
            raise ValueError(f"{type(self).__name__} {self.name!r}: give settings=, not config=")
        object.__setattr__(self, "config", self.settings)


def _installed(module: str) -> bool:
    """Whether ``module`` can be imported here (found, not imported)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


@functools.lru_cache(maxsize=1024)
def _parameters_schema(arguments: type[BaseModel]) -> dict[str, Any]:
    # pydantic rebuilds the schema on every call (~0.3 ms): once per model is enough.
    schema = arguments.model_json_schema()
    schema.pop("title", None)
    for prop in schema.get("properties", {}).values():
        prop.pop("title", None)
    schema.setdefault("properties", {})
    schema.setdefault("required", [])
    return schema


@dataclass(frozen=True, kw_only=True)
class ToolSpec(_Record):
    """A tool the agent can call; it runs as a command inside the sandbox.

    ``arguments`` is a pydantic model whose JSON schema becomes the OpenAI
    function ``parameters``. ``scripts`` are uploaded into the sandbox's tools
    directory (which is on ``PATH``) and made executable; ``install`` runs once
    after the upload. A call becomes a bash command through ``render`` when
    given, else ``executable --arg value ...`` with every value shell-quoted,
    lists and dicts JSON-encoded and omitted optional arguments left out.
    ``ends_episode`` marks finishing tools (``submit``, ``finish``).

    ``settings`` is the pydantic model of the tool's settings in the agent
    config (``tools: [{name: ..., settings: {...}}]``), and ``configure(settings)``
    returns the tool configured by them (a new record of the same name).
    """

    description: str
    arguments: type[BaseModel]
    scripts: tuple[Path, ...] = ()
    install: str | None = None
    executable: str | None = None
    render: Callable[[Mapping[str, Any]], str] | None = field(default=None, compare=False)
    ends_episode: bool = False
    settings: type[BaseModel] | None = None
    configure: Callable[[Any], ToolSpec] | None = field(default=None, compare=False)
    #: ``score(arguments, output, exit_code)``: a score this call's observation adds to its
    #: model turn (``None``: none), e.g. a ``submit`` running a quick check; per-task points
    #: come from the tool's settings (``configure``). Dropped when the grader forces the score.
    score: Callable[[Mapping[str, Any], str, int | None], float | None] | None = field(
        default=None, compare=False
    )

    def parameters_schema(self) -> dict[str, Any]:
        """The JSON schema of the arguments, as OpenAI function ``parameters`` (a copy)."""
        return copy.deepcopy(_parameters_schema(self.arguments))

    def openai_schema(self) -> dict[str, Any]:
        """The tool as an OpenAI ``tools`` entry (``{"type": "function", ...}``)."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters_schema(),
            },
        }

    def validate_arguments(self, arguments: Mapping[str, Any]) -> BaseModel:
        """Validate call arguments against the model (raises ``pydantic.ValidationError``)."""
        return self.arguments.model_validate(dict(arguments))

    def to_command(self, arguments: Mapping[str, Any]) -> str:
        """Turn validated call arguments into the bash command that runs the tool."""
        if self.render is not None:
            return self.render(arguments)
        parts = [self.executable or self.name]
        for key in self.arguments.model_fields:
            if key not in arguments or arguments[key] is None:
                continue
            value = arguments[key]
            text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
            parts += [f"--{key}", shlex.quote(text)]
        return " ".join(parts)


C = TypeVar("C", bound=BaseModel)


@dataclass(frozen=True, kw_only=True)
class DeploymentSpec(_Record, Generic[C]):
    """A sandbox backend.

    ``config`` is a pydantic model whose ``type`` field is ``Literal[name]``;
    it becomes one member of the deployment-config discriminated union.
    ``factory(config)`` returns a :class:`uniagent.sandbox.Deployment`.
    ``check(config, env)``, when given, is called when an agent config resolves, with the
    validated config and the agent's ``env`` settings (:class:`uniagent.env.config.EnvConfig`):
    it returns what every sandbox would fail with at start, each ``KEY.PATH: message`` with
    the key path under ``env`` (``deployment.bwrap_args.3: ...``), and ``resolve`` raises
    one :class:`~uniagent.errors.ConfigError` listing them, before any sandbox starts.
    ``cleanup(config, run_ids)``, when given, removes what sandboxes of killed runs left
    behind (directories, cgroups, containers of dead owners, and those of ``run_ids``)
    and returns a line per thing removed. ``uniagent run`` calls it with the run's config
    before the first episode, ``uniagent clean`` with ``None`` (every leftover this
    backend can find). It runs in a worker thread and must not raise for what it cannot
    reach (an engine that does not answer has nothing to remove).
    """

    config: type[C]
    factory: Callable[[C], Deployment] = field(compare=False)
    cleanup: Callable[[C | None, Iterable[str]], list[str]] | None = field(
        default=None, compare=False
    )
    #: Modules the backend imports when it starts, each with the package that provides it
    #: (``{"swerex": "uniagent[swerex]"}``): ``uniagent plugins`` says when one is missing.
    needs: Mapping[str, str] = field(default_factory=dict, compare=False)

    def missing(self) -> list[str]:
        """The packages of :attr:`needs` whose module is not installed here (once each)."""
        return sorted({pkg for module, pkg in self.needs.items() if not _installed(module)})

    check: Callable[[C, Any], list[str]] | None = field(default=None, compare=False)
    #: Whether its sandboxes can fork (:meth:`uniagent.env.AgentEnv.fork`): the deployment
    #: has an ``async fork()`` that returns a new started deployment in its state.
    can_fork: bool = field(default=False, compare=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        type_field = self.config.model_fields.get("type")
        if type_field is None or get_args(type_field.annotation) != (self.name,):
            raise ValueError(
                f"deployment {self.name!r}: its config model {self.config.__name__} must declare "
                f"`type: Literal[{self.name!r}]`"
            )


@dataclass(frozen=True, kw_only=True)
class ParserSpec(_Record):
    """A tool-call parser; ``factory()`` returns a new :class:`uniagent.ToolCallParser`."""

    factory: Callable[[], ToolCallParser] = field(compare=False)
    description: str = ""


@dataclass(frozen=True, kw_only=True)
class RewardSpec(_SettingsRecord, Generic[S]):
    """A reward computed at the end of an episode, in a grading sandbox the agent cannot reach.

    ``fn(ctx)`` is awaited with a ``uniagent.reward.RewardContext`` and returns a
    float or a ``uniagent.reward.RewardResult``. ``settings`` optionally validates
    the reward's settings from the agent config (``reward: {name, settings: {...}}``).
    ``uses_sandbox=False`` marks
    rewards that grade only the submission text (no grading sandbox, no
    baseline). ``integrity`` gives the reward's defaults for what the grader
    protects (history scrub, protect and content rules, and a ``workspace``
    function naming each task's repository, base commit and benchmark-owned
    files); see docs/rewards.md. ``task_fields(settings)`` optionally names the task
    fields the reward cannot grade without (given its settings): ``uniagent run`` and
    ``uniagent verify`` refuse a task set whose rows lack one, before any episode starts.
    """

    fn: Callable[[RewardContext[S]], Awaitable[RewardResult | float]] = field(compare=False)
    settings: type[S] | None = None
    description: str = ""
    uses_sandbox: bool = True
    integrity: IntegrityDefaults = field(default_factory=IntegrityDefaults, compare=False)
    #: In a rubric, whether this reward may run at the same time as the other rewards that
    #: allow it (it only reads the sandbox, or writes only under its own scratch paths).
    concurrent: bool = False
    #: The task fields this reward needs with these settings (a row without one, or with
    #: it null or empty, cannot be graded); ``None``: not declared, nothing is checked.
    task_fields: Callable[[S], Iterable[str]] | None = field(default=None, compare=False)
    #: Deprecated name of ``settings`` (until 0.4).
    config: type[S] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        self._take_deprecated_config()


class RunningService(Protocol):
    """What :attr:`ServiceSpec.start` returns: a started service that can be stopped."""

    async def stop(self) -> None:
        """Stop the service; safe to call twice."""
        ...


@dataclass(frozen=True, kw_only=True)
class ServiceSpec(_SettingsRecord, Generic[S]):
    """A process-wide helper the tools talk to (e.g. a retrieval server), run beside episodes.

    An agent config names it under ``services`` (``services: {NAME: {settings}}``);
    ``uniagent run`` and the verl adapter await ``start(settings)`` once per process
    before the first episode and, where the process has an end they control
    (``uniagent run``), ``stop()`` on what it returned; what ``start`` gets is an
    instance of ``settings`` (validated when the agent config resolves) or ``None``
    without one.
    A service must not outlive its process (e.g. a child process that dies with its
    parent), since a training worker may simply exit.
    """

    start: Callable[[S], Awaitable[RunningService]] = field(compare=False)
    settings: type[S] | None = None
    description: str = ""
    #: Deprecated name of ``settings`` (until 0.4).
    config: type[S] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        self._take_deprecated_config()


#: The wire formats a harness can speak to the gateway, named as its trees record them:
#: OpenAI Chat Completions, OpenAI Responses, Anthropic Messages.
Wire = Literal["chat", "responses", "messages"]
WIRES: tuple[Wire, ...] = get_args(Wire)


@dataclass(frozen=True)
class AgentInstall:
    """How a harness is installed, pinned: ``pip`` (into its own venv), ``npm`` (into its own
    prefix) or ``binary`` (one executable file, from a local path, checked by its sha256).

    It is installed once per machine into uniagent's cache and made visible, read-only, to
    each episode's sandbox; ``command`` is the executable it provides (``mini``, ``claude``).
    """

    kind: Literal["pip", "npm", "binary"]
    package: str
    version: str
    command: str
    #: ``binary`` only: the sha256 of the file (its pin).
    sha256: str | None = None
    #: ``pip`` only: more packages installed into the same venv, each pinned
    #: (``name==version``).
    extras: tuple[str, ...] = ()
    #: ``pip`` only: the lowest Python its venv needs (``"3.12"``); by default the
    #: system's ``python3``. Another interpreter is found on ``PATH`` (``python3.12``,
    #: pyenv's shims) and its installation is made visible, read-only, to the sandbox.
    python: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("pip", "npm", "binary"):
            raise ValueError(f"install kind must be pip, npm or binary, not {self.kind!r}")
        if not self.version or any(c in self.version for c in "<>=~^*, "):
            raise ValueError(
                f"install of {self.package!r}: pin one exact version, not {self.version!r}"
            )
        if self.kind == "binary" and not self.sha256:
            raise ValueError(f"binary install {self.package!r}: give its sha256 (its pin)")
        if (self.extras or self.python) and self.kind != "pip":
            raise ValueError(f"install of {self.package!r}: extras and python are for pip")
        for extra in self.extras:
            name, sep, pin = extra.partition("==")
            if not name or not sep or not pin or any(c in pin for c in "<>=~^*, "):
                raise ValueError(
                    f"install of {self.package!r}: pin each extra as name==version, not {extra!r}"
                )
        if self.python is not None and not re.fullmatch(r"3\.\d+", self.python):
            raise ValueError(
                f"install of {self.package!r}: python is a version like '3.12', not {self.python!r}"
            )

    def describe(self) -> dict[str, Any]:
        """JSON-ready, for ``uniagent plugins --json``."""
        out: dict[str, Any] = {"kind": self.kind, "package": self.package}
        out.update(version=self.version, command=self.command)
        if self.sha256:
            out["sha256"] = self.sha256
        if self.extras:
            out["extras"] = list(self.extras)
        if self.python:
            out["python"] = self.python
        return out


@dataclass(frozen=True)
class AgentLaunch:
    """What a harness is started with, in the episode's sandbox.

    ``base_url`` is the gateway session's base URL without ``/v1`` (``http://H:P/s/ID``);
    ``api_key`` the session's key; ``instruction`` the task's first user message;
    ``workdir`` the sandbox's work dir; ``home`` a fresh folder for the harness's own
    config and logs (its ``HOME``); ``bin`` the folder holding the installed ``command``.
    """

    base_url: str
    api_key: str
    instruction: str
    workdir: str
    home: str
    bin: str


@dataclass(frozen=True)
class AgentCommand:
    """How to run a harness once: a bash command line, its variables, files written first
    (path → text; relative paths are under ``home``), and its wall-clock limit in seconds."""

    command: str
    env: Mapping[str, str] = field(default_factory=dict)
    files: Mapping[str, str] = field(default_factory=dict)
    timeout: float = 1800.0


@dataclass(frozen=True)
class AgentOutcome:
    """How a harness run ended, as the spec reads it: an exit reason (``"finished"``,
    ``"max_step_limit"``, ``"format_error"``, ...) and the submission text, if any."""

    exit_reason: str
    submission: str | None = None


def default_outcome(exit_code: int | None, output: str, settings: Any) -> AgentOutcome:
    """Exit status 0: ``finished``; any other: ``format_error`` (the harness gave up on the
    model's output: the policy's outcome, trained on)."""
    return AgentOutcome("finished" if exit_code == 0 else "format_error")


@dataclass(frozen=True, kw_only=True)
class AgentSpec(_Record, Generic[S]):
    """An agent: the built-in ReAct loop (``react``), a harness run inside the sandbox, or
    any other :class:`~uniagent.agent_run.EpisodeAgent`.

    ``runner(context)`` makes the agent of one episode from its
    :class:`~uniagent.agent_run.EpisodeContext` (the built-in loop's:
    :class:`uniagent.interaction.agent.ReactAgent`). A harness needs none: uniagent runs it
    (:class:`uniagent.agents.harness.HarnessAgent`).

    A harness has an ``install`` (pinned), speaks one ``wire`` format to the gateway, and
    ``launch(launch, settings)`` gives the :class:`AgentCommand` that runs it with an
    :class:`AgentLaunch` (base URL, key, instruction, work dir); its own step and time
    limits belong in ``settings`` (a pydantic model, validated at resolve time) and in the
    command's ``timeout``. ``outcome(exit_code, output, settings)`` reads how it finished
    (default :func:`default_outcome`); ``logs`` are its own log files, relative to its home,
    kept with the episode. ``deployments`` names the sandbox backends it runs in.
    """

    description: str = ""
    install: AgentInstall | None = None
    wire: Wire | None = None
    launch: Callable[[AgentLaunch, Any], AgentCommand] | None = field(default=None, compare=False)
    outcome: Callable[[int | None, str, Any], AgentOutcome] = field(
        default=default_outcome, compare=False
    )
    logs: tuple[str, ...] = ()
    settings: type[S] | None = None
    deployments: tuple[str, ...] = ("host",)
    runner: Callable[[EpisodeContext], EpisodeAgent] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        harness = (self.install, self.wire, self.launch)
        if any(x is not None for x in harness) and any(x is None for x in harness):
            raise ValueError(f"agent {self.name!r}: a harness needs install, wire and launch")
        if self.runner is None and self.launch is None:
            raise ValueError(
                f"agent {self.name!r}: give it a runner (an EpisodeAgent for each episode) "
                "or a harness's install, wire and launch"
            )
        if self.wire is not None and self.wire not in WIRES:
            raise ValueError(f"agent {self.name!r}: wire must be one of {', '.join(WIRES)}")

    @property
    def is_harness(self) -> bool:
        """Whether it runs as a program in the sandbox (not the built-in loop)."""
        return self.launch is not None

    def describe(self) -> dict[str, Any]:
        """Its install and wire details, JSON-ready (``uniagent plugins --json``)."""
        return {
            "install": self.install.describe() if self.install else None,
            "wire": self.wire,
            "harness": self.is_harness,
            "deployments": list(self.deployments) if self.is_harness else None,
            "logs": list(self.logs),
            "settings": (
                self.settings.model_json_schema()  # type: ignore[attr-defined]
                if self.settings is not None
                else None
            ),
        }


Record = ToolSpec | DeploymentSpec | ParserSpec | RewardSpec | ServiceSpec | AgentSpec

RECORD_TYPES: dict[Kind, type] = {
    "tools": ToolSpec,
    "deployments": DeploymentSpec,
    "tool_parsers": ParserSpec,
    "rewards": RewardSpec,
    "services": ServiceSpec,
    "agents": AgentSpec,
}
