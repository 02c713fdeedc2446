"""``uniagent run``: many episodes at once, results streamed to disk, resumable.

The output directory is laid out as :mod:`uniagent.run.layout` says (the lock, the
manifest, the results file, the summary, one folder per (task, sample)).

A (task, sample) is done when it ended with a policy outcome. An infrastructure
failure is retried within the run (``retries``, with backoff) and, if it remains,
recorded and run again by the next run in the same folder.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from uniagent.agents.gateways import require_token_model
from uniagent.config import AgentConfig
from uniagent.env.aio import many_sandboxes_gc, wait_through_cancellation
from uniagent.env.containers import RUN_ID
from uniagent.env.open_envs import close_open_envs, env_scope
from uniagent.errors import ConfigError, UniAgentError
from uniagent.models.pool import ModelPool
from uniagent.resolver import ResolvedAgent, resolve
from uniagent.run import manifest as manifests
from uniagent.run.folder import FolderLock, start_attempt, write_json, write_task_error
from uniagent.run.jobs import (
    Attempt,
    BackgroundCloser,
    Job,
    episode_dir,
    episode_payload,
    local_attempt,
    write_payload,
)
from uniagent.run.layout import MANIFEST, RESULTS, SUMMARY, safe_name
from uniagent.run.options import RunOptions
from uniagent.run.preflight import check_model, check_task_fields, grading_warnings
from uniagent.run.progress import Progress
from uniagent.run.results import ResultsFile, done_keys, is_infra_failure, latest
from uniagent.run.retry import CircuitBreaker, RetryPolicy, TamperAlarm, default_window
from uniagent.run.shutdown import SignalGuard
from uniagent.run.summary import resumed_wall_seconds, summarize
from uniagent.services import running_services
from uniagent.tasks import BadRow, Task

log = logging.getLogger(__name__)

#: The folder name of a task's episodes (an old name of :func:`uniagent.run.layout.safe_name`).
task_dirname = safe_name

__all__ = [
    "MANIFEST",
    "RESULTS",
    "SUMMARY",
    "Job",
    "ResultsFile",
    "RunStopped",
    "episode_dir",
    "episode_payload",
    "run",
    "run_sync",
    "task_dirname",
    "write_payload",
]


class RunStopped(UniAgentError):
    """The circuit breaker, or a failure to save results, stopped the run (exit status 1)."""


def plan_jobs(
    tasks: Iterable[Task], n: int, limit: int | None, done: set[tuple[str, int]]
) -> list[Job]:
    """Every (task, sample) not yet done, for the first ``limit`` tasks."""
    selected = list(tasks)[:limit] if limit is not None else list(tasks)
    return [Job(t, s) for t in selected for s in range(n) if (t.id, s) not in done]


async def run_jobs(
    jobs: list[Job],
    attempt_job: Attempt,
    out: Path,
    *,
    concurrency: int,
    policy: RetryPolicy,
    breaker: CircuitBreaker,
    progress: Progress,
    results: ResultsFile,
) -> None:
    """Run jobs, at most ``concurrency`` at once, retrying infrastructure failures.

    A job's record is appended to the results when it ends with a policy outcome or
    its retries are spent. When the breaker trips, every other job is cancelled (their
    sandboxes close) and :class:`RunStopped` is raised.
    """
    semaphore = asyncio.Semaphore(concurrency)
    tasks: list[asyncio.Task[None]] = []
    stopped: list[str] = []

    def stop_the_others(message: str) -> None:
        stopped.append(message)
        me = asyncio.current_task()
        for task in tasks:
            if task is not me:
                task.cancel()

    async def one(job: Job) -> None:
        async with semaphore:
            try:
                await attempts(job)
            except Exception as exc:  # the runner's own failure (disk full, ...)
                # Not the episode's and not the task's: nothing more can be saved reliably,
                # so the run stops (status 1) with the cause instead of a traceback.
                where = f"{job.task.id}#{job.sample}"
                stop_the_others(f"stopped: saving {where} failed: {type(exc).__name__}: {exc}")

    async def attempts(job: Job) -> None:
        for retry in range(policy.retries + 1):
            # A directory made, a log moved, a file made: off the loop, as the results line.
            attempt = await asyncio.to_thread(start_attempt, episode_dir(out, job))
            state = progress.started(job, attempt)
            try:
                record = await attempt_job(job, attempt, state)
            except UniAgentError as exc:  # the task itself is unusable: report, keep going
                write_task_error(episode_dir(out, job), job.task.id, job.sample, str(exc))
                progress.finished(job, None, exc)
                return
            tripped = breaker.observe(record, first=retry == 0)
            last = retry == policy.retries or breaker.tripped
            if not is_infra_failure(record) or last:
                # fsync off the event loop: it would stall every other episode.
                await asyncio.to_thread(results.append, record)
                progress.finished(job, record)
                if tripped:
                    stop_the_others(breaker.message())
                return
            delay = policy.backoff(retry + 1)
            progress.retrying(job, record, delay, policy.retries - retry)
            await asyncio.sleep(delay)

    tasks.extend(asyncio.ensure_future(one(job)) for job in jobs)
    try:
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
    except asyncio.CancelledError:
        for task in tasks:
            task.cancel()
        # Let every episode unwind (and close its sandbox) before the caller goes on.
        await wait_through_cancellation(asyncio.gather(*tasks, return_exceptions=True))
        raise
    if stopped:
        raise RunStopped(stopped[0])
    for outcome in outcomes:
        if isinstance(outcome, BaseException) and not isinstance(outcome, asyncio.CancelledError):
            raise outcome


def model_env(model_info: Mapping[str, Any]) -> dict[str, str]:
    """The model's API key variables that are set here, for workers on other machines."""
    names = {"OPENAI_API_KEY", model_info.get("api_key_env") or "OPENAI_API_KEY"}
    return {name: os.environ[name] for name in sorted(names) if os.environ.get(name)}


def build_model(model_factory: Callable[[], Any], description: str) -> Any:
    """The model, or a one-line :class:`ConfigError` when it cannot be made."""
    try:
        return model_factory()
    except UniAgentError:
        raise
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        raise ConfigError(
            f"cannot load the model {description}: {type(exc).__name__}: {first}"
        ) from None


async def run(
    agent: ResolvedAgent | AgentConfig,
    tasks: list[Task],
    bad_rows: list[BadRow],
    model_factory: Callable[[], Any],
    out: Path,
    options: RunOptions | None = None,
    *,
    progress: Progress | None = None,
    **option_values: Any,
) -> dict[str, Any]:
    """Run every pending (task, sample), append results as they finish, write the summary.

    ``agent`` is resolved once (an :class:`AgentConfig` is resolved here, before anything
    starts); the run's options are ``options``, or :class:`RunOptions` built from
    ``option_values`` (``run(agent, ..., n=2, limit=4)``).

    Raises :class:`ConfigError` for bad input (before any sandbox starts: a task row
    without a field the reward needs too),
    :class:`uniagent.run.preflight.EndpointError` when the model endpoint cannot be
    used. The summary's ``status`` is ``complete``, ``infrastructure_failures``
    (some remain), ``stopped`` (the circuit breaker tripped: ``stopped`` says why)
    or ``interrupted``.
    """
    if options is not None and option_values:
        raise TypeError("give run() options= or option keywords, not both")
    options = options if options is not None else RunOptions(**option_values)
    if isinstance(agent, AgentConfig):
        agent = resolve(agent)  # every name and setting checked before any sandbox starts
    # Rows the reward cannot grade: refused now, not after their episodes ran.
    check_task_fields(agent, tasks[: options.limit] if options.limit is not None else tasks)
    lock = FolderLock(out)
    lock.acquire()
    try:
        # Its clean-up closes its own sandboxes, no other run's; the garbage collector runs
        # less often while they run (env/aio.py).
        with env_scope(), many_sandboxes_gc():
            return await _run_locked(
                agent, tasks, bad_rows, model_factory, out, options,
                progress or Progress.for_stream(),
            )  # fmt: skip
    finally:
        lock.release()


async def _run_locked(
    agent: ResolvedAgent,
    tasks: list[Task],
    bad_rows: list[BadRow],
    model_factory: Callable[[], Any],
    out: Path,
    options: RunOptions,
    progress: Progress,
) -> dict[str, Any]:
    concurrency = options.concurrency or agent.config.concurrency
    warm = agent.config.warm if options.warm is None else options.warm
    policy = RetryPolicy(options.retries, options.retry_delay)
    window = default_window(concurrency) if options.breaker is None else options.breaker
    model_info = options.model_info or {"spec": "(given in-process)"}
    n = options.n
    results = ResultsFile(out / RESULTS)
    results.repair()
    records = latest(results.load())
    limit = options.limit
    selected = list(tasks)[:limit] if limit is not None else list(tasks)
    planned = [(t.id, s) for t in selected for s in range(n)]
    keys = set(planned)
    done = done_keys(records, keep_failures=options.keep_failures)
    jobs = plan_jobs(selected, n, None, done)
    run_manifest = _manifest(
        out, agent, options, model_info, tasks, planned, has_results=bool(records),
        progress=progress,
    )  # fmt: skip
    run_id = run_manifest["run_id"]
    for row in bad_rows:
        progress.warn(f"skipping task file line {row.line}: {row.reason}")
    if options.exclude is not None and options.exclude.warning():
        progress.warn(str(options.exclude.warning()))
    for warning in grading_warnings(agent):
        progress.warn(warning)
    rerun = sum(1 for job in jobs if job.key in records)
    started = time.time()
    model = None
    run_token = RUN_ID.set(run_id)  # every sandbox started from here on carries it
    try:
        if not options.ray_address:
            model = build_model(model_factory, str(model_info.get("spec")))
            if agent.agent.is_harness:  # the gateway serves token models only: said now
                for one in model.models if isinstance(model, ModelPool) else [model]:
                    require_token_model(one, agent.agent.name)
            if jobs:
                await check_model(model)
        # Written once the model is known to load: a typo in --model leaves no manifest.
        write_json(out / MANIFEST, run_manifest, indent=None)  # one line, 100k jobs
        leftovers = await asyncio.to_thread(agent.cleanup_leftovers, [run_id])
        if leftovers:
            progress.warn(f"removed {len(leftovers)} leftovers of killed runs (uniagent clean)")
        kept = [r for k, r in records.items() if k in done and k in keys]
        progress.begin(total=len(keys), already_done=kept, rerun=rerun)
        breaker = CircuitBreaker(
            window,
            alarm=TamperAlarm.of(
                agent.reward.integrity.alert if agent.reward is not None else None
            ),
        )
        status, stopped = "complete", None
        try:
            if options.ray_address:
                from uniagent.run.ray_backend import ray_attempts

                async with ray_attempts(
                    agent, model_factory, out, options.ray_address, concurrency, run_id,
                    num_workers=options.ray_workers, env_vars=model_env(model_info), warm=warm,
                ) as (attempt_job, slots):  # fmt: skip
                    await run_jobs(
                        jobs, attempt_job, out, concurrency=slots, policy=policy,
                        breaker=breaker, progress=progress, results=results,
                    )  # fmt: skip
            else:
                # A sandbox closes while the next episode starts (at most `concurrency` at once).
                closer = BackgroundCloser(concurrency)
                # `concurrency` agents at once; `warm` more episodes set up their sandboxes (or
                # are graded) meanwhile.
                agents = asyncio.Semaphore(concurrency) if warm else None
                attempt_job = local_attempt(agent, model, out, progress, closer, agents)
                try:
                    async with running_services(agent):  # once, before the first episode
                        await run_jobs(
                            jobs, attempt_job, out, concurrency=concurrency + warm,
                            policy=policy, breaker=breaker, progress=progress, results=results,
                        )  # fmt: skip
                finally:
                    await wait_through_cancellation(closer.drain())
        except RunStopped as exc:
            status, stopped = "stopped", str(exc)
        except asyncio.CancelledError:
            status = "interrupted"
            raise
        finally:
            await close_open_envs()  # whatever cancelled the episodes, none of the run's stays
            progress.end(final=status != "interrupted")
            summary = _summary(results, keys, n, started, bad_rows, progress, status, stopped)
            if options.exclude is not None:
                summary["excluded"] = options.exclude.to_json()
            # Summed over the runs in this folder; a resume with nothing to run adds nothing.
            this_run = summary["wall_seconds"] if jobs else 0.0
            summary["wall_seconds"] = resumed_wall_seconds(out / SUMMARY, this_run)
            write_json(out / SUMMARY, summary)
    finally:
        RUN_ID.reset(run_token)
        if model is not None and hasattr(model, "aclose"):
            with contextlib.suppress(Exception):  # closed even when cancelled meanwhile
                await wait_through_cancellation(model.aclose())
    return summary


def _manifest(
    out: Path,
    agent: ResolvedAgent,
    options: RunOptions,
    model_info: Mapping[str, Any],
    tasks: list[Task],
    jobs: list[tuple[str, int]],
    *,
    has_results: bool,
    progress: Progress,
) -> dict[str, Any]:
    """The manifest: a new run's, or a resumed one's after checking it is the same run."""
    old = manifests.load(out)
    new = manifests.build(
        run_id=None, config=agent.config, config_path=options.config_path, model=model_info,
        tasks_path=options.tasks_path, tasks=tasks, n=options.n, jobs=jobs,
        exclude=options.exclude.to_json() if options.exclude is not None else None,
    )  # fmt: skip
    if old is not None:
        new = manifests.resume(old, new, force=options.force_resume)
    elif has_results:
        progress.warn(
            f"{out} has results but no manifest (an older uniagent's run): resuming unchecked"
        )
    return new


def _summary(
    results: ResultsFile,
    keys: set[tuple[str, int]],
    n: int,
    started: float,
    bad_rows: list[BadRow],
    progress: Progress,
    status: str,
    stopped: str | None,
) -> dict[str, Any]:
    records = [r for k, r in latest(results.load()).items() if k in keys]
    summary = summarize(records, n=n, wall_seconds=time.time() - started)
    summary["skipped_rows"] = [{"line": r.line, "reason": r.reason} for r in bad_rows]
    summary["failed_tasks"] = progress.task_errors
    unusable = {(e["task_id"], e["sample"]) for e in progress.task_errors}
    summary["pending"] = len(keys - unusable) - len(records)
    if status == "complete" and (summary["infrastructure_failures"] or summary["pending"]):
        status = "infrastructure_failures"
    summary["status"] = status
    if stopped:
        summary["stopped"] = stopped
    return summary


def exit_status(summary: Mapping[str, Any]) -> int:
    """0: every episode ended with a policy outcome; 1: infrastructure failures remain;
    2: task rows were skipped or tasks could not start (bad input)."""
    if summary["status"] != "complete":
        return 1
    if summary.get("skipped_rows") or summary.get("failed_tasks"):
        return 2
    return 0


def run_sync(*args: Any, **kwargs: Any) -> dict[str, Any]:
    """:func:`run` under ``asyncio.run``; SIGINT and SIGTERM stop it cleanly.

    After a signal every open sandbox of the run is closed, then
    :class:`~uniagent.run.shutdown.Interrupted` is raised (exit status 128 + the signal
    number). The command's :class:`SignalGuard` is used when one is in effect (``uniagent
    run`` guards its every phase), else one guards this call.
    """
    progress: Progress | None = kwargs.get("progress")
    guard = SignalGuard.current()
    with contextlib.ExitStack() as stack:
        if guard is None:
            guard = stack.enter_context(SignalGuard())
        return guard.run(lambda: run(*args, **kwargs), progress=progress)
