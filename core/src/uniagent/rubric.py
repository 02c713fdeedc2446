"""Rubrics: several registered rewards graded as one (``reward: {rubric: [...], metrics: [...]}``).

A rubric is composed *above* the grader: :func:`rubric_spec` makes one
:class:`~uniagent.specs.RewardSpec` whose function runs every component on the same
:class:`~uniagent.reward.RewardContext` (the same grading sandbox, after the one integrity
check), each with its own validated settings. Components whose spec says ``concurrent``
run together; the others one after another, in the config's order, after them.

The result's score is the aggregate of the weighted components (``weighted-sum``,
``weighted-mean``, ``all-pass``, ``min``); ``info`` keeps each component's score, weight
and info under ``rubric``, and ``metrics`` (weight 0: logged, never trained on) under
``metrics``. A component's :class:`~uniagent.reward.RewardInfraError` masks the episode
like a single reward's; any other exception reaches the grader, which scores the episode 0.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from uniagent.protect.settings import IntegrityDefaults, Workspace
from uniagent.reward import RewardContext, RewardInfraError, RewardResult
from uniagent.specs import RewardSpec

#: The name of the composite reward's spec.
RUBRIC = "rubric"


@dataclass(frozen=True)
class Component:
    """One resolved reward of a rubric (``weight == 0``: a metric)."""

    key: str
    spec: RewardSpec[Any]
    settings: Any
    weight: float
    metric: bool = False


@dataclass(frozen=True)
class Rubric:
    """The settings of the composite reward: its components and how they aggregate."""

    components: tuple[Component, ...]
    aggregate: str = "weighted-sum"
    pass_score: float = 1.0

    @property
    def weighted(self) -> tuple[Component, ...]:
        """The components that make the reward (non-zero weight)."""
        return tuple(c for c in self.components if not c.metric and c.weight != 0)


def aggregate(rubric: Rubric, scores: Mapping[str, float]) -> float:
    """The episode's reward from the components' scores (keyed by component key)."""
    weighted = rubric.weighted
    if rubric.aggregate == "weighted-mean":
        return sum(c.weight * scores[c.key] for c in weighted) / sum(c.weight for c in weighted)
    if rubric.aggregate == "all-pass":
        return 1.0 if all(scores[c.key] >= rubric.pass_score for c in weighted) else 0.0
    if rubric.aggregate == "min":
        return min(scores[c.key] for c in weighted)
    return sum(c.weight * scores[c.key] for c in weighted)


async def grade_rubric(ctx: RewardContext[Rubric]) -> RewardResult:
    """Run every component on ``ctx``'s sandbox; the aggregate and every component's result."""
    rubric = ctx.settings
    results: dict[str, RewardResult] = {}

    async def one(component: Component) -> None:
        context = dataclasses.replace(
            ctx,
            settings=component.settings,
            sandbox=ctx.sandbox if component.spec.uses_sandbox else None,
        )
        results[component.key] = RewardResult.coerce(await component.spec.fn(context))

    together = [c for c in rubric.components if c.spec.concurrent]
    if together:  # each runs to its end; then an infrastructure error first, else any other
        failed = [
            e
            for e in await asyncio.gather(*(one(c) for c in together), return_exceptions=True)
            if isinstance(e, BaseException)
        ]
        if failed:
            raise next((e for e in failed if isinstance(e, RewardInfraError)), failed[0])
    for component in rubric.components:
        if not component.spec.concurrent:
            await one(component)
    scores = {key: float(result.score) for key, result in results.items()}
    parts = {
        c.key: {
            "reward": c.spec.name,
            "score": scores[c.key],
            "weight": c.weight,
            "info": dict(results[c.key].info),
        }
        for c in rubric.components
    }
    info: dict[str, Any] = {
        "aggregate": rubric.aggregate,
        "rubric": {k: v for k, v in parts.items() if not _metric(rubric, k)},
        "metrics": {k: v for k, v in parts.items() if _metric(rubric, k)},
    }
    # What its components saw of the policy's probing (uniagent.protect.report), the rubric's.
    probing = {c for r in results.values() if isinstance(p := r.info.get("probing"), list)
               for c in p if isinstance(c, str)}  # fmt: skip
    if probing:
        info["probing"] = sorted(probing)
    tampered = [k for k, r in results.items() if r.info.get("score_reason") == "tampered"]
    if tampered:
        # One component caught tampering: the episode is worth nothing, not only that part.
        info.update(
            score_reason="tampered",
            detail=f"rubric component(s) {', '.join(tampered)} reported tampering",
            tampered=[t for k in tampered for t in results[k].info.get("tampered") or ()],
        )
        return RewardResult(0.0, info)
    turns: dict[int, float] = {}
    for c in rubric.weighted:  # per-turn credit: the weighted sum of the components'
        for turn, value in results[c.key].turn_scores.items():
            turns[turn] = turns.get(turn, 0.0) + c.weight * float(value)
    return RewardResult(turn_scores=turns, score=aggregate(rubric, scores), info=info)


def _metric(rubric: Rubric, key: str) -> bool:
    return any(c.key == key and (c.metric or c.weight == 0) for c in rubric.components)


def rubric_spec(rubric: Rubric) -> RewardSpec[Rubric]:
    """The one reward the grader runs for ``rubric``: integrity from all its components."""
    specs = [c for c in rubric.components if c.spec.uses_sandbox]
    return RewardSpec(
        name=RUBRIC,
        fn=grade_rubric,
        description="a rubric of " + ", ".join(c.key for c in rubric.components),
        uses_sandbox=bool(specs),
        integrity=_integrity(specs),
        task_fields=_task_fields,
    )


def _task_fields(rubric: Rubric) -> list[str]:
    """The task fields every component needs, each once."""
    fields: list[str] = []
    for c in rubric.components:
        needed = c.spec.task_fields(c.settings) if c.spec.task_fields is not None else ()
        fields += [f for f in needed if f not in fields]
    return fields


def _integrity(components: Sequence[Component]) -> IntegrityDefaults:
    """The union of the components' protections; the first workspace and test-env functions."""
    if not components:
        return IntegrityDefaults()
    protect: list[Any] = []
    content: list[Any] = []
    for c in components:
        protect += [r for r in c.spec.integrity.protect if r not in protect]
        content += [r for r in c.spec.integrity.content_rules if r not in content]
    owner = next((c for c in components if c.spec.integrity.workspace is not None), None)

    def workspace(task: Mapping[str, Any], _settings: Any) -> Workspace:
        assert owner is not None and owner.spec.integrity.workspace is not None
        return owner.spec.integrity.workspace(task, owner.settings)

    tested = next((c for c in components if c.spec.integrity.test_env is not None), None)

    def test_env(task: Mapping[str, Any], _settings: Any) -> Any:
        assert tested is not None and tested.spec.integrity.test_env is not None
        return tested.spec.integrity.test_env(task, tested.settings)

    return IntegrityDefaults(
        scrub_history=any(c.spec.integrity.scrub_history for c in components),
        disable_plugin_autoload=any(c.spec.integrity.disable_plugin_autoload for c in components),
        # fresh when any component grades fresh by default (the stricter place)
        grade_in="fresh"
        if any(c.spec.integrity.grade_in == "fresh" for c in components)
        else "episode",
        protect=tuple(protect),
        content_rules=tuple(content),
        workspace=workspace if owner is not None else None,
        test_env=test_env if tested is not None else None,
    )


def component_scores(info: Mapping[str, Any]) -> dict[str, float]:
    """``{key: score}`` of every rubric component and metric in a reward's ``info`` ({} else)."""
    out: dict[str, float] = {}
    for part in ("rubric", "metrics"):
        entries = info.get(part)
        if not isinstance(entries, Mapping):
            continue
        for key, entry in entries.items():
            score = entry.get("score") if isinstance(entry, Mapping) else None
            if isinstance(score, int | float) and not isinstance(score, bool):
                out[str(key)] = float(score)
    return out
