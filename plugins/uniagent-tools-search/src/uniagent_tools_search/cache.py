"""The service's result cache: an LRU with expiry (cachetools) plus single flight.

Identical requests that arrive while the first is still being answered wait for that
answer instead of each asking the backend (a burst of agents asking the same question
costs one BM25 query or one upstream request).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from cachetools import TTLCache


@dataclass
class CacheStats:
    """Counters reported by ``GET /health``."""

    hits: int = 0
    misses: int = 0
    shared: int = 0


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()  # mark it retrieved: no warning when nobody else waited


class ResultCache:
    """``await cache.get(key, compute)`` returns ``(value, from_cache)``."""

    def __init__(self, size: int, ttl: float) -> None:
        self._store: TTLCache[str, Any] | None = TTLCache(size, ttl) if size else None
        self._inflight: dict[str, asyncio.Future[Any]] = {}
        self.stats = CacheStats()

    def __len__(self) -> int:
        return len(self._store) if self._store is not None else 0

    async def get(self, key: str, compute: Callable[[], Awaitable[Any]]) -> tuple[Any, bool]:
        """The cached value, the value of an identical request in flight, or a fresh one."""
        if self._store is not None and key in self._store:
            self.stats.hits += 1
            return self._store[key], True
        pending = self._inflight.get(key)
        if pending is not None:
            self.stats.shared += 1
            return await asyncio.shield(pending), True
        self.stats.misses += 1
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        future.add_done_callback(_retrieve)
        self._inflight[key] = future
        try:
            value = await compute()
        except asyncio.CancelledError:
            future.cancel()
            raise
        except BaseException as exc:
            future.set_exception(exc)  # failures are shared, never cached
            raise
        finally:
            self._inflight.pop(key, None)
        if self._store is not None:
            self._store[key] = value
        future.set_result(value)
        return value, False
