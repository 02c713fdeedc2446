"""``uniagent run --ray``: episodes dispatched to Ray actors, results streamed back.

Each actor runs many episodes on its own event loop (an async actor with
``max_concurrency`` slots); the driver keeps writing the same results file and
episode directories as a local run, so one command scales from a laptop to a
cluster. Actors return episode payloads rather than writing files, so no
shared filesystem is needed. Retries, the circuit breaker and the results are
the driver's (:func:`uniagent.run.runner.run_jobs`); an interrupted run asks
every actor to close its open sandboxes before the actors are killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

from uniagent.env.aio import wait_through_cancellation
from uniagent.env.containers import RUN_ID_ENV
from uniagent.episode import worker_slots
from uniagent.errors import ConfigError, UniAgentError
from uniagent.resolver import ResolvedAgent
from uniagent.run.jobs import (
    Attempt,
    Job,
    attempt_extra,
    episode_dir,
    execute_job,
    failure_payload,
    write_payload,
)
from uniagent.run.layout import LOG
from uniagent.run.progress import EpisodeState
from uniagent.services import ensure_services

#: Seconds the actors get to close their sandboxes when the run is interrupted.
CLOSE_TIMEOUT = 120.0
#: What a running episode's log says until its worker's log arrives.
RAY_LOG_NOTE = "running on a Ray worker: its log is written here when the episode ends\n"

#: The Ray namespace of the run's actors, named ``uniagent-<run id>-<n>`` (n counts
#: replacements on: a dead actor's successor gets the next number).
NAMESPACE = "uniagent"


class EpisodeWorker:
    """Body of the Ray actor: builds its model once, runs episodes concurrently."""

    def __init__(
        self,
        agent: ResolvedAgent,
        model_factory: Callable[[], Any],
        run_id: str,
        agents: int | None = None,
    ) -> None:
        from uniagent.env import use_pidfd_child_watcher

        use_pidfd_child_watcher()
        os.environ[RUN_ID_ENV] = run_id  # the actor's sandboxes carry the run's id
        # The driver's resolved agent (resolved once, there; its plugins' functions pickle
        # by reference, so the actor's node has the same plugins installed).
        self.agent = agent
        # What dead owners left on this node (a killed predecessor's sandboxes): only
        # sandboxes whose owner process is gone are touched, as by `uniagent clean`.
        self.agent.cleanup_leftovers([])
        self.model = model_factory()
        #: With ``warm``: how many of this actor's episodes run their agent at once (the
        #: others set up their sandboxes or are graded meanwhile); None: all of them.
        self.agents = agents
        self._gate: asyncio.Semaphore | None = None  # made on the actor's event loop

    async def run(self, job: Job) -> dict[str, Any]:
        """Run one job; return its payload, log text and phase times, or the task's error."""
        state = EpisodeState(f"{job.task.id}#{job.sample}", 0)
        with tempfile.TemporaryDirectory(prefix="uniagent-episode-") as tmp:
            log_path = Path(tmp) / LOG
            try:
                await ensure_services(self.agent)  # once per actor process
                if self.agents is not None and self._gate is None:
                    self._gate = asyncio.Semaphore(self.agents)
                payload = await execute_job(
                    self.agent, job, self.model, log_path, observer=state, gate=self._gate
                )
            except ConfigError as exc:  # the task's own settings: it cannot run anywhere
                return {"error": str(exc)}
            except UniAgentError as exc:  # this worker's services: infrastructure, retried
                error = f"the Ray worker could not run the episode: {type(exc).__name__}: {exc}"
                payload = failure_payload(job, error)
            return {
                "payload": payload,
                "log": log_path.read_text(encoding="utf-8") if log_path.exists() else "",
                "timings": state.timings(),
            }

    async def close_sandboxes(self) -> int:
        """Close every sandbox this actor still has open (an interrupted run)."""
        from uniagent.env.agent_env import close_open_envs

        return await close_open_envs()


def worker_failure(name: str, exc: BaseException) -> str:
    """Why an attempt failed with its worker: one line that names the worker and the
    reason (a results record's ``cause``), then Ray's own text."""
    text = str(exc).strip()
    reason = text.splitlines()[-1].strip() if text else "no message"
    line = f"the Ray worker {name} failed ({type(exc).__name__}): {reason}"
    return f"{line}\n{text}" if "\n" in text else line


@contextlib.asynccontextmanager
async def ray_attempts(
    agent: ResolvedAgent,
    model_factory: Callable[[], Any],
    out: Path,
    address: str,
    concurrency: int,
    run_id: str,
    *,
    num_workers: int | None = None,
    env_vars: Mapping[str, str] | None = None,
    warm: int = 0,
) -> AsyncIterator[tuple[Attempt, int]]:
    """Start the actors; yield a function running one attempt on them, and the slot count.

    Each actor runs ``concurrency // workers`` agents at once; with ``warm``, it takes
    ``warm // workers`` episodes more (at least one), which set up their sandboxes (or are
    graded) while those agents run, as in a local run.

    ``env_vars`` (the model's API key) are set in every actor: on an existing cluster
    actors do not inherit the driver's environment. An actor that dies is replaced by a
    new one, which takes over its slots: the attempt it was running fails as
    infrastructure (the record names the dead worker) and is retried like any such failure.
    Each record names the worker its attempt ran on (``ray_worker``).
    """
    try:
        import ray
    except ImportError:
        raise ConfigError("--ray needs Ray: pip install 'uniagent[ray]'") from None
    if not ray.is_initialized():
        ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)
    workers = num_workers or max(1, min(int(ray.available_resources().get("CPU", 1)), concurrency))
    agents, per_worker = worker_slots(concurrency, warm, workers)
    actor_cls: Any = ray.remote(num_cpus=0)(EpisodeWorker)
    runtime_env = {"env_vars": dict(env_vars)} if env_vars else None
    numbers = itertools.count()
    names: list[str] = []

    def spawn() -> tuple[str, Any]:
        # Named, so that `ray list actors` (and a test) can tell the run's workers apart.
        name = f"uniagent-{run_id}-{next(numbers)}"
        # One slot more than episodes, so close_sandboxes gets through when all are busy.
        options = actor_cls.options(
            name=name, namespace=NAMESPACE, max_concurrency=per_worker + 1,
            runtime_env=runtime_env,
        )  # fmt: skip
        return name, options.remote(agent, model_factory, run_id, agents if warm else None)

    actors: list[Any] = []
    for _ in range(workers):
        name, actor = spawn()
        names.append(name)
        actors.append(actor)
    free: asyncio.Queue[int] = asyncio.Queue()
    for index in range(workers):
        for _ in range(per_worker):
            free.put_nowait(index)

    async def attempt_job(job: Job, attempt: int, state: EpisodeState) -> dict[str, Any]:
        index = await free.get()
        # The worker's log replaces this line when the episode ends.
        (episode_dir(out, job) / LOG).write_text(RAY_LOG_NOTE, encoding="utf-8")
        state.phase("setup")
        started = time.monotonic()
        actor, name = actors[index], names[index]
        ref = actor.run.remote(job)
        try:
            reply = await ref
        except asyncio.CancelledError:
            ray.cancel(ref, force=False)
            raise
        except Exception as exc:  # the actor died (OOM, a lost node): infrastructure, retried
            error = worker_failure(name, exc)
            reply = {"payload": failure_payload(job, error), "log": f"{error}\n"}
            if actors[index] is actor and isinstance(exc, ray.exceptions.RayActorError):
                # Its slots go on with a new actor (the retry runs there); one that is only
                # unreachable is killed first, so that it cannot go on beside its successor.
                ray.kill(actor, no_restart=True)
                names[index], actors[index] = spawn()
        finally:
            free.put_nowait(index)
        if "error" in reply:
            raise UniAgentError(reply["error"])
        directory = episode_dir(out, job)
        extra = attempt_extra(directory, attempt, state, started, reply["payload"]["record"])
        extra["timings"] = reply.get("timings", {})
        extra["ray_worker"] = name
        return await asyncio.to_thread(
            write_payload, directory, reply["payload"], reply["log"], extra
        )

    try:
        yield attempt_job, workers * per_worker
    except BaseException:  # interrupted or stopped: every actor closes its sandboxes first
        closing = [actor.close_sandboxes.remote() for actor in actors]
        await wait_through_cancellation(
            asyncio.to_thread(ray.wait, closing, num_returns=len(closing), timeout=CLOSE_TIMEOUT)
        )
        raise
    finally:
        for actor in actors:
            ray.kill(actor, no_restart=True)
