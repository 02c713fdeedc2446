"""Per-episode counters and timings."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class EpisodeMetrics:
    """What an episode did and where its time went (seconds)."""

    turns: int = 0
    tool_calls: Counter[str] = field(default_factory=Counter)
    format_errors: int = 0
    syntax_errors: int = 0
    timeouts: int = 0
    #: Model turns whose prompt was not exactly the cache's context ids (not token-exact).
    inexact_turns: int = 0
    setup_seconds: float = 0.0
    model_seconds: float = 0.0
    env_seconds: float = 0.0
    reward_seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (the tool-call counter as a plain dict)."""
        data = asdict(self)
        data["tool_calls"] = dict(self.tool_calls)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EpisodeMetrics:
        """Inverse of :meth:`to_dict`."""
        return cls(**{**data, "tool_calls": Counter(data.get("tool_calls", {}))})
