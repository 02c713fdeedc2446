"""What a reward function receives and returns (see ``uniagent_rewards``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

if TYPE_CHECKING:  # pragma: no cover
    from uniagent.env import AgentEnv


@dataclass(frozen=True)
class RewardContext:
    """Everything a reward needs, handed over while the sandbox is still open.

    ``task`` is the task row (e.g. a SWE-bench instance); ``submission`` is the
    output of the finishing tool (``submit``'s diff, ``finish``'s answer) or
    ``None`` when the episode ended otherwise.
    """

    env: AgentEnv
    task: Mapping[str, Any]
    config: BaseModel | None = None
    messages: Sequence[Mapping[str, Any]] = ()
    exit_reason: str | None = None
    submission: str | None = None


@dataclass(frozen=True)
class RewardResult:
    """A reward score plus details worth saving with the episode."""

    score: float
    info: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def coerce(cls, value: RewardResult | float | int | bool) -> RewardResult:
        """Accept a plain number from simple reward functions."""
        if isinstance(value, RewardResult):
            return value
        if isinstance(value, bool | int | float):
            return cls(score=float(value))
        raise TypeError(f"a reward must return a float or RewardResult, got {type(value).__name__}")
