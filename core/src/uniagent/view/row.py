"""One episode as the viewer's table holds it: what :mod:`uniagent.view.rundir` reads a
run folder into and :mod:`uniagent.view.index` queries."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Status = Literal["queued", "running", "finished", "failed", "interrupted"]
STATUSES: tuple[Status, ...] = ("queued", "running", "finished", "failed", "interrupted")
TIME_KEYS = ("setup_seconds", "model_seconds", "env_seconds", "reward_seconds")


@dataclass(slots=True)
class Row:
    """One episode as the runs table shows it: small, so 10,000 of them cost little."""

    key: str  # the episode folder relative to the run folder, POSIX style
    task_id: str
    sample: int | None
    order: int  # position in the plan (manifest), then in the results file
    status: Status = "queued"
    exit_reason: str | None = None
    reward: float | None = None
    masked: bool = False
    turns: int | None = None
    tool_calls: dict[str, int] = field(default_factory=dict)
    format_errors: int = 0
    syntax_errors: int = 0
    timeouts: int = 0
    inexact_turns: int = 0  # model calls whose server-side prompt was not the cache's ids
    setup_seconds: float | None = None
    model_seconds: float | None = None
    env_seconds: float | None = None
    reward_seconds: float | None = None
    error: str | None = None
    score_reason: str | None = None  # why the grader forced the score (e.g. "tampered")
    tampered: int = 0  # changes to protected files, code or tools the grader found
    offset: int | None = None  # where its line starts in results.jsonl
    attempt: int | None = None  # the attempt the result is of (a retry or resume: > 1)

    @property
    def total_seconds(self) -> float | None:
        """Setup + model + environment + reward time, when the episode has timings."""
        parts = [getattr(self, k) for k in TIME_KEYS]
        return sum(p for p in parts if p is not None) if any(p is not None for p in parts) else None

    def to_json(self) -> dict[str, Any]:
        """The row as the API sends it."""
        return {
            "key": self.key,
            "task_id": self.task_id,
            "sample": self.sample,
            "status": self.status,
            "exit_reason": self.exit_reason,
            "reward": self.reward,
            "masked": self.masked,
            "turns": self.turns,
            "tool_calls": self.tool_calls,
            "format_errors": self.format_errors,
            "syntax_errors": self.syntax_errors,
            "timeouts": self.timeouts,
            "inexact_turns": self.inexact_turns,
            **{k: getattr(self, k) for k in TIME_KEYS},
            "total_seconds": self.total_seconds,
            "error": self.error,
            "score_reason": self.score_reason,
            "tampered": self.tampered,
            "attempt": self.attempt,
        }

    def as_record(self) -> dict[str, Any]:
        """The fields :func:`uniagent.run.summary.summarize` reads."""
        metrics = {k: getattr(self, k) or 0.0 for k in TIME_KEYS}
        return {
            "task_id": self.task_id,
            "exit_reason": self.exit_reason,
            "reward": self.reward,
            "traj_masked": self.masked,
            "metrics": {**metrics, "tool_calls": self.tool_calls},
        }
