"""Figures over finished episodes: rewards, pass@k, exit reasons, tool calls, time."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from math import comb
from pathlib import Path
from typing import Any

from uniagent.protect.report import CLASSES, KINDS, integrity_flags
from uniagent.rubric import component_scores
from uniagent.run.results import episodes_of, is_infra_failure

TIME_KEYS = ("setup_seconds", "model_seconds", "env_seconds", "reward_seconds")


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k estimator (Chen et al., 2021) for ``c`` successes of ``n``."""
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def summarize(
    records: Iterable[Mapping[str, Any]], *, n: int, wall_seconds: float
) -> dict[str, Any]:
    """The run summary written to ``summary.json`` and printed at the end (a tree
    rollout's leaves each count as an episode, and as a try in pass@k)."""
    records = episodes_of(records)
    rewards = [r["reward"] for r in records if r.get("reward") is not None]
    by_task: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for r in records:
        by_task[r["task_id"]].append(r)
    tool_calls: Counter[str] = Counter()
    times: dict[str, float] = {}
    for r in records:
        metrics = r.get("metrics") or {}
        tool_calls.update(metrics.get("tool_calls") or {})
        for key in TIME_KEYS:
            times[key] = times.get(key, 0.0) + float(metrics.get(key) or 0.0)
    summary: dict[str, Any] = {
        "episodes": len(records),
        "tasks": len(by_task),
        "samples_per_task": n,
        "mean_reward": sum(rewards) / len(rewards) if rewards else None,
        "rewarded_episodes": len(rewards),
        "masked_episodes": sum(1 for r in records if r.get("traj_masked")),
        "infrastructure_failures": sum(1 for r in records if is_infra_failure(r)),
        "exit_reasons": dict(Counter(r["exit_reason"] for r in records).most_common()),
        "tool_calls": dict(tool_calls.most_common()),
        "time_seconds": {k: round(times.get(k, 0.0), 3) for k in TIME_KEYS},
        "wall_seconds": round(wall_seconds, 3),
    }
    components = reward_components(records)
    if components:
        summary["reward_components"] = components
    summary["integrity"] = integrity_summary(records)
    servers = server_shares(records)
    if servers:
        summary["servers"] = servers
    tries = max((len(eps) for eps in by_task.values()), default=0)
    if max(n, tries) > 1:
        n = max(n, tries)
        summary["pass_at_k"] = {
            f"pass@{k}": _mean(
                pass_at_k(len(eps), sum(1 for e in eps if (e.get("reward") or 0) >= 1.0), k)
                for eps in by_task.values()
                if len(eps) >= k
            )
            for k in sorted({1, n} | ({5} if n >= 5 else set()))
        }
    return summary


def server_shares(records: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, int]]:
    """Per model server of a run with several (``model_server`` in the records): the
    episodes that ended there, their generated tokens, and the earlier attempts that failed
    there (a server taken out shows its lost attempts even when all were retried elsewhere)."""
    shares: dict[str, dict[str, int]] = {}

    def share(name: str) -> dict[str, int]:
        return shares.setdefault(name, {"episodes": 0, "generated_tokens": 0, "failed_attempts": 0})

    for r in records:
        server = r.get("model_server")
        if server:
            mine = share(server["name"])
            mine["episodes"] += 1
            mine["generated_tokens"] += int(server.get("generated_tokens") or 0)
        for before in r.get("previous_attempts") or ():
            if before.get("model_server"):
                share(before["model_server"])["failed_attempts"] += 1
    return dict(sorted(shares.items()))


def reward_components(records: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """The mean score of each rubric component and metric over the rewarded episodes that
    have it (masked episodes left out); {} without a rubric."""
    scores: dict[str, list[float]] = defaultdict(list)
    for r in records:
        if r.get("reward") is None or r.get("traj_masked"):
            continue
        info = r.get("reward_info")
        for key, score in component_scores(info if isinstance(info, Mapping) else {}).items():
            scores[key].append(score)
    return {key: sum(values) / len(values) for key, values in sorted(scores.items())}


def resumed_wall_seconds(previous: Path, this_run: float) -> float:
    """``this_run`` plus the ``wall_seconds`` of the summary at ``previous`` (the runs before a
    resume in the same folder; 0 when there is none or it cannot be read)."""
    try:
        earlier = json.loads(previous.read_text()).get("wall_seconds")
    except (OSError, ValueError, AttributeError):
        earlier = None
    if isinstance(earlier, bool) or not isinstance(earlier, int | float) or earlier < 0:
        earlier = 0.0
    return round(float(earlier) + this_run, 3)


def integrity_summary(records: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """How many graded episodes report tampering, by kind, attack class (tamper reports and
    forced scores, :mod:`uniagent.protect.report`), rule and forced score reason."""
    graded = [r for r in records if r.get("reward") is not None]
    counts: Counter[str] = Counter()
    for record in graded:
        flags = record.get("integrity_flags")  # a viewer row's, already worked out
        if not isinstance(flags, Mapping):
            flags = integrity_flags(record.get("reward_info"))
        counts.update(flags)

    def group(prefix: str) -> dict[str, int]:
        return {
            k.removeprefix(prefix): v for k, v in sorted(counts.items()) if k.startswith(prefix)
        }

    tampered = group("tampered/")
    return {
        "graded_episodes": len(graded),
        "tampered_episodes": counts.get("tampered", 0),
        "tampered": {kind: tampered.get(kind, 0) for kind in KINDS}
        | {k: v for k, v in tampered.items() if k not in KINDS and k not in CLASSES},
        "classes": {cls: tampered.get(cls, 0) for cls in CLASSES},
        "rules": group("rule/"),
        "score_reasons": group("score_reason/"),
    }


def _mean(values: Iterable[float]) -> float | None:
    values = list(values)
    return sum(values) / len(values) if values else None


def exclusion_lines(excluded: Mapping[str, Any] | None) -> list[str]:
    """What a summary says of ``--exclude`` (its record, :meth:`Exclusion.to_json`)."""
    if not excluded:
        return []
    tasks, unmatched = excluded.get("tasks") or [], excluded.get("unmatched") or []
    plural = "" if len(tasks) == 1 else "s"
    lines = [f"excluded by {excluded.get('file')}: {len(tasks)} task{plural}"]
    if unmatched:
        lines.append(f"exclude ids that match no task: {', '.join(unmatched)}")
    return lines


def format_summary(summary: Mapping[str, Any]) -> str:
    """A human-readable block for the end of a run."""
    mean = summary["mean_reward"]
    lines = [
        f"episodes: {summary['episodes']} over {summary['tasks']} tasks "
        f"(n={summary['samples_per_task']})",
        f"mean reward: {mean:.3f} over {summary['rewarded_episodes']} rewarded episodes"
        if mean is not None
        else "mean reward: n/a (no episode was rewarded)",
    ]
    for name, value in (summary.get("reward_components") or {}).items():
        lines.append(f"  {name}: {value:.3f}")
    for name, value in (summary.get("pass_at_k") or {}).items():
        lines.append(f"{name}: {value:.3f}" if value is not None else f"{name}: n/a")
    lines.append(
        "exit reasons: "
        + (", ".join(f"{k}={v}" for k, v in summary["exit_reasons"].items()) or "none")
    )
    lines.append(
        "tool calls: " + (", ".join(f"{k}={v}" for k, v in summary["tool_calls"].items()) or "none")
    )
    times = summary["time_seconds"]
    lines.append(
        "time (s, summed over episodes): "
        + ", ".join(f"{k.removesuffix('_seconds')}={v:.1f}" for k, v in times.items())
        + f"; wall {summary['wall_seconds']:.1f}"
    )
    for name, share in (summary.get("servers") or {}).items():
        lines.append(
            f"model server {name}: {share['episodes']} episodes, "
            f"{share['generated_tokens']} generated tokens, "
            f"{share['failed_attempts']} attempts lost (retried)"
        )
    if summary.get("skipped_rows"):
        lines.append(f"skipped task rows: {len(summary['skipped_rows'])}")
    lines += exclusion_lines(summary.get("excluded"))
    if summary.get("failed_tasks"):
        lines.append(f"tasks that could not start: {len(summary['failed_tasks'])}")
    integrity = summary.get("integrity") or {}
    if integrity.get("tampered_episodes"):
        kinds = ", ".join(f"{k}={v}" for k, v in integrity["tampered"].items() if v)
        lines.append(
            f"tampering reported: {integrity['tampered_episodes']} of "
            f"{integrity['graded_episodes']} graded episodes ({kinds})"
        )
    probed = ", ".join(f"{k}={v}" for k, v in (integrity.get("classes") or {}).items() if v)
    if probed:
        lines.append(f"attack classes seen: {probed}")
    if summary.get("infrastructure_failures"):
        lines.append(
            f"infrastructure failures: {summary['infrastructure_failures']} (not the policy's; "
            "run the same command again to retry them)"
        )
    if summary.get("pending"):
        lines.append(f"not run: {summary['pending']}")
    if summary.get("stopped"):
        lines.append(summary["stopped"])
    return "\n".join(lines)
