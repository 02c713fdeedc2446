"""Several servers of one model in one run: each episode on one server, least-loaded first.

``uniagent run --model A --model B`` (or ``--model @servers.txt``) gives a
:class:`ModelPool`. Every episode leases one server for its whole length (its prompt prefix
stays in that server's cache; a harness's gateway session talks to that server only): the
server with the fewest episodes in flight, then the fewest so far, then the first named.
A server that fails under an episode (a ``model_error``: it stopped answering or kept
failing through the client's retries) is taken out: no new episode is placed on it while
a health check (``GET /models``, every ``health_interval`` seconds) fails, and it is put back
when one passes. The episodes that were on it end ``model_error`` (infrastructure: masked,
and retried by the run on a server that is up; never scored 0). With every server out, a
new episode waits up to ``wait_for_server`` seconds for one to come back, then ends
``model_error`` too.

Each episode gets its own shallow copy of its server's model (the HTTP client and
tokenizer shared) that counts the tokens it generated, so the run's results say which
server served an episode and how many tokens (``model_server`` in each record; the
summary's ``servers``), under Ray too.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from uniagent.env.aio import wait_for
from uniagent.errors import ConfigError
from uniagent.models.base import ModelError

log = logging.getLogger(__name__)


@dataclass
class Server:
    """One server of the pool: its model, name (its public URL) and counts."""

    name: str
    model: Any
    in_flight: int = 0
    episodes: int = 0
    up: bool = True
    failures: int = 0
    _health: asyncio.Task[None] | None = field(default=None, repr=False)


class ModelPool:
    """Servers of one model; :meth:`lease` places an episode on one of them."""

    def __init__(
        self,
        models: Sequence[Any],
        *,
        health_interval: float = 5.0,
        wait_for_server: float = 60.0,
    ) -> None:
        if len(models) < 2:
            raise ConfigError("a model pool needs at least two servers")
        names = [str(getattr(m, "where", None) or f"server {i}") for i, m in enumerate(models)]
        if len(set(names)) != len(names):
            raise ConfigError(f"the same server is named twice: {sorted(names)}")
        tokenizers = {id(getattr(m, "tokenizer", None)) for m in models}
        if len(tokenizers) != 1:
            raise ConfigError("the servers of one run share one tokenizer (build them with one)")
        self.servers = [Server(n, m) for n, m in zip(names, models, strict=True)]
        self.tokenizer = models[0].tokenizer if hasattr(models[0], "tokenizer") else None
        self.health_interval = health_interval
        self.wait_for_server = wait_for_server
        self._changed: asyncio.Condition | None = None

    @property
    def models(self) -> list[Any]:
        """Every server's model, in the order named."""
        return [s.model for s in self.servers]

    @property
    def where(self) -> str:
        """The servers' names, for messages."""
        return ", ".join(s.name for s in self.servers)

    def _condition(self) -> asyncio.Condition:
        if self._changed is None:
            self._changed = asyncio.Condition()
        return self._changed

    async def _pick(self) -> Server:
        deadline = time.monotonic() + self.wait_for_server
        changed = self._condition()
        async with changed:
            while True:
                up = [s for s in self.servers if s.up]
                if up:
                    server = min(up, key=lambda s: (s.in_flight, s.episodes))
                    server.in_flight += 1
                    server.episodes += 1
                    return server
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ModelError(
                        f"every model server is out ({self.where}); none came back within "
                        f"{self.wait_for_server:g} s"
                    )
                with contextlib.suppress(TimeoutError):
                    await wait_for(changed.wait(), left)

    @contextlib.asynccontextmanager
    async def lease(self) -> AsyncIterator[tuple[Server, Any]]:
        """The server for one episode and the episode's own copy of its model."""
        server = await self._pick()
        model = copy.copy(server.model)
        model.generated_tokens = 0
        try:
            yield server, model
        finally:
            server.in_flight -= 1

    def failed(self, server: Server, reason: str) -> None:
        """Take ``server`` out after an episode's ``model_error`` until a health check passes."""
        server.failures += 1
        if not server.up:
            return
        server.up = False
        log.warning("model server %s taken out: %s", server.name, reason)
        server._health = asyncio.get_running_loop().create_task(self._watch(server))

    async def _watch(self, server: Server) -> None:
        while not server.up:
            await asyncio.sleep(self.health_interval)
            try:
                await wait_for(_probe(server.model), max(self.health_interval, 1.0))
            except Exception as exc:  # still down (any failure of the probe)
                log.debug("model server %s still out: %s", server.name, exc)
                continue
            changed = self._condition()
            async with changed:
                server.up = True
                changed.notify_all()
            log.warning("model server %s is back", server.name)

    def shares(self) -> dict[str, dict[str, Any]]:
        """Episodes placed on each server so far, and whether it is up."""
        return {
            s.name: {"episodes": s.episodes, "up": s.up, "failures": s.failures}
            for s in self.servers
        }

    async def aclose(self) -> None:
        """Stop the health checks and close every server's client."""
        for server in self.servers:
            if server._health is not None:
                server._health.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await server._health
            if hasattr(server.model, "aclose"):
                with contextlib.suppress(Exception):
                    await server.model.aclose()


async def _probe(model: Any) -> None:
    """Raise unless ``model``'s server answers ``GET /models`` (a server without the route,
    404/405, answers: it is up)."""
    chat = getattr(model, "chat", model)
    if not hasattr(chat, "list_models"):
        return
    try:
        await chat.list_models()
    except Exception as exc:
        if getattr(exc, "status_code", None) in (403, 404, 405, 501):
            return
        raise
