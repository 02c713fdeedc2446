"""One episode as the viewer's table holds it: what :mod:`uniagent.view.rundir` reads a
run folder into and :mod:`uniagent.view.index` queries."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Literal

from uniagent.exit import DEFAULT_EXIT_POLICY
from uniagent.protect.report import integrity_flags
from uniagent.rubric import component_scores

Status = Literal["queued", "running", "finished", "failed", "interrupted"]
STATUSES: tuple[Status, ...] = ("queued", "running", "finished", "failed", "interrupted")
TIME_KEYS = ("setup_seconds", "model_seconds", "env_seconds", "reward_seconds")
ERROR_CHARS = 300  # how much of an error a row keeps
#: Exit reasons of infrastructure failures (masked by default): such an episode "failed";
#: any other exit reason is the policy's own outcome, so the episode "finished".
INFRA_EXITS = frozenset(r.value for r, t in DEFAULT_EXIT_POLICY.items() if t == "mask")


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
    #: The probing flags of its grading (:func:`uniagent.protect.report.integrity_flags`).
    integrity: dict[str, int] = field(default_factory=dict)
    offset: int | None = None  # where its line starts in results.jsonl
    attempt: int | None = None  # the attempt the result is of (a retry or resume: > 1)
    #: A rubric's scores: every component's and every metric's, by key ({} for one reward).
    reward_components: dict[str, float] = field(default_factory=dict)
    #: A run with several model servers: the one this episode ran on, its generated tokens,
    #: and the servers of its earlier attempts that were lost there (retried).
    model_server: str | None = None
    generated_tokens: int | None = None
    lost_on: tuple[str, ...] = ()
    #: A tree rollout's leaf: its name (``"0.1"``); its tree's row: every leaf's row, in
    #: the results file's order (the row itself is its first leaf's, see :func:`tree_row`).
    leaf: str | None = None
    leaves: tuple[Row, ...] = ()

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
            "reward_components": self.reward_components,
            "model_server": self.model_server,
            "leaves": [
                {"leaf": r.leaf, "reward": r.reward, "exit_reason": r.exit_reason}
                for r in self.leaves
            ],
        }

    def episodes(self) -> tuple[Row, ...]:
        """The episodes the run's summary counts in this row: a tree rollout's leaves, or
        the row itself."""
        if not self.leaves:
            return (self,)
        return tuple(dataclasses.replace(r, order=self.order) for r in self.leaves)

    def server_record(self) -> dict[str, Any]:
        """``model_server`` as the results record has it."""
        server = {"name": self.model_server, "generated_tokens": self.generated_tokens}
        return {"model_server": server}

    def as_record(self) -> dict[str, Any]:
        """The fields :func:`uniagent.run.summary.summarize` reads."""
        metrics = {k: getattr(self, k) or 0.0 for k in TIME_KEYS}
        return {
            "task_id": self.task_id,
            "exit_reason": self.exit_reason,
            "reward": self.reward,
            "traj_masked": self.masked,
            "metrics": {**metrics, "tool_calls": self.tool_calls},
            "reward_info": {"rubric": {k: {"score": v} for k, v in self.reward_components.items()}},
            "integrity_flags": self.integrity,
            **(self.server_record() if self.model_server else {}),
            "previous_attempts": [{"model_server": name} for name in self.lost_on],
            **({"leaf_rows": [r.as_record() for r in self.leaves]} if self.leaves else {}),
        }


def row_from_record(record: dict[str, Any], key: str, order: int, offset: int | None) -> Row:
    """A finished episode's row from its results record (unknown fields ignored)."""
    metrics = as_mapping(record.get("metrics"))
    exit_reason = as_str(record.get("exit_reason"))
    tool_calls = metrics.get("tool_calls")
    times: dict[str, Any] = {k: as_float(metrics.get(k)) for k in TIME_KEYS}
    error = as_str(record.get("error"))
    info = as_mapping(record.get("reward_info"))
    tampered = as_mapping(info.get("integrity")).get("tampered")
    server = as_mapping(record.get("model_server"))
    return Row(
        key=key,
        task_id=str(record.get("task_id", key)),
        sample=as_int(record.get("sample")),
        order=order,
        status="failed" if exit_reason in INFRA_EXITS else "finished",
        exit_reason=exit_reason,
        reward=as_float(record.get("reward")),
        masked=bool(record.get("traj_masked")),
        turns=as_int(metrics.get("turns")),
        tool_calls={str(k): int(v) for k, v in tool_calls.items() if as_int(v) is not None}
        if isinstance(tool_calls, dict)
        else {},
        format_errors=as_int(metrics.get("format_errors")) or 0,
        syntax_errors=as_int(metrics.get("syntax_errors")) or 0,
        timeouts=as_int(metrics.get("timeouts")) or 0,
        inexact_turns=as_int(metrics.get("inexact_turns")) or 0,
        **times,
        error=error[:ERROR_CHARS] if error else None,
        score_reason=as_str(info.get("score_reason")),
        tampered=len(tampered) if isinstance(tampered, list) else 0,
        integrity=integrity_flags(info),
        offset=offset,
        attempt=as_int(record.get("attempt")),
        reward_components=component_scores(info),
        model_server=as_str(server.get("name")),
        generated_tokens=as_int(server.get("generated_tokens")),
        lost_on=tuple(
            name
            for before in record.get("previous_attempts") or ()
            if isinstance(before, dict) and (name := as_str(before.get("model_server")))
        ),
        leaf=as_str(record.get("leaf")),
    )


def tree_row(leaves: tuple[Row, ...]) -> Row:
    """A tree rollout's row from its leaves' rows (``interaction.branching``: one results
    line per leaf): the first leaf's, with the leaves' mean reward (None if none has one),
    ``failed`` if any leaf failed (a retry runs the whole tree again), masked if every leaf
    is, and the leaves under ``leaves``."""
    first = leaves[0]
    rewards = [r.reward for r in leaves if r.reward is not None]
    return dataclasses.replace(
        first,
        status="failed" if any(r.status == "failed" for r in leaves) else first.status,
        reward=sum(rewards) / len(rewards) if rewards else None,
        masked=all(r.masked for r in leaves),
        leaves=leaves,
    )


def as_mapping(value: Any) -> dict[str, Any]:
    """``value`` if it is a JSON object, else an empty one."""
    return value if isinstance(value, dict) else {}


def as_str(value: Any) -> str | None:
    """``value`` as text; None stays None."""
    return None if value is None else str(value)


def as_int(value: Any) -> int | None:
    """``value`` as a whole number (a number or a string of ASCII digits), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.isascii() and value.isdigit():
        return int(value)  # not "²", which isdigit() admits and int() refuses
    return None


def as_float(value: Any) -> float | None:
    """``value`` as a finite float (booleans count as 0 and 1), else None."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int | float):
        try:
            number = float(value)
        except OverflowError:  # an integer of hundreds of digits
            return None
        return number if math.isfinite(number) else None  # NaN sorts nowhere
    return None
