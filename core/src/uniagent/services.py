"""Process-wide services (``uniagent_services``): started once per process, before episodes.

An agent config lists them by name with their settings::

    services:
      search: {index: runs/search_qa/index, unix_socket: /run/uniagent-search/search.sock}

``uniagent run`` wraps the whole run in :func:`running_services` (started before the
first episode, stopped at the end, also on Ctrl-C); a Ray actor and the verl adapter
call :func:`ensure_services` before each episode, which starts each service the first
time only and leaves it running for the life of the process. Services are keyed by
name and settings, so two configs with different settings get two instances. Per-task
overrides cannot change them (:func:`check_task_services`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import threading
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ValidationError

from uniagent.errors import ConfigError, UniAgentError

if TYPE_CHECKING:  # pragma: no cover
    from uniagent.config import AgentConfig
    from uniagent.specs import RunningService, ServiceSpec

log = logging.getLogger(__name__)


class ServiceStartError(UniAgentError):
    """A service named by the config failed to start (infrastructure, not the policy)."""


def resolve_services(
    services: Mapping[str, Mapping[str, Any]],
) -> list[tuple[ServiceSpec, BaseModel | None]]:
    """The spec and validated settings of each named service; unknown names and keys raise."""
    from uniagent.registry import get_registry

    registry = get_registry().services()
    resolved: list[tuple[ServiceSpec, BaseModel | None]] = []
    for name, raw in services.items():
        spec = registry[name]
        if spec.config is None:
            if raw:
                raise ConfigError(f"services.{name}: service {name!r} takes no settings")
            resolved.append((spec, None))
            continue
        try:
            resolved.append((spec, spec.config.model_validate(dict(raw or {}))))
        except ValidationError as exc:
            problems = "; ".join(
                f"services.{name}.{'.'.join(str(p) for p in err['loc'])}: "
                + ("unknown key" if err["type"] == "extra_forbidden" else str(err["msg"]))
                for err in exc.errors()
            )
            raise ConfigError(problems) from None
    return resolved


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


async def ensure_services(config: AgentConfig) -> None:
    """Start each service of ``config`` that this process has not started yet.

    Raises :class:`ServiceStartError` when one fails (the next call tries again).
    """
    for spec, settings in resolve_services(config.services):
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
async def running_services(config: AgentConfig) -> AsyncIterator[None]:
    """Start the config's services for the block; stop those it started, whatever happens."""
    started: list[tuple[ServiceSpec, BaseModel | None]] = []
    try:
        for spec, settings in resolve_services(config.services):
            fresh, _ = await _start(spec, settings)
            if fresh:
                started.append((spec, settings))
        yield
    finally:
        for spec, settings in reversed(started):
            await asyncio.shield(stop_service(spec, settings))


def check_task_services(base: AgentConfig, episode: AgentConfig, source: str) -> None:
    """Refuse a per-task override of ``services``: they are started once, for every task."""
    if episode.services != base.services:
        raise ConfigError(
            f"{source}: services cannot be changed per task (they run once per process for "
            "every task); set them in the agent config"
        )
