"""Retries of infrastructure failures, and the circuit breaker that stops a hopeless run.

An attempt that ends with an infrastructure exit reason (see
:data:`uniagent.run.results.INFRA_REASONS`) is tried again, up to ``retries``
times, after ``delay * 2**k`` seconds (capped). The breaker watches the first
attempts of a run: when the first ``window`` of them all end with the same
infrastructure exit reason (the endpoint is down, the credentials are refused,
the image is missing), nothing more is started and the run stops with that
cause. Once one of them ends otherwise, the breaker stays open for the rest of
the run (later failures are retried and recorded, never fatal).

With a :class:`TamperAlarm` (``reward.integrity.alert``), the breaker also trips
when the share of graded episodes that report tampering reaches the alert's
share, once enough of them finished: a policy that starts probing its grader
stops the run instead of training on.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from uniagent.protect.report import is_tampered
from uniagent.run.results import is_infra_failure

MAX_DELAY = 300.0


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how soon an infrastructure failure is tried again."""

    retries: int = 2
    delay: float = 10.0

    def backoff(self, retry: int) -> float:
        """Seconds before retry number ``retry`` (1, 2, ...)."""
        return min(self.delay * 2 ** (retry - 1), MAX_DELAY)


def default_window(concurrency: int) -> int:
    """How many first attempts the breaker watches: the concurrency, within 3..10."""
    return max(3, min(10, concurrency))


def cause_of(record: Mapping[str, Any]) -> str:
    """A one-line cause of a failed attempt: its exit reason and its error's last line."""
    lines = [line.strip() for line in str(record.get("error") or "").splitlines()]
    lines = [line for line in lines if line]
    # A traceback ends with "Type: message"; a plain message is one line.
    detail = lines[-1] if lines else ""
    for line in lines:
        if "Error" in line.split(":", 1)[0] and ":" in line:
            detail = line  # the first exception line names the root cause
            break
    detail = detail if len(detail) <= 300 else detail[:297] + "..."
    return f"{record.get('exit_reason')}: {detail}" if detail else str(record.get("exit_reason"))


@dataclass
class TamperAlarm:
    """Trips when ``share`` of the graded episodes report tampering, after ``min_episodes``."""

    share: float
    min_episodes: int = 20
    graded: int = 0
    tampered: int = 0
    tripped: bool = False

    @classmethod
    def of(cls, alert: Any) -> TamperAlarm | None:
        """The alarm of a ``reward.integrity.alert`` setting (``None``: none)."""
        return None if alert is None else cls(alert.share, alert.min_episodes)

    def observe(self, record: Mapping[str, Any]) -> bool:
        """Count one finished episode; True when the alarm trips."""
        if self.tripped or record.get("reward") is None:
            return False
        self.graded += 1
        self.tampered += is_tampered(record)
        if self.graded >= self.min_episodes and self.tampered >= self.share * self.graded:
            self.tripped = True
        return self.tripped

    def message(self) -> str:
        """Why the run stopped."""
        return (
            f"stopped: {self.tampered} of {self.graded} graded episodes report tampering with "
            f"the grader (reward.integrity.alert: share {self.share:g} after "
            f"{self.min_episodes}); see integrity.tampered in results.jsonl and summary.json"
        )


@dataclass
class CircuitBreaker:
    """Trips when the first attempts of the first ``window`` episodes all fail the same
    infrastructure way (one bad task retried is not a broken endpoint), or when its
    ``alarm`` does."""

    window: int
    seen: list[str] = field(default_factory=list)
    causes: list[str] = field(default_factory=list)
    armed: bool = True
    tripped: bool = False
    alarm: TamperAlarm | None = None

    def observe(self, record: Mapping[str, Any], *, first: bool = True) -> bool:
        """Count one finished attempt (``first``: an episode's first); True when it trips.

        Any policy outcome disarms the breaker; a retry's failure is not counted.
        """
        if self.alarm is not None and not self.tripped and self.alarm.observe(record):
            self.armed, self.tripped = False, True
            return True
        if not self.armed or self.window <= 0:
            return False
        if not is_infra_failure(record):
            self.armed = False
            return False
        if not first:
            return False
        self.seen.append(str(record["exit_reason"]))
        self.causes.append(cause_of(record))
        if len(set(self.seen)) > 1:
            self.armed = False
            return False
        if len(self.seen) >= self.window:
            self.armed, self.tripped = False, True
            return True
        return False

    def message(self) -> str:
        """Why the run stopped, for the terminal and the summary."""
        if self.alarm is not None and self.alarm.tripped:
            return self.alarm.message()
        return (
            f"stopped: the first {len(self.seen)} episodes all failed with {self.seen[0]} "
            f"({self.causes[0]}); fix the cause and run the same command again to resume"
        )
