"""Process-wide services (``uniagent_services``): started once per process, before episodes.

An agent config lists them by name with their settings::

    services:
      search: {index: runs/search_qa/index, unix_socket: /run/uniagent-search/search.sock}

``uniagent run`` wraps the whole run in :func:`running_services` (started before the
first episode, stopped at the end, also on Ctrl-C); a Ray actor and the verl adapter
call :func:`ensure_services` before each episode, which starts each service the first
time only and leaves it running for the life of the process. Services are keyed by
name and settings, so two configs with different settings get two instances.
The process-wide MCP servers (``scope: process``, :mod:`uniagent.mcp.process`) start
with their first episode and stop with the run here as well. Per-task
overrides cannot change them (:meth:`uniagent.resolver.ResolvedAgent.for_task` refuses it).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from pydantic import BaseModel

from uniagent.env.aio import wait_through_cancellation
from uniagent.errors import UniAgentError

if TYPE_CHECKING:  # pragma: no cover
    from uniagent.resolver import ResolvedAgent
    from uniagent.specs import RunningService, ServiceSpec

log = logging.getLogger(__name__)


class ServiceStartError(UniAgentError):
    """A service named by the config failed to start (infrastructure, not the policy)."""


def _key(spec: ServiceSpec, settings: BaseModel | None) -> str:
    dumped = settings.model_dump(mode="json") if settings is not None else None
    return json.dumps([spec.name, dumped], sort_keys=True, default=str)


_lock = threading.Lock()
#: key -> the (possibly still starting) service of this process.
_running: dict[str, concurrent.futures.Future[RunningService]] = {}


async def _start(spec: ServiceSpec, settings: BaseModel | None) -> tuple[bool, RunningService]:
    """Start the service unless this process already has it; (started now, handle)."""
    key = _key(spec, settings)
    with _lock:
        future = _running.get(key)
        owner = future is None
        if future is None:
            future = concurrent.futures.Future()
            _running[key] = future
    if not owner:  # started (or being started) by an earlier caller, maybe on another loop
        return False, await asyncio.wrap_future(future)
    try:
        log.info("starting service %s", spec.name)
        handle = await spec.start(settings)
    except BaseException as exc:
        with _lock:
            _running.pop(key, None)  # a later episode tries again
        error = ServiceStartError(
            f"service {spec.name!r} (from {spec.distribution or 'a plugin'}) failed to start: "
            f"{type(exc).__name__}: {exc}"
        )
        future.set_exception(error)
        if isinstance(exc, Exception):
            raise error from exc
        raise
    future.set_result(handle)
    return True, handle


async def ensure_services(agent: ResolvedAgent) -> None:
    """Start each service of ``agent`` that this process has not started yet.

    Raises :class:`ServiceStartError` when one fails (the next call tries again).
    """
    for spec, settings in agent.services:
        await _start(spec, settings)


async def stop_service(spec: ServiceSpec, settings: BaseModel | None) -> None:
    """Stop one service this process started and forget it (logs instead of raising)."""
    with _lock:
        future = _running.pop(_key(spec, settings), None)
    if future is None or not future.done() or future.exception() is not None:
        return
    try:
        await future.result().stop()
    except Exception as exc:
        log.warning("stopping service %s failed: %s: %s", spec.name, type(exc).__name__, exc)


@asynccontextmanager
async def running_services(agent: ResolvedAgent) -> AsyncIterator[None]:
    """Start the agent's services for the block; stop those it started, whatever happens."""
    started: list[tuple[ServiceSpec, BaseModel | None]] = []
    try:
        for spec, settings in agent.services:
            fresh, _ = await _start(spec, settings)
            if fresh:
                started.append((spec, settings))
        yield
    finally:
        for spec, settings in reversed(started):
            # To the end even when the run is cancelled meanwhile (a signal in teardown).
            await wait_through_cancellation(stop_service(spec, settings))
        if any(server.scope == "process" for server in agent.mcp_servers):
            from uniagent.mcp.process import close_mcp_servers

            await wait_through_cancellation(close_mcp_servers())
