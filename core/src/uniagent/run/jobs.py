"""One job of a run: a (task, sample) pair, its attempts and the files each writes.

The runner (:mod:`uniagent.run.runner`) schedules jobs; this module runs one
attempt of one: the episode with its own log file (and observer), then its
directory's files and the record the results file gets.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from uniagent.env import AgentEnv
from uniagent.episode import Closer, EpisodeResult, Gate, run_episode
from uniagent.exit import ExitReason
from uniagent.interaction.metrics import EpisodeMetrics
from uniagent.models.base import ModelError
from uniagent.models.pool import ModelPool
from uniagent.observer import EpisodeObserver
from uniagent.resolver import ResolvedAgent
from uniagent.run.folder import write_episode
from uniagent.run.layout import LOG, RESULT, attempt_log, episode_path
from uniagent.run.progress import EpisodeState, Progress
from uniagent.run.results import LEAF_ROWS, is_infra_failure
from uniagent.run.retry import cause_of
from uniagent.tasks import Task


@dataclass(frozen=True)
class Job:
    """One (task, sample) pair to run."""

    task: Task
    sample: int

    @property
    def key(self) -> tuple[str, int]:
        """The identity used for resuming."""
        return (self.task.id, self.sample)


#: Runs one attempt of a job and returns its results record.
Attempt = Callable[[Job, int, EpisodeState], Awaitable[dict[str, Any]]]


def episode_dir(out: Path, job: Job) -> Path:
    """Where a job's files go: one directory per task id (see :mod:`uniagent.run.layout`)."""
    return episode_path(out, job.task.id, job.sample)


def episode_logger(path: Path, name: str) -> tuple[logging.Logger, logging.Handler]:
    """A logger writing to one episode's log file, not kept in logging's global registry.

    ``logging.getLogger`` would keep one logger per episode alive forever; a bare
    ``Logger`` is freed with the episode, and its handler is closed explicitly.
    """
    logger = logging.Logger(name, level=logging.INFO)
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    logger.addHandler(handler)
    return logger, handler


def episode_payload(job: Job, result: EpisodeResult) -> dict[str, Any]:
    """What an episode leaves behind, JSON-ready (it may cross processes under Ray)."""
    record = {"task_id": job.task.id, "sample": job.sample, **result.summary()}
    if result.leaves is not None:  # a tree rollout: the results file gets a row per leaf
        record[LEAF_ROWS] = [
            {"task_id": job.task.id, "sample": job.sample, **leaf.summary()}
            for leaf in result.leaves
        ]
    return {
        "record": record,
        "messages": result.saved_messages(),
        "rollout": rollout_payload(result),
    }


def rollout_payload(result: EpisodeResult) -> dict[str, Any] | None:
    """``rollout.json``: the rollout (a harness episode's: its main branch), and a harness
    episode's whole trajectory tree under ``tree`` (none: the rollout is the one branch)."""
    if result.cache is None:
        return None
    rollout = result.cache.to_dict()
    if result.tree is not None:
        rollout["tree"] = dict(result.tree)
    return rollout


def failure_payload(job: Job, error: str) -> dict[str, Any]:
    """The payload of an attempt its worker could not run (infrastructure, retried)."""
    result = EpisodeResult(
        ExitReason.UNKNOWN_ERROR, traj_masked=True, metrics=EpisodeMetrics(), error=error
    )
    return episode_payload(job, result)


def write_payload(
    directory: Path,
    payload: Mapping[str, Any],
    log_text: str | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Save messages, rollout, log and result; return the results-file record."""
    directory.mkdir(parents=True, exist_ok=True)
    if log_text is not None:
        (directory / LOG).write_text(log_text, encoding="utf-8")
    return write_episode(directory, payload, {"log": LOG, **(extra or {})})


async def execute_job(
    base: ResolvedAgent,
    job: Job,
    model: Any,
    log_path: Path,
    *,
    observer: EpisodeObserver | None = None,
    stream: logging.Handler | None = None,
    closer: Closer | None = None,
    gate: Gate | None = None,
) -> dict[str, Any]:
    """Run one attempt of a job, logging to ``log_path`` (and ``stream``); return its payload.

    ``base`` is the run's resolved agent; a task with overrides gets
    :meth:`~uniagent.resolver.ResolvedAgent.for_task`.
    """
    logger, handler = episode_logger(log_path, f"episode.{job.task.id}.{job.sample}")
    if stream is not None:
        logger.addHandler(stream)
    try:
        source = f"task {job.task.id}"
        agent = base.for_task(job.task.overrides(), source=source)
        logger.info("task %s sample %d: start", job.task.id, job.sample)
        if isinstance(model, ModelPool):
            return await _on_a_server(
                model, agent, job, logger=logger, observer=observer, closer=closer, gate=gate
            )
        result = await run_episode(
            agent,
            job.task.row,
            model,
            messages=job.task.messages,
            logger=logger,
            observer=observer,
            closer=closer,
            gate=gate,
        )
        logger.info("finished: %s reward=%s", result.exit_reason.value, result.reward)
        return episode_payload(job, result)
    finally:
        for item in (handler, stream):
            if item is not None:
                logger.removeHandler(item)
        handler.close()


async def _on_a_server(
    pool: ModelPool, agent: ResolvedAgent, job: Job, *, logger: logging.Logger, **kwargs: Any
) -> dict[str, Any]:
    """One attempt on the server the pool places it on (:mod:`uniagent.models.pool`); its
    ``model_error`` takes that server out. The record names the server and its tokens."""
    try:
        async with pool.lease() as (server, served):
            logger.info("model server: %s", server.name)
            result = await run_episode(
                agent, job.task.row, served, messages=job.task.messages, logger=logger, **kwargs
            )
            if result.exit_reason is ExitReason.MODEL_ERROR:
                pool.failed(server, result.error or "model_error")
    except ModelError as exc:  # every server out: infrastructure, retried by the run
        logger.error("no model server: %s", exc)
        failed = EpisodeResult(
            ExitReason.MODEL_ERROR, traj_masked=True, metrics=EpisodeMetrics(), error=str(exc)
        )
        return episode_payload(job, failed)
    logger.info("finished: %s reward=%s", result.exit_reason.value, result.reward)
    payload = episode_payload(job, result)
    payload["record"]["model_server"] = {
        "name": server.name,
        "generated_tokens": served.generated_tokens,
    }
    return payload


def attempt_extra(
    directory: Path,
    attempt: int,
    state: EpisodeState,
    started: float,
    record: Mapping[str, Any],
) -> dict[str, Any]:
    """What the runner adds to an attempt's record: attempt number, history, timings."""
    previous: list[dict[str, Any]] = []
    with contextlib.suppress(OSError, ValueError):
        before = json.loads((directory / RESULT).read_text(encoding="utf-8"))
        previous = [
            *before.get("previous_attempts", []),
            {
                "attempt": before.get("attempt", attempt - 1),
                "exit_reason": before.get("exit_reason"),
                "cause": cause_of(before) if before.get("error") else None,
                "log": attempt_log(before.get("attempt", attempt - 1)),
                **(
                    {"model_server": before["model_server"]["name"]}
                    if before.get("model_server")
                    else {}
                ),
            },
        ]
    return {
        "attempt": attempt,
        "previous_attempts": previous,
        "outcome": "infrastructure" if is_infra_failure(record) else "policy",
        "timings": state.timings(),
        "wall_seconds": round(time.monotonic() - started, 6),
    }


class BackgroundCloser:
    """Closes episodes' sandboxes off their path: an episode hands its sandbox over and ends
    (its job's slot goes to the next one) while the sandbox stops. At most ``limit`` close at
    once: past that, the episode handing one over waits until one has stopped. :meth:`drain`
    waits for all of them (a run does before it ends)."""

    def __init__(self, limit: int) -> None:
        self.limit = max(1, limit)
        self._closing: set[asyncio.Future[None]] = set()

    async def __call__(self, env: AgentEnv) -> None:
        while len(self._closing) >= self.limit:
            await asyncio.wait(self._closing, return_when=asyncio.FIRST_COMPLETED)
        closing = asyncio.ensure_future(env.close())  # logs instead of raising
        self._closing.add(closing)
        closing.add_done_callback(self._closing.discard)

    @property
    def closing(self) -> int:
        """Sandboxes stopping now."""
        return len(self._closing)

    async def drain(self) -> None:
        """Wait until every sandbox handed over has stopped."""
        while self._closing:
            await asyncio.wait(set(self._closing))


def local_attempt(
    base: ResolvedAgent,
    model: Any,
    out: Path,
    progress: Progress,
    closer: Closer | None = None,
    agents: asyncio.Semaphore | None = None,
) -> Attempt:
    """Attempts run on this event loop: each writes its episode directory; ``closer`` takes
    their sandboxes (:class:`BackgroundCloser`); with ``agents`` (a run that prepares
    sandboxes ahead), each episode's agent runs while it holds one of its slots."""

    async def attempt_job(job: Job, attempt: int, state: EpisodeState) -> dict[str, Any]:
        directory = episode_dir(out, job)
        started = time.monotonic()
        payload = await execute_job(
            base, job, model, directory / LOG, observer=state, stream=progress.log_handler(job),
            closer=closer, gate=agents,
        )  # fmt: skip
        extra = attempt_extra(directory, attempt, state, started, payload["record"])
        # Off the loop: three files, a rollout of many turns megabytes of JSON; on the loop
        # every other episode's commands and model calls would wait for the disk.
        return await asyncio.to_thread(write_payload, directory, payload, None, extra)

    return attempt_job
