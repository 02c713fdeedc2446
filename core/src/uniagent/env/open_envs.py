"""Which sandboxes are open: per process, and per scope (a run), so clean-up closes its own.

Every :class:`~uniagent.env.agent_env.AgentEnv` registers itself when it starts and
leaves when it stops. A run opens an :func:`env_scope`; sandboxes started in it (its
episodes' asyncio tasks inherit the scope through a context variable) are counted
there too, so that the run's clean-up (:func:`close_open_envs`) closes its own
sandboxes and never those of another run in the same process.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import Iterator
from typing import TYPE_CHECKING

from uniagent.env.aio import wait_through_cancellation

if TYPE_CHECKING:  # pragma: no cover
    from uniagent.env.agent_env import AgentEnv

#: Every sandbox of this process started and not yet stopped.
_OPEN: set[AgentEnv] = set()


class OpenEnvs:
    """The sandboxes started in one scope (a run) and not yet stopped; see :func:`env_scope`."""

    def __init__(self, parent: OpenEnvs | None = None) -> None:
        self.parent = parent
        self._envs: set[AgentEnv] = set()

    def __len__(self) -> int:
        return len(self._envs)

    def add(self, env: AgentEnv) -> None:
        """Count ``env`` as open here and in every enclosing scope."""
        scope: OpenEnvs | None = self
        while scope is not None:
            scope._envs.add(env)
            scope = scope.parent

    def discard(self, env: AgentEnv) -> None:
        """``env`` is stopped."""
        scope: OpenEnvs | None = self
        while scope is not None:
            scope._envs.discard(env)
            scope = scope.parent

    async def close(self) -> int:
        """Close every sandbox of this scope; see :func:`close_open_envs`."""
        return await _close_all(self._envs)


#: The scope sandboxes started in this context belong to (asyncio tasks inherit it).
_SCOPE: contextvars.ContextVar[OpenEnvs | None] = contextvars.ContextVar(
    "uniagent_open_envs", default=None
)


def opened(env: AgentEnv) -> OpenEnvs | None:
    """Count ``env`` as open in this process and in the current scope; that scope."""
    _OPEN.add(env)
    scope = _SCOPE.get()
    if scope is not None:
        scope.add(env)
    return scope


def stopped(env: AgentEnv, scope: OpenEnvs | None) -> None:
    """``env`` (opened in ``scope``) is stopped."""
    _OPEN.discard(env)
    if scope is not None:
        scope.discard(env)


@contextlib.contextmanager
def env_scope() -> Iterator[OpenEnvs]:
    """A new scope for the block: sandboxes started in it (and in tasks it creates) are its own.

    ``uniagent run`` runs in one, so that its clean-up closes its sandboxes and no other
    run's in the same process. Scopes nest: an enclosing scope also counts what inner
    ones open.
    """
    scope = OpenEnvs(_SCOPE.get())
    token = _SCOPE.set(scope)
    try:
        yield scope
    finally:
        _SCOPE.reset(token)


async def close_open_envs(scope: OpenEnvs | None = None) -> int:
    """Close every started, not yet stopped sandbox of ``scope``.

    ``scope`` defaults to the current context's (:func:`env_scope`: inside a run, the
    run's sandboxes only), and outside any scope to every sandbox of this process.
    For shutdown: cancelled episodes close their sandboxes themselves, but a task
    cancelled again while closing (as anyio's cancel scopes do) stops waiting
    before the sandbox is gone. This waits for every pending close, whatever
    cancels the caller meanwhile, and returns how many sandboxes it waited for.
    """
    scope = scope if scope is not None else _SCOPE.get()
    return await (scope.close() if scope is not None else _close_all(_OPEN))


async def _close_all(open_envs: set[AgentEnv]) -> int:
    count = 0
    while open_envs:  # a close may race a start that registers a new sandbox
        envs = list(open_envs)
        count += len(envs)
        await wait_through_cancellation(
            asyncio.gather(*(env.close() for env in envs), return_exceptions=True)
        )
        open_envs.difference_update(envs)
    return count
