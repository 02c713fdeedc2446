"""``uniagent run --ray``: episodes dispatched to Ray actors, results streamed back.

Each actor runs many episodes on its own event loop (an async actor with
``max_concurrency`` slots); the driver keeps writing the same results file and
episode directories as a local run, so one command scales from a laptop to a
cluster. Actors return episode payloads rather than writing files, so no
shared filesystem is needed.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from uniagent.config import AgentConfig
from uniagent.errors import ConfigError, UniAgentError
from uniagent.run.runner import Job, episode_dir, execute_job, write_payload
from uniagent.services import ensure_services


class EpisodeWorker:
    """Body of the Ray actor: builds its model once, runs episodes concurrently."""

    def __init__(self, config: AgentConfig, model_factory: Callable[[], Any]) -> None:
        from uniagent.env import use_pidfd_child_watcher

        use_pidfd_child_watcher()
        self.config = config
        self.model = model_factory()

    async def run(self, job: Job) -> dict[str, Any]:
        """Run one job; return its payload and log text, or the task's error."""
        with tempfile.TemporaryDirectory(prefix="uniagent-episode-") as tmp:
            log_path = Path(tmp) / "log.txt"
            try:
                await ensure_services(self.config)  # once per actor process
                payload = await execute_job(self.config, job, self.model, log_path)
            except UniAgentError as exc:
                return {"error": str(exc)}
            return {"payload": payload, "log": log_path.read_text(encoding="utf-8")}


async def run_ray(
    config: AgentConfig,
    jobs: list[Job],
    model_factory: Callable[[], Any],
    out: Path,
    address: str,
    concurrency: int,
    on_start: Callable[[Job], None],
    on_result: Callable[[Job, dict[str, Any] | None, BaseException | None], None],
    *,
    num_workers: int | None = None,
) -> None:
    """Run ``jobs`` on Ray actors; ``concurrency`` episodes at once across all of them."""
    try:
        import ray
    except ImportError:
        raise ConfigError("--ray needs Ray: pip install 'uniagent[ray]'") from None
    if not ray.is_initialized():
        ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)
    workers = num_workers or max(1, min(int(ray.available_resources().get("CPU", 1)), concurrency))
    per_worker = max(1, concurrency // workers)
    actor_cls: Any = ray.remote(num_cpus=0)(EpisodeWorker)
    actors = [
        actor_cls.options(max_concurrency=per_worker).remote(config, model_factory)
        for _ in range(workers)
    ]
    pending: dict[Any, Job] = {}
    queue = list(reversed(jobs))
    slots = {i: per_worker for i in range(workers)}
    owner: dict[Any, int] = {}
    try:
        while queue or pending:
            for index in slots:
                while slots[index] and queue:
                    job = queue.pop()
                    ref = actors[index].run.remote(job)
                    pending[ref], owner[ref] = job, index
                    slots[index] -= 1
                    on_start(job)
            ready, _ = await asyncio.to_thread(ray.wait, list(pending), num_returns=1, timeout=1.0)
            for ref in ready:
                job = pending.pop(ref)
                slots[owner.pop(ref)] += 1
                try:
                    reply = await ref
                except Exception as exc:
                    on_result(job, None, exc)
                    continue
                if "error" in reply:
                    on_result(job, None, UniAgentError(reply["error"]))
                    continue
                record = write_payload(episode_dir(out, job), reply["payload"], reply["log"])
                on_result(job, record, None)
    finally:
        if pending:  # interrupted: let the actors close their sandboxes before they go
            for ref in pending:
                ray.cancel(ref, force=False)
            await asyncio.to_thread(ray.wait, list(pending), num_returns=len(pending), timeout=30)
        for actor in actors:
            ray.kill(actor, no_restart=True)
