"""What the verl agent loop reads from verl's config and from each dataset row (no verl import).

The agent configuration of an episode is merged in three layers, later ones winning:

1. defaults taken from verl's trainer config (``multi_turn.max_assistant_turns`` becomes
   ``interaction.max_turns``; ``multi_turn.format`` becomes ``tool_parser`` when a parser of
   that name is installed);
2. the agent-loop YAML entry: ``agent_config: path.yaml`` and/or inline ``AgentConfig`` keys;
3. the row's ``tools_kwargs`` (top level or in ``extra_info``), via ``AgentConfig.with_overrides``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from uniagent.config import deep_merge
from uniagent.errors import ConfigError
from uniagent.tasks import Task

#: Constructor kwargs verl itself passes to every agent loop (not agent settings).
VERL_KWARGS = frozenset({"name", "tools", "hf_model_type"})
#: The agent-loop YAML key naming an agent config file.
AGENT_CONFIG_KEY = "agent_config"
#: ``extra_info`` keys that verl or the data step use, not task fields.
_EXTRA_INFO_META = frozenset(
    {"tools_kwargs", "interaction_kwargs", "need_tools_kwargs", "index", "task", "task_id"}
)


def plain(value: Any) -> Any:
    """Deep-convert OmegaConf containers, numpy arrays and scalars to plain Python values."""
    if isinstance(value, str | bytes | bool | int | float) or value is None:
        return value
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if hasattr(value, "tolist"):  # numpy arrays and numpy scalars
        return plain(value.tolist())
    if isinstance(value, Sequence):
        return [plain(v) for v in value]
    return value


def _select(node: Any, dotted: str, default: Any = None) -> Any:
    for key in dotted.split("."):
        if node is None:
            return default
        try:
            node = node.get(key) if hasattr(node, "get") else getattr(node, key, None)
        except Exception:  # an unresolvable interpolation counts as missing
            return default
    return default if node is None else node


@dataclass(frozen=True)
class LoopSettings:
    """The parts of verl's trainer config the agent loop uses."""

    prompt_length: int
    response_length: int
    max_model_len: int | None = None
    num_workers: int = 1
    calculate_log_probs: bool = True
    max_assistant_turns: int | None = None
    tool_format: str | None = None
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    agent_loop_config_path: str | None = None

    @classmethod
    def from_trainer_config(cls, config: Any) -> LoopSettings:
        """Read ``actor_rollout_ref.rollout`` and ``data`` of a verl trainer config."""
        rollout = _select(config, "actor_rollout_ref.rollout")
        if rollout is None:
            raise ConfigError("the verl config has no actor_rollout_ref.rollout section")
        max_model_len = _select(rollout, "max_model_len")
        turns = _select(rollout, "multi_turn.max_assistant_turns")
        path = _select(rollout, "agent.agent_loop_config_path")
        return cls(
            prompt_length=int(_select(rollout, "prompt_length")),
            response_length=int(_select(rollout, "response_length")),
            max_model_len=None if max_model_len is None else int(max_model_len),
            num_workers=max(1, int(_select(rollout, "agent.num_workers", 1))),
            calculate_log_probs=bool(_select(rollout, "calculate_log_probs", True)),
            max_assistant_turns=None if turns is None else int(turns),
            tool_format=_select(rollout, "multi_turn.format"),
            chat_template_kwargs=plain(_select(config, "data.apply_chat_template_kwargs", {})),
            agent_loop_config_path=None if path is None else str(path),
        )

    @property
    def context_length(self) -> int:
        """The model's context window: ``max_model_len`` or prompt plus response length."""
        return self.max_model_len or self.prompt_length + self.response_length

    def config_defaults(self) -> dict[str, Any]:
        """The agent-config keys that verl's trainer config supplies (the lowest layer)."""
        from uniagent.registry import get_registry

        data: dict[str, Any] = {}
        if self.max_assistant_turns is not None:
            data["interaction"] = {"max_turns": self.max_assistant_turns}
        if self.tool_format and self.tool_format in get_registry().tool_parsers():
            data["tool_parser"] = self.tool_format
        return data

    def resolve(self, path: str | Path) -> Path:
        """An agent-config path: absolute, else relative to the working directory, else
        relative to the agent-loop YAML's folder."""
        candidate = Path(path).expanduser()
        if candidate.is_absolute() or candidate.exists() or not self.agent_loop_config_path:
            return candidate
        beside = Path(self.agent_loop_config_path).expanduser().parent / candidate
        return beside if beside.exists() else candidate


def base_config_dict(settings: LoopSettings, loop_kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """Layers 1 and 2 merged into one mapping (not validated yet)."""
    data = settings.config_defaults()
    kwargs = plain(dict(loop_kwargs))
    path = kwargs.get(AGENT_CONFIG_KEY)
    if path:
        resolved = settings.resolve(path)
        try:
            loaded = yaml.safe_load(resolved.read_text()) or {}
        except FileNotFoundError:
            raise ConfigError(
                f"agent_config {path!r} of the agent-loop YAML does not exist (looked at "
                f"{resolved})"
            ) from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"agent_config {resolved} is not valid YAML: {exc}") from None
        if not isinstance(loaded, Mapping):
            raise ConfigError(f"agent_config {resolved} must hold a mapping")
        data = deep_merge(data, loaded)
    inline = {k: v for k, v in kwargs.items() if k not in VERL_KWARGS and k != AGENT_CONFIG_KEY}
    return deep_merge(data, inline)


def _extra_info(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    extra = plain(kwargs.get("extra_info")) or {}
    if isinstance(extra, str):
        extra = json.loads(extra) if extra.strip() else {}
    if not isinstance(extra, Mapping):
        raise ConfigError(f"extra_info must be a mapping, got {type(extra).__name__}")
    return dict(extra)


def row_task_id(kwargs: Mapping[str, Any]) -> str:
    """The row's task id: ``extra_info.task_id`` (what the data step writes), else its index."""
    extra = _extra_info(kwargs)
    return str(plain(extra.get("task_id", kwargs.get("index", "?"))))


def row_overrides(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The row's agent-config overrides: ``tools_kwargs`` (top level or in ``extra_info``)."""
    extra = _extra_info(kwargs)
    row: dict[str, Any] = {"extra_info": extra}
    tools_kwargs = plain(kwargs.get("tools_kwargs"))
    if tools_kwargs not in (None, {}, ""):
        row["tools_kwargs"] = tools_kwargs
    return Task(row_task_id(kwargs), row).overrides()


def row_task(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The task row: ``extra_info.task`` (JSON text or a mapping), else the other
    ``extra_info`` fields."""
    extra = _extra_info(kwargs)
    task = extra.get("task")
    if isinstance(task, str):
        task = json.loads(task) if task.strip() else None
    if task is None:
        return {k: v for k, v in extra.items() if k not in _EXTRA_INFO_META}
    if not isinstance(task, Mapping):
        raise ConfigError(f"extra_info.task must be a mapping, got {type(task).__name__}")
    return dict(task)


def row_messages(kwargs: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """The row's chat prompt (``raw_prompt``), keys with null values dropped; None if absent."""
    raw = plain(kwargs.get("raw_prompt"))
    if not raw:
        return None
    if not isinstance(raw, list) or not all(isinstance(m, Mapping) for m in raw):
        raise ConfigError("raw_prompt must be a list of chat messages")
    return [{k: v for k, v in m.items() if v is not None} for m in raw]
