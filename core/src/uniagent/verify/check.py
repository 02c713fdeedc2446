"""Run each task's oracle and no-op baseline ``k`` times and classify the task.

Each attempt is one sandbox, set up as an episode's (the task's overrides, the tools,
the grader's integrity baseline), then the oracle (or nothing) acts in the agent's
place, then the episode's grader grades it with the config's reward. A task is:

- ``ok``: every oracle attempt scored 1 and every baseline attempt 0;
- ``flaky``: the scores of one side differ between attempts (quarantined);
- ``broken_oracle``: its oracle does not score 1 (or its verifier crashed on it);
- ``passing_baseline``: doing nothing scores above 0 (or its verifier crashed on it: a
  verifier that crashes when the task is not solved hides policy failures as masked
  infrastructure failures);
- ``no_oracle``: it has no oracle (only the baseline was checked; not excluded unless
  its baseline passes).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from uniagent.episode import make_grader
from uniagent.errors import ConfigError
from uniagent.exit import ExitReason
from uniagent.observer import NULL_OBSERVER, EpisodeObserver
from uniagent.resolver import ResolvedAgent
from uniagent.run.preflight import check_task_fields
from uniagent.run.progress import Progress
from uniagent.tasks import Task
from uniagent.verify.oracle import oracle_of

log = logging.getLogger(__name__)

#: The classes of a task that ``uniagent run --exclude`` should skip.
EXCLUDED = ("broken_oracle", "passing_baseline", "flaky")


@dataclass(frozen=True)
class Attempt:
    """One graded attempt: its score, or the infrastructure error that stopped it."""

    mode: str
    score: float | None
    error: str | None = None
    info: Mapping[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        out: dict[str, Any] = {"mode": self.mode, "score": self.score, "seconds": self.seconds}
        if self.error is not None:
            out["error"] = self.error[-2000:]
        reason = self.info.get("score_reason")
        if reason:
            out["score_reason"] = reason
        return out


@dataclass(frozen=True)
class Verdict:
    """A task's class and the attempts behind it."""

    task_id: str
    status: str
    reason: str
    attempts: tuple[Attempt, ...]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (one line of ``verify.jsonl``)."""
        return {
            "task_id": self.task_id,
            "status": self.status,
            "reason": self.reason,
            "oracle": [a.score for a in self.attempts if a.mode == "oracle"],
            "baseline": [a.score for a in self.attempts if a.mode == "baseline"],
            "attempts": [a.to_dict() for a in self.attempts],
        }


@dataclass(frozen=True)
class _Job:
    """A (task, attempt) pair as the run's progress view labels it."""

    task: Task
    sample: str


async def attempt(
    agent: ResolvedAgent, task: Task, mode: str, observer: EpisodeObserver = NULL_OBSERVER
) -> Attempt:
    """Set the task's sandbox up, let the oracle act (``mode == "oracle"``) or not, grade.

    ``observer`` is told the phases (the progress view's "doing" column).
    """
    started = time.perf_counter()
    oracle = oracle_of(task.row) if mode == "oracle" else None
    if mode == "oracle" and oracle is None:
        raise ConfigError(f"task {task.id} has no oracle")
    try:
        agent = agent.for_task(task.overrides(), source=f"task {task.id}: config_overrides")
        grader = make_grader(agent, task.row)
        env = agent.new_env()
    except ConfigError as exc:
        return Attempt(mode, None, f"config: {exc}", seconds=time.perf_counter() - started)
    if grader is None:
        raise ConfigError("uniagent verify needs a reward in the config (reward: {name: ...})")
    info: dict[str, Any] = {}
    try:
        observer.phase("setup")
        await env.start()
        observer.phase("tools")
        await env.install_tools(list(agent.tools))
        observer.phase("baseline")
        await grader.prepare(env)
        submission = None
        observer.phase("agent")
        if oracle is not None:
            submission, info = await oracle.act(env)
        observer.phase("grading")
        grade = await grader.grade(
            env, messages=[], exit_reason=ExitReason.FINISHED, submission=submission
        )
        return Attempt(
            mode, grade.score, info={**info, **grade.info}, seconds=time.perf_counter() - started
        )
    except Exception as exc:  # infrastructure: the sandbox, the oracle's set-up, the verifier
        log.info("task %s %s attempt failed: %s", task.id, mode, exc)
        return Attempt(
            mode, None, f"{type(exc).__name__}: {exc}", info, time.perf_counter() - started
        )
    finally:
        observer.phase("close")
        await grader.close()  # a fresh sandbox started ahead and not used
        await env.close()


def classify(task_id: str, attempts: Sequence[Attempt], has_oracle: bool) -> Verdict:
    """The task's class from its attempts (see the module's docstring)."""
    oracle = [a.score for a in attempts if a.mode == "oracle"]
    baseline = [a.score for a in attempts if a.mode == "baseline"]
    done = tuple(attempts)
    for side, scores in (("oracle", oracle), ("baseline", baseline)):
        if len(set(scores)) > 1:
            shown = ", ".join("crash" if s is None else f"{s:g}" for s in scores)
            return Verdict(task_id, "flaky", f"{side} scored {shown} in {len(scores)} runs", done)
    if has_oracle:
        if oracle[0] is None:
            error = next(a.error for a in attempts if a.mode == "oracle")
            return Verdict(task_id, "broken_oracle", f"the oracle run failed: {error}", done)
        if oracle[0] < 1.0:
            return Verdict(task_id, "broken_oracle", f"the oracle scored {oracle[0]:g}", done)
    if baseline[0] is None:
        error = next(a.error for a in attempts if a.mode == "baseline")
        # Excluded either way: a verifier that crashes on an unsolved task would let the
        # policy mask its episodes; a baseline that cannot run at all is not a task to train on.
        return Verdict(task_id, "passing_baseline", f"the baseline run failed: {error}", done)
    if baseline[0] > 0.0:
        return Verdict(task_id, "passing_baseline", f"doing nothing scored {baseline[0]:g}", done)
    if not has_oracle:
        return Verdict(task_id, "no_oracle", "no oracle; the baseline scored 0", done)
    return Verdict(task_id, "ok", "the oracle scored 1 and the baseline 0", done)


async def verify_tasks(
    agent: ResolvedAgent,
    tasks: Sequence[Task],
    *,
    k: int = 1,
    concurrency: int = 1,
    progress: Progress | None = None,
) -> list[Verdict]:
    """Each task's verdict from ``k`` oracle and ``k`` baseline attempts.

    Each task's attempts run one after the other (oracle, baseline, oracle, ...);
    ``concurrency`` tasks at once. Raises :class:`ConfigError` before any attempt when a
    task's row lacks a field the reward needs.
    """
    check_task_fields(agent, tasks)
    gate = asyncio.Semaphore(concurrency)
    has = {t.id: oracle_of(t.row) is not None for t in tasks}
    if progress is not None:
        progress.begin(sum(k * (1 + has[t.id]) for t in tasks))

    async def one(task: Task) -> Verdict:
        attempts: list[Attempt] = []
        async with gate:
            for i in range(1, k + 1):
                for mode in ("oracle", "baseline") if has[task.id] else ("baseline",):
                    job = _Job(task, f"{mode}.{i}")
                    observer = progress.started(job) if progress is not None else NULL_OBSERVER
                    done = await attempt(agent, task, mode, observer)
                    attempts.append(done)
                    if progress is not None:
                        progress.finished(job, _record(done))
        return classify(task.id, attempts, has[task.id])

    try:
        return list(await asyncio.gather(*(one(t) for t in tasks)))
    finally:
        if progress is not None:
            progress.end()


def _record(done: Attempt) -> dict[str, Any]:
    """An attempt as the progress view counts an episode record."""
    if done.score is None:
        return {"exit_reason": ExitReason.REWARD_ERROR.value, "error": done.error, "metrics": {}}
    return {"exit_reason": ExitReason.FINISHED.value, "reward": done.score, "metrics": {}}
