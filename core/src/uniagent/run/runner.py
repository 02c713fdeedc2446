"""``uniagent run``: many episodes at once, results streamed to disk, resumable.

Layout of the output directory::

    OUT/manifest.json                  written at start: run id, start time, n, every planned job
    OUT/results.jsonl                  one line per finished (task, sample), appended as it finishes
    OUT/summary.json                   written at the end
    OUT/episodes/<task>/<sample>/      messages.json, rollout.json, log.txt, result.json
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import signal
import socket
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from uniagent.config import AgentConfig
from uniagent.env import procfs
from uniagent.env.host import cleanup_leftovers
from uniagent.episode import EpisodeResult, run_episode
from uniagent.errors import ConfigError, UniAgentError
from uniagent.resolve import resolve
from uniagent.run.progress import Progress
from uniagent.run.summary import summarize
from uniagent.run.tasks import BadRow, Task
from uniagent.services import check_task_services, running_services

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
RESULTS = "results.jsonl"
SUMMARY = "summary.json"


@dataclass(frozen=True)
class Job:
    """One (task, sample) pair to run."""

    task: Task
    sample: int

    @property
    def key(self) -> tuple[str, int]:
        """The identity used for resuming."""
        return (self.task.id, self.sample)


def task_dirname(task_id: str) -> str:
    """The task id made safe as a folder name (``OUT/episodes/<this>/<sample>``)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", task_id).strip("._") or "task"


def episode_dir(out: Path, job: Job) -> Path:
    """Where a job's files go."""
    return out / "episodes" / task_dirname(job.task.id) / str(job.sample)


class ResultsFile:
    """The append-only results file: one JSON line per finished episode."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> list[dict[str, Any]]:
        """Finished records; a line cut short by a crash is ignored (that episode reruns)."""
        if not self.path.exists():
            return []
        records = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(record, dict) and "task_id" in record and "sample" in record:
                records.append(record)
        return records

    def repair(self) -> None:
        """Drop a partial last line so appends start on a fresh line."""
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        if data and not data.endswith(b"\n"):
            self.path.write_bytes(data[: data.rfind(b"\n") + 1])

    def append(self, record: Mapping[str, Any]) -> None:
        """Append one line and make it durable before returning."""
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
            handle.flush()
            os.fsync(handle.fileno())


def plan_jobs(
    tasks: Iterable[Task], n: int, limit: int | None, done: set[tuple[str, int]]
) -> list[Job]:
    """Every (task, sample) not yet in the results, for the first ``limit`` tasks."""
    selected = list(tasks)[:limit] if limit is not None else list(tasks)
    return [Job(t, s) for t in selected for s in range(n) if (t.id, s) not in done]


def write_manifest(out: Path, jobs: Iterable[Job], n: int) -> dict[str, Any]:
    """Record what this invocation plans to run, before any episode starts.

    ``uniagent view`` reads it to show queued jobs; ``pid``, ``pid_start`` (its start in
    clock ticks since boot, where /proc tells: a reused pid differs) and ``host`` tell it
    whether the run is still going.
    """
    owner = procfs.info(os.getpid())
    manifest = {
        "run_id": uuid.uuid4().hex[:12],
        "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "n": n,
        "pid": os.getpid(),
        "pid_start": owner.start_ticks if owner else None,
        "host": socket.gethostname(),
        "jobs": [[job.task.id, job.sample] for job in jobs],
    }
    _write_json(out / MANIFEST, manifest, indent=None)  # one line even for 100,000 jobs
    return manifest


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
    return {
        "record": {"task_id": job.task.id, "sample": job.sample, **result.summary()},
        "messages": result.messages,
        "rollout": result.cache.to_dict() if result.cache is not None else None,
    }


def write_payload(
    directory: Path, payload: Mapping[str, Any], log_text: str | None = None
) -> dict[str, Any]:
    """Save messages, rollout cache, log and result; return the results-file record."""
    directory.mkdir(parents=True, exist_ok=True)
    record = {**payload["record"], "episode_dir": str(directory)}
    _write_json(directory / "messages.json", payload["messages"])
    if payload["rollout"] is not None:
        _write_json(directory / "rollout.json", payload["rollout"])
    if log_text is not None:
        (directory / "log.txt").write_text(log_text, encoding="utf-8")
    _write_json(directory / "result.json", record)
    return record


def _write_json(path: Path, data: Any, indent: int | None = 1) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, ensure_ascii=False, indent=indent), encoding="utf-8")
    tmp.replace(path)


async def execute_job(config: AgentConfig, job: Job, model: Any, log_path: Path) -> dict[str, Any]:
    """Run one job, logging to ``log_path``; return its payload."""
    logger, handler = episode_logger(log_path, f"episode.{job.task.id}.{job.sample}")
    try:
        source = f"task {job.task.id}"
        episode_config = config.with_overrides(job.task.overrides(), source=source)
        check_task_services(config, episode_config, source)
        agent = resolve(episode_config, source=source)
        logger.info("task %s sample %d: start", job.task.id, job.sample)
        result = await run_episode(agent, job.task.row, model, logger=logger)
        logger.info("finished: %s reward=%s", result.exit_reason.value, result.reward)
        return episode_payload(job, result)
    finally:
        logger.removeHandler(handler)
        handler.close()


async def run_job(config: AgentConfig, job: Job, model: Any, out: Path) -> dict[str, Any]:
    """Run one job with its own log file and write its directory."""
    directory = episode_dir(out, job)
    directory.mkdir(parents=True, exist_ok=True)
    payload = await execute_job(config, job, model, directory / "log.txt")
    return write_payload(directory, payload)


async def run_local(
    config: AgentConfig,
    jobs: list[Job],
    model: Any,
    out: Path,
    *,
    concurrency: int,
    on_start: Callable[[Job], None],
    on_result: Callable[[Job, dict[str, Any] | None, BaseException | None], None],
) -> None:
    """Run jobs on this event loop, at most ``concurrency`` at once."""
    semaphore = asyncio.Semaphore(concurrency)

    async def one(job: Job) -> None:
        async with semaphore:
            on_start(job)
            try:
                record = await run_job(config, job, model, out)
            except UniAgentError as exc:  # the task itself is unusable: report, keep going
                on_result(job, None, exc)
            else:
                on_result(job, record, None)

    await asyncio.gather(*(one(job) for job in jobs))


async def run(
    config: AgentConfig,
    tasks: list[Task],
    bad_rows: list[BadRow],
    model_factory: Callable[[], Any],
    out: Path,
    *,
    concurrency: int | None = None,
    n: int = 1,
    limit: int | None = None,
    ray_address: str | None = None,
    ray_workers: int | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Run every pending (task, sample), append results as they finish, write the summary."""
    if n < 1:
        raise ConfigError("--n must be at least 1")
    resolve(config)  # every name and setting checked before any sandbox starts
    out.mkdir(parents=True, exist_ok=True)
    results = ResultsFile(out / RESULTS)
    results.repair()
    previous = results.load()
    done = {(r["task_id"], r["sample"]) for r in previous}
    planned = plan_jobs(tasks, n, limit, set())
    write_manifest(out, planned, n)
    jobs = [job for job in planned if job.key not in done]
    progress = progress or Progress.for_stream()
    for row in bad_rows:
        progress.warn(f"skipping task file line {row.line}: {row.reason}")
    base_dir = config.env.deployment.get("base_dir") if config.env.deployment.get(
        "type") == "host" else None
    leftovers = await asyncio.to_thread(cleanup_leftovers, base_dir)
    if leftovers:
        progress.warn(f"removed {len(leftovers)} leftovers of killed runs (uniagent clean)")
    progress.begin(total=len(jobs) + len(done), already_done=previous)
    started = time.time()

    def on_start(job: Job) -> None:
        progress.started(job)

    def on_result(job: Job, record: dict[str, Any] | None, error: BaseException | None) -> None:
        if record is not None:
            results.append(record)
        progress.finished(job, record, error)

    concurrency = concurrency or config.concurrency
    try:
        if ray_address:
            from uniagent.run.ray_backend import run_ray

            await run_ray(
                config, jobs, model_factory, out, ray_address, concurrency, on_start, on_result,
                num_workers=ray_workers,
            )
        else:
            async with running_services(config):  # once, before the first episode
                await run_local(
                    config,
                    jobs,
                    model_factory(),
                    out,
                    concurrency=concurrency,
                    on_start=on_start,
                    on_result=on_result,
                )
    finally:
        progress.end()
    summary = summarize(results.load(), n=n, wall_seconds=time.time() - started)
    summary["skipped_rows"] = [{"line": r.line, "reason": r.reason} for r in bad_rows]
    summary["failed_tasks"] = progress.task_errors
    _write_json(out / SUMMARY, summary)
    return summary


def run_sync(*args: Any, **kwargs: Any) -> dict[str, Any]:
    """:func:`run` under ``asyncio.run``; SIGTERM cancels like Ctrl-C so sandboxes close."""

    async def main() -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        loop.add_signal_handler(signal.SIGTERM, task.cancel)
        try:
            return await run(*args, **kwargs)
        finally:
            loop.remove_signal_handler(signal.SIGTERM)

    return asyncio.run(main())
