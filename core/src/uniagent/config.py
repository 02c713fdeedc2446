"""The agent configuration (YAML), with per-task overrides.

A config is plain, strict data: it names plugins (tool parser, tools,
deployment, reward, services) by the names they register and holds their raw
settings; unknown keys are rejected everywhere with their path. It never
consults the registry: :func:`uniagent.resolver.resolve` checks every name and
every plugin's settings against what is installed, before any sandbox starts.
"""

from __future__ import annotations

import copy
import difflib
from collections.abc import ItemsView, KeysView, Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    StrictFloat,
    StrictInt,
    ValidationError,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from uniagent.env.config import RENAMED_KEYS, EnvConfig, section_renamed
from uniagent.errors import ConfigError
from uniagent.exit import DEFAULT_EXIT_POLICY, ExitReason, Treatment
from uniagent.mcp.config import McpServerConfig
from uniagent.protect.settings import GradeIn, IntegritySettings

#: Keys of the exit policy: every exit reason, and ``inexact_tokens`` (a trajectory whose
#: token ids are not what the model saw; masked by default).
PolicyKey = ExitReason | Literal["inexact_tokens"]

DEFAULT_SYSTEM_PROMPT = (
    "You are a careful software engineer working in a sandboxed shell. "
    "Use the tools to inspect and change files and to run commands. "
    "Call exactly one tool per turn."
)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BranchingConfig(_Strict):
    """Tree rollouts of the built-in loop: where an episode forks its sandbox and continues
    several ways (docs/training.md, "Tree rollouts")."""

    at_turns: list[StrictInt] = Field(
        default_factory=list,
        description="model turns (from 1) at which every branch reaching them splits into "
        "`width` continuations, each sampling that turn anew from the same state",
    )
    entropy_above: float | None = Field(
        None,
        gt=0,
        description="also split at a turn whose sampled tokens' mean surprisal (-log-prob, "
        "nats) is above this (the model was uncertain); null: only at_turns",
    )
    width: int = Field(2, ge=2, le=64, description="continuations at a branch point (k)")
    max_leaves: int = Field(
        8,
        ge=1,
        le=1024,
        description="at most this many leaves per task (a split that would "
        "pass it makes only the branches that fit, or none)",
    )

    @field_validator("at_turns")
    @classmethod
    def _turns(cls, value: list[int]) -> list[int]:
        if any(t < 1 for t in value):
            raise ValueError("turns count from 1")
        return sorted(set(value))

    @property
    def enabled(self) -> bool:
        """Whether any episode can branch."""
        return bool(self.at_turns) or self.entropy_above is not None


class InteractionConfig(_Strict):
    """Limits of the ReAct loop."""

    max_turns: int = Field(30, ge=1, description="model turns before max_step_limit")
    action_timeout: float = Field(120.0, gt=0, description="seconds one command may run")
    timeout_budget: float = Field(
        600.0, ge=0, description="seconds of timed-out commands allowed before timeout_error ends"
    )
    time_limit: float | None = Field(
        None,
        gt=0,
        description="seconds of the agent's own time before timeout_error ends the episode "
        "(a Harbor task's [agent] timeout_sec): the built-in loop's commands' time; a "
        "harness's run less its time waiting for the model. Time waiting for the model "
        "never counts (null: no limit)",
    )
    max_tool_calls_per_turn: int = Field(1, ge=1, description="calls allowed in one model turn")
    max_format_errors: int | None = Field(
        None,
        ge=1,
        description="consecutive unparsable turns before format_error ends (None: never)",
    )
    branching: BranchingConfig | None = Field(
        None,
        description="tree rollouts: fork the sandbox mid-episode and continue several ways "
        "(built-in loop only; a backend that can fork)",
    )


#: Deprecated name of :class:`~uniagent.env.config.EnvConfig` (until 0.4): the ``env``
#: section and the environment settings are one model now.
EnvSection = EnvConfig


class ToolRef(_Strict):
    """A tool by name, with its settings (validated by the tool's own model at resolve);
    or an MCP server whose tools the agent gets (``{mcp: {name, command | url, ...}}``)."""

    name: str = ""
    settings: dict[str, Any] | None = None
    mcp: McpServerConfig | None = None

    @model_validator(mode="after")
    def _name_or_mcp(self) -> ToolRef:
        if self.mcp is None and not self.name:
            raise ValueError("give a tool `name`, or an `mcp` server")
        if self.mcp is not None and (self.name or self.settings is not None):
            raise ValueError("an `mcp` entry takes no `name` or `settings` (they go inside mcp)")
        return self

    @property
    def label(self) -> str:
        """The tool's name, or ``mcp:SERVER`` for an MCP server's tools."""
        return f"mcp:{self.mcp.name}" if self.mcp is not None else self.name


class MetricConfig(_Strict):
    """A reward computed and logged with a rubric but never trained on (weight 0)."""

    name: str = Field(description="a registered reward")
    settings: dict[str, Any] = Field(
        default_factory=dict, description="the reward's own settings (checked by its model)"
    )
    label: str | None = Field(
        None, description="the key of its score in the result (default: the name)"
    )

    @property
    def key(self) -> str:
        """The key of its score in the result."""
        return self.label or self.name


class RubricComponentConfig(MetricConfig):
    """One reward of a rubric: a registered reward, its weight and its settings."""

    weight: float = Field(1.0, description="its weight in the aggregate (0: a logged metric)")


RubricAggregate = Literal["weighted-sum", "weighted-mean", "all-pass", "min"]


class RewardConfig(_Strict):
    """Which reward runs at the end of an episode, its settings, and how it is graded.

    Either one reward (``name``, ``settings``) or a rubric: several rewards run on the
    same grading sandbox (``rubric``, ``metrics``, ``aggregate``); see docs/rewards.md.
    """

    name: str = Field(
        "rubric", description="the reward (for a rubric: 'rubric', the default, or unset)"
    )
    settings: dict[str, Any] = Field(
        default_factory=dict, description="the reward's own settings (checked by its model)"
    )
    rubric: list[RubricComponentConfig] | None = Field(
        None, description="rewards whose scores are aggregated into the episode's reward"
    )
    metrics: list[MetricConfig] = Field(
        default_factory=list, description="rewards computed and logged, never trained on"
    )
    aggregate: RubricAggregate = Field(
        "weighted-sum",
        description="how a rubric's scores make the reward: 'weighted-sum', 'weighted-mean', "
        "'all-pass' (1.0 when every weighted component scores at least pass_score, else 0.0) "
        "or 'min' (the lowest score of the weighted components)",
    )
    pass_score: float = Field(1.0, description="the score a component needs for 'all-pass'")
    credit: Literal["outcome", "turn", "discounted"] = Field(
        "outcome",
        description="what verl's rm_scores hold: 'outcome', the episode's reward on the last "
        "token; 'turn', also each turn's score (RewardResult.turn_scores) on that turn's last "
        "generated token; 'discounted', there the discounted return of the turn scores",
    )
    gamma: float = Field(
        1.0, ge=0.0, le=1.0, description="the discount of credit: discounted (1.0: no discount)"
    )
    grade_in: GradeIn | None = Field(
        None,
        description="'episode': grade in the episode's sandbox after stopping the agent's "
        "processes, in a clean shell; 'fresh': apply the agent's patch to a new sandbox built "
        "from the task's deployment and set-up (started while the agent works), and grade "
        "there; null: the reward's default (the SWE rewards: fresh; others: episode)",
    )
    integrity: IntegritySettings = IntegritySettings()

    @model_validator(mode="before")
    @classmethod
    def _deprecated_config_key(cls, data: Any) -> Any:
        # ``reward.config`` was the settings' name until 0.2; taken, with a warning, until 0.4.
        return section_renamed(data, "reward")

    @model_validator(mode="after")
    def _one_reward_or_rubric(self) -> RewardConfig:
        if self.rubric is None:
            if "name" not in self.model_fields_set:
                raise ValueError("give a reward `name`, or a `rubric` of rewards")
            fields = type(self).model_fields
            given = [  # a dumped config holds the defaults: only other values are refused
                key
                for key in ("metrics", "aggregate", "pass_score")
                if getattr(self, key) != fields[key].get_default(call_default_factory=True)
            ]
            if given:
                raise ValueError(f"{', '.join(given)}: only with a `rubric`")
            return self
        if self.name != "rubric":
            raise ValueError("give a reward `name` or a `rubric`, not both")
        if self.settings:
            raise ValueError("a rubric's settings go on its components (rubric[i].settings)")
        if not self.rubric:
            raise ValueError("rubric: give at least one reward")
        keys = [c.key for c in self.rubric] + [m.key for m in self.metrics]
        twice = sorted({key for key in keys if keys.count(key) > 1})
        if twice:
            raise ValueError(
                f"rubric: {', '.join(twice)} named twice; give each a distinct `label`"
            )
        if not any(c.weight != 0 for c in self.rubric):
            raise ValueError("rubric: every weight is 0 (nothing to train on)")
        if self.aggregate == "weighted-mean" and sum(c.weight for c in self.rubric) == 0:
            raise ValueError("rubric: weighted-mean needs weights whose sum is not 0")
        return self


class AgentRef(_Strict):
    """Which agent runs the episode: ``react`` (the built-in loop) or an installed harness,
    with its settings (checked by the agent's own model at resolve time)."""

    name: str = "react"
    settings: dict[str, Any] = Field(
        default_factory=dict, description="the agent's own settings (checked by its model)"
    )


class SamplingConfig(_Strict):
    """Sampling parameters for the model backend; unset ones are the backend's defaults.

    The named keys mean what they mean in the OpenAI/vLLM API. ``extra_body`` holds
    backend-specific parameters, passed on as they are: into the request body
    (``openai:``), into verl's sampling params, or to ``generate()`` (``hf:``).
    Read as a mapping (``dict(config.sampling)``), it holds only the keys that are set.
    """

    temperature: StrictFloat | None = Field(None, ge=0, description="0: greedy")
    top_p: StrictFloat | None = Field(None, gt=0, le=1, description="nucleus sampling mass")
    top_k: StrictInt | None = Field(None, ge=-1, description="-1 or 0: off")
    min_p: StrictFloat | None = Field(None, ge=0, le=1, description="vLLM's min_p")
    max_tokens: StrictInt | None = Field(None, ge=1, description="tokens per model turn")
    seed: StrictInt | None = Field(None, description="makes sampling repeatable")
    presence_penalty: StrictFloat | None = Field(None, ge=-2, le=2)
    frequency_penalty: StrictFloat | None = Field(None, ge=-2, le=2)
    repetition_penalty: StrictFloat | None = Field(None, gt=0, description="vLLM's; 1: off")
    stop: str | list[str] | None = Field(None, description="stop strings")
    extra_body: dict[str, Any] = Field(
        default_factory=dict,
        description="backend-specific parameters, passed on as they are (not checked here)",
    )

    @model_validator(mode="wrap")
    @classmethod
    def _suggest_known_keys(cls, data: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        try:
            return handler(data)
        except ValidationError as exc:
            raise ValidationError.from_exception_data(
                exc.title, [_unknown_key_hint(err, cls.model_fields) for err in exc.errors()]
            ) from None

    @model_serializer(mode="wrap")
    def _set_only(self, handler: Any) -> dict[str, Any]:
        # Dumped as written (a run's manifest, task overrides): no unset keys.
        data: dict[str, Any] = handler(self)
        return {k: v for k, v in data.items() if v is not None and v != {}}

    def params(self) -> dict[str, Any]:
        """The parameters that are set, as the backend receives them (``extra_body`` nested)."""
        return self.model_dump()

    # A read-only mapping of params(), as ``sampling`` was a plain mapping before.
    def keys(self) -> KeysView[str]:
        """The keys that are set."""
        return self.params().keys()

    def items(self) -> ItemsView[str, Any]:
        """The (key, value) pairs that are set."""
        return self.params().items()

    def get(self, key: str, default: Any = None) -> Any:
        """A set parameter, else ``default``."""
        return self.params().get(key, default)

    def __getitem__(self, key: str) -> Any:
        return self.params()[key]

    def __contains__(self, key: object) -> bool:
        return key in self.params()

    def __len__(self) -> int:
        return len(self.params())


def _unknown_key_hint(err: Any, fields: Mapping[str, Any]) -> Any:
    """An unknown-key error with the close field name, if any (other errors as they are)."""
    if err["type"] != "extra_forbidden":
        return err
    close = difflib.get_close_matches(str(err["loc"][-1]), list(fields), n=1)
    hint = f"did you mean {close[0]}? " if close else ""
    message = f"unknown key ({hint}backend-specific parameters go under extra_body)"
    return InitErrorDetails(
        type=PydanticCustomError("unknown_key", message), loc=err["loc"], input=err["input"]
    )


class AgentConfig(_Strict):
    """Everything that defines an agent run; loaded from YAML."""

    agent: AgentRef = Field(
        default_factory=AgentRef,
        description="the agent: `{name: react}` (the built-in loop, default) or a harness "
        "plugin's name with its settings",
    )
    tool_parser: str = "hermes"
    tools: tuple[ToolRef, ...] = Field(
        (),
        description="the tools, by name (`execute_bash`), or with settings "
        "(`{name: execute_bash, settings: {...}}`), or an MCP server's tools "
        "(`{mcp: {name: fs, command: [...]}}`, listed at episode start)",
    )
    system_prompt: str | None = Field(
        None,
        description="the system message; default: a short instruction naming the finishing "
        "tools that are configured",
    )
    instance_template: str = Field(
        "{problem_statement}", description="the first user message; task fields in {braces}"
    )
    interaction: InteractionConfig = InteractionConfig()
    env: EnvConfig = EnvConfig()
    reward: RewardConfig | None = None
    exit_policy: dict[PolicyKey, Treatment] = Field(
        default_factory=dict,
        description="exit reason (or inexact_tokens) -> train | mask, over the defaults",
    )
    sampling: SamplingConfig = Field(
        default_factory=SamplingConfig, description="sampling parameters for the model backend"
    )
    concurrency: int = Field(8, ge=1, description="episodes at once")
    warm: int = Field(
        0,
        ge=0,
        description="sandboxes prepared ahead: up to this many more episodes set up and "
        "baseline their sandboxes (or are graded) while `concurrency` agents run; an episode "
        "holds an agent slot only while its agent runs (`uniagent run`, also on Ray; verl)",
    )
    services: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="process-wide services to start before the first episode, by name, with "
        "their settings (see uniagent.services)",
    )

    _source: str = PrivateAttr("config")

    @field_validator("tools", mode="before")
    @classmethod
    def _names_or_refs(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = [value]
        if isinstance(value, list | tuple):
            return [{"name": v} if isinstance(v, str) else v for v in value]
        return value

    @property
    def tool_names(self) -> tuple[str, ...]:
        """The configured tools' names, in order (``mcp:SERVER`` for an MCP server's)."""
        return tuple(t.label for t in self.tools)

    def treatment(self, reason: ExitReason) -> Treatment:
        """Whether an episode that ended this way is trained on or masked."""
        return self.exit_policy.get(reason, DEFAULT_EXIT_POLICY[reason])

    def inexact_treatment(self) -> Treatment:
        """Whether a trajectory that is not token-exact is trained on (default: masked)."""
        return self.exit_policy.get("inexact_tokens", "mask")

    # -- loading ---------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, source: str = "config") -> AgentConfig:
        """Validate a mapping; errors name the path of each bad key (and ``source``)."""
        try:
            config = cls.model_validate(dict(data))
        except ValidationError as exc:
            raise ConfigError(format_validation_error(exc, source)) from None
        config._source = source
        return config

    @property
    def source(self) -> str:
        """Where the config came from (its file, or the task that overrode it), for errors."""
        return self._source

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
        """A copy with ``overrides`` deep-merged in (e.g. a task's ``tools_kwargs``).

        A renamed key (``reward.config``, now ``settings``) is one key with its new name,
        whichever spelling the config and the override use: the override's is renamed
        before the merge (with the deprecation warning), as the config's was when it loaded.
        """
        if not overrides:
            return self
        renamed = dict(overrides)
        for section in RENAMED_KEYS.keys() & renamed.keys():
            try:
                renamed[section] = section_renamed(renamed[section], section)
            except ValueError as exc:
                raise ConfigError(f"invalid {source}:\n  {section}: {exc}") from None
        merged = deep_merge(self.model_dump(mode="python", exclude_unset=False), renamed)
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


def format_validation_error(exc: ValidationError, source: str, *, prefix: str = "") -> str:
    """One line per problem: the dotted key path (under ``prefix``), then what was wrong."""
    lines = [f"invalid {source}:"]
    for err in exc.errors():
        path = ".".join([prefix] * bool(prefix) + [str(p) for p in err["loc"]]) or "(top level)"
        message = str(err["msg"]).removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            message = "unknown key"
        lines.append(f"  {path}: {message}")
    return "\n".join(lines)
