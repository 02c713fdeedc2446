"""Queries over a run's rows: filter, sort and page the runs table; summary figures; A/B.

Pure functions of :class:`~uniagent.view.rundir.Row` lists: they never touch the disk,
so a page of a 10,000-episode run costs one pass over small objects.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from uniagent.errors import ConfigError
from uniagent.protect.report import CLASSES
from uniagent.run.summary import summarize
from uniagent.view.row import STATUSES, Row

SORT_KEYS = (
    "order",
    "task_id",
    "sample",
    "status",
    "exit_reason",
    "reward",
    "turns",
    "setup_seconds",
    "model_seconds",
    "env_seconds",
    "reward_seconds",
    "total_seconds",
)
REWARD_CLASSES = ("solved", "partial", "zero", "none")
MAX_PAGE = 500


@dataclass(frozen=True)
class Filters:
    """What the runs table is narrowed to; empty means everything."""

    q: str = ""
    statuses: frozenset[str] = frozenset()
    exit_reasons: frozenset[str] = frozenset()
    rewards: frozenset[str] = frozenset()

    @classmethod
    def from_params(cls, params: Mapping[str, str]) -> Filters:
        """From query parameters ``q``, ``status``, ``exit``, ``reward`` (comma lists)."""
        statuses = _split(params.get("status"))
        rewards = _split(params.get("reward"))
        _check("status", statuses, STATUSES)
        _check("reward", rewards, REWARD_CLASSES)
        return cls(
            q=(params.get("q") or "").strip().lower(),
            statuses=statuses,
            exit_reasons=_split(params.get("exit")),
            rewards=rewards,
        )

    def match(self, row: Row) -> bool:
        """True when ``row`` passes every filter."""
        if self.q and self.q not in row.task_id.lower():
            return False
        if self.statuses and row.status not in self.statuses:
            return False
        if self.exit_reasons and (row.exit_reason or "") not in self.exit_reasons:
            return False
        return not self.rewards or reward_class(row.reward) in self.rewards


def reward_class(reward: float | None) -> str:
    """``solved`` (>= 1), ``partial`` (between 0 and 1), ``zero`` (<= 0) or ``none``."""
    if reward is None or (isinstance(reward, float) and math.isnan(reward)):
        return "none"
    if reward >= 1.0:
        return "solved"
    return "partial" if reward > 0.0 else "zero"


def _split(value: str | None) -> frozenset[str]:
    return frozenset(v.strip() for v in (value or "").split(",") if v.strip())


def _check(name: str, given: Iterable[str], allowed: Sequence[str]) -> None:
    unknown = sorted(set(given) - set(allowed))
    if unknown:
        raise ConfigError(f"{name}: unknown value {unknown[0]!r}; use one of {', '.join(allowed)}")


def _sort_key(field: str) -> Any:
    # None sorts last in both directions: the key puts "missing" in its own rank.
    def key(row: Row) -> tuple[int, Any]:
        value = getattr(row, field)
        return (1, 0) if value is None else (0, value)

    return key


def page(
    rows: Iterable[Row],
    filters: Filters,
    *,
    sort: str = "order",
    descending: bool = False,
    offset: int = 0,
    limit: int = 50,
) -> dict[str, Any]:
    """One page of the runs table, with the counts the filter menus show."""
    if sort not in SORT_KEYS:
        raise ConfigError(f"sort: unknown column {sort!r}; use one of {', '.join(SORT_KEYS)}")
    limit = max(1, min(limit, MAX_PAGE))
    offset = max(0, offset)
    rows = list(rows)
    matched = [r for r in rows if filters.match(r)]
    key = _sort_key(sort)
    if descending:
        present = [r for r in matched if getattr(r, sort) is not None]
        missing = [r for r in matched if getattr(r, sort) is None]
        present.sort(key=key, reverse=True)
        matched = present + missing
    elif sort != "order":
        matched.sort(key=key)
    # A tree rollout's leaves count one each, as in the run's summary.
    rewards = [e.reward for r in matched for e in r.episodes() if e.reward is not None]
    return {
        "total": len(matched),
        "offset": offset,
        "limit": limit,
        "rows": [r.to_json() for r in matched[offset : offset + limit]],
        "mean_reward": sum(rewards) / len(rewards) if rewards else None,
        "rewarded": len(rewards),
        "counts": {
            "status": dict(Counter(r.status for r in rows)),
            "exit_reason": dict(
                Counter(r.exit_reason for r in rows if r.exit_reason).most_common()
            ),
            "reward": dict(Counter(reward_class(r.reward) for r in rows if r.exit_reason)),
        },
    }


def histogram(values: Sequence[float], *, max_bins: int = 20) -> list[dict[str, Any]]:
    """Counts over integer values (one bar each) or equal-width bins when there are many."""
    if not values:
        return []
    lo, hi = min(values), max(values)
    if all(float(v).is_integer() for v in values) and hi - lo < max_bins:
        counts = Counter(int(v) for v in values)
        return [
            {"label": str(v), "lo": v, "hi": v, "count": counts.get(v, 0)}
            for v in range(int(lo), int(hi) + 1)
        ]
    if hi == lo:
        return [{"label": f"{lo:g}", "lo": lo, "hi": hi, "count": len(values)}]
    width = (hi - lo) / max_bins
    bins = [0] * max_bins
    for v in values:
        bins[min(int((v - lo) / width), max_bins - 1)] += 1
    return [
        {
            "label": f"{lo + i * width:.3g}–{lo + (i + 1) * width:.3g}",
            "lo": lo + i * width,
            "hi": lo + (i + 1) * width,
            "count": c,
        }
        for i, c in enumerate(bins)
    ]


def stats(rows: Iterable[Row], *, n: int) -> dict[str, Any]:
    """The summary page: ``summarize``'s figures over finished episodes, plus distributions
    (a tree rollout's leaves count one episode each, as in the run's own summary)."""
    rows = [e for r in rows for e in r.episodes()]
    finished = [r for r in rows if r.exit_reason is not None]
    summary = summarize((r.as_record() for r in finished), n=n, wall_seconds=0.0)
    summary.pop("wall_seconds", None)
    summary["status"] = {s: sum(1 for r in rows if r.status == s) for s in STATUSES}
    summary["masked_share"] = summary["masked_episodes"] / len(finished) if finished else None
    summary["turns_histogram"] = histogram([r.turns for r in finished if r.turns is not None])
    summary["reward_histogram"] = histogram([r.reward for r in finished if r.reward is not None])
    summary["duration_histogram"] = histogram(
        [t for r in finished if (t := r.total_seconds) is not None]
    )
    summary["reward_classes"] = dict(Counter(reward_class(r.reward) for r in finished))
    summary["mean_seconds"] = {
        key: (summary["time_seconds"][key] / len(finished) if finished else None)
        for key in summary["time_seconds"]
    }
    summary["errors"] = {
        "format_errors": sum(r.format_errors for r in finished),
        "syntax_errors": sum(r.syntax_errors for r in finished),
        "timeouts": sum(r.timeouts for r in finished),
    }
    summary["tampered_episodes"] = sum(1 for r in finished if r.tampered)
    summary["integrity_timeline"] = integrity_timeline(finished)
    summary["score_reasons"] = dict(Counter(r.score_reason for r in finished if r.score_reason))
    return summary


def integrity_timeline(finished: Sequence[Row], *, max_bins: int = 20) -> list[dict[str, Any]]:
    """Graded episodes in the order they finished, in up to ``max_bins`` equal groups: how
    many of each group report tampering, and how many show each attack class
    (:data:`uniagent.protect.report.CLASSES`; a run shows when its policy starts probing)."""
    graded = sorted((r for r in finished if r.reward is not None), key=lambda r: r.order)
    if not graded:
        return []
    size = math.ceil(len(graded) / max_bins)
    out = []
    for start in range(0, len(graded), size):
        group = graded[start : start + size]
        out.append(
            {
                "label": f"{start + 1}–{start + len(group)}",
                "episodes": len(group),
                "tampered": sum(1 for r in group if r.integrity.get("tampered")),
                "classes": {
                    cls: sum(1 for r in group if r.integrity.get(f"tampered/{cls}"))
                    for cls in CLASSES
                },
            }
        )
    return out


def _per_task(rows: Iterable[Row]) -> dict[str, dict[str, Any]]:
    grouped: dict[str, list[Row]] = defaultdict(list)
    for row in rows:
        grouped[row.task_id].extend(row.episodes())  # a tree rollout: each leaf
    out = {}
    for task, episodes in grouped.items():
        episodes.sort(key=lambda r: (r.sample is None, r.sample))
        rewards = [r.reward for r in episodes if r.reward is not None]
        out[task] = {
            "episodes": [
                {
                    "key": r.key,
                    "sample": r.sample,
                    "status": r.status,
                    "exit_reason": r.exit_reason,
                    "reward": r.reward,
                    "leaf": r.leaf,
                }
                for r in episodes
            ],
            "mean_reward": sum(rewards) / len(rewards) if rewards else None,
            "solved": sum(1 for r in rewards if r >= 1.0),
            "exit_reasons": dict(Counter(r.exit_reason for r in episodes if r.exit_reason)),
        }
    return out


CHANGES = ("improved", "regressed", "exit_changed", "same", "only_a", "only_b")


def compare(
    rows_a: Iterable[Row],
    rows_b: Iterable[Row],
    *,
    q: str = "",
    change: str = "",
    offset: int = 0,
    limit: int = 50,
) -> dict[str, Any]:
    """Two runs side by side per task: reward and exit-reason changes from A to B."""
    wanted = _split(change)
    _check("change", wanted, CHANGES)
    a, b = _per_task(rows_a), _per_task(rows_b)
    tasks = list(a) + [t for t in b if t not in a]
    table: list[dict[str, Any]] = []
    for task in tasks:
        left, right = a.get(task), b.get(task)
        kind = _change(left, right)
        delta = (
            right["mean_reward"] - left["mean_reward"]
            if left
            and right
            and left["mean_reward"] is not None
            and right["mean_reward"] is not None
            else None
        )
        table.append({"task_id": task, "a": left, "b": right, "change": kind, "delta": delta})
    counts = dict(Counter(t["change"] for t in table))
    needle = q.strip().lower()
    matched = [
        t
        for t in table
        if (not needle or needle in t["task_id"].lower()) and (not wanted or t["change"] in wanted)
    ]
    # Biggest changes first: what an A/B reader looks for.
    matched.sort(key=lambda t: (-(abs(t["delta"]) if t["delta"] is not None else -1), t["task_id"]))
    limit = max(1, min(limit, MAX_PAGE))
    both = [t for t in table if t["a"] and t["b"]]
    exit_a: Counter[str] = Counter()
    exit_b: Counter[str] = Counter()
    for t in table:
        exit_a.update((t["a"] or {}).get("exit_reasons", {}))
        exit_b.update((t["b"] or {}).get("exit_reasons", {}))
    return {
        "total": len(matched),
        "offset": offset,
        "limit": limit,
        "rows": matched[offset : offset + limit],
        "counts": counts,
        "mean_reward": {
            "a": _mean(t["a"]["mean_reward"] for t in both),
            "b": _mean(t["b"]["mean_reward"] for t in both),
            "tasks": len(both),
        },
        "exit_reasons": {
            reason: {"a": exit_a.get(reason, 0), "b": exit_b.get(reason, 0)}
            for reason in sorted(set(exit_a) | set(exit_b), key=lambda r: -(exit_a[r] + exit_b[r]))
        },
    }


def _change(left: dict[str, Any] | None, right: dict[str, Any] | None) -> str:
    if left is None:
        return "only_b"
    if right is None:
        return "only_a"
    ra, rb = left["mean_reward"], right["mean_reward"]
    if ra is not None and rb is not None and rb > ra:
        return "improved"
    if ra is not None and rb is not None and rb < ra:
        return "regressed"
    # Shares, not counts: the two runs may have drawn a different number of samples.
    if _shares(left["exit_reasons"]) != _shares(right["exit_reasons"]):
        return "exit_changed"
    return "same"


def _shares(counts: Mapping[str, int]) -> dict[str, float]:
    total = sum(counts.values())
    return {k: round(v / total, 6) for k, v in counts.items()} if total else {}


def _mean(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None
