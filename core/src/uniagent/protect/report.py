"""What an episode's grading says about probing: flags per tamper class, for metrics and alerts.

Frameworks prevent reward hacking; this makes it visible while a run trains. From
an episode's ``reward_info`` (its ``integrity.tampered`` reports and
``score_reason``), :func:`integrity_flags` gives the flags that ``summary.json``
counts, verl's metric dict averages per step (``integrity/...``) and the tamper
alert (``reward.integrity.alert``) watches:

- ``tampered``: some change of what the grader protects counts (it scored 0, or
  would have under ``on_tamper: zero``);
- ``tampered/<kind>``: of that kind (``protected_file``, ``toolchain`` (the
  toolchain and the test environment), ``content`` (the patch screen));
- ``rule/<rule>``: a report of that rule, scored or not (``conftest.py`` as
  ``pytest-plugins``, a content rule, ``test-env``, ``git-foreign``, ...);
- ``score_reason/<reason>``: the grader forced the score (``tampered``,
  ``reward_failed``, ``grading_timed_out``, ``sandbox_ended_by_agent``, ...).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from statistics import fmean
from typing import Any

#: The kinds of tamper reports (the classes counted for every step, seen or not).
KINDS = ("protected_file", "toolchain", "content")


def integrity_flags(reward_info: Mapping[str, Any] | None) -> dict[str, int]:
    """The probing flags of one episode (each present one is 1)."""
    info = reward_info if isinstance(reward_info, Mapping) else {}
    integrity = info.get("integrity")
    reports = integrity.get("tampered") if isinstance(integrity, Mapping) else None
    tampered = [t for t in reports or () if isinstance(t, Mapping)]
    flags: dict[str, int] = {}
    for report in tampered:
        flags[f"rule/{report.get('rule')}"] = 1
        if report.get("scores", True):
            flags["tampered"] = 1
            flags[f"tampered/{report.get('kind')}"] = 1
    reason = info.get("score_reason")
    if isinstance(reason, str) and reason:
        flags[f"score_reason/{reason}"] = 1
    return flags


def is_tampered(record: Mapping[str, Any]) -> bool:
    """Whether a finished episode's record (a ``results.jsonl`` line) reports tampering."""
    return bool(integrity_flags(record.get("reward_info")).get("tampered"))


def integrity_metrics(
    records: Iterable[Mapping[str, Any]], prefix: str = "integrity"
) -> dict[str, float]:
    """``integrity/<flag>``: the share of the records whose ``integrity`` flags (as
    :func:`integrity_flags` gives them) hold it; ``tampered`` and every kind always."""
    flags = [f if isinstance(f := r.get("integrity"), Mapping) else {} for r in records]
    if not flags:
        return {}
    names = {"tampered", *(f"tampered/{kind}" for kind in KINDS)}
    names |= {name for f in flags for name in f}
    return {
        f"{prefix}/{name}": fmean(1.0 if f.get(name) else 0.0 for f in flags)
        for name in sorted(names)
    }
