"""The HTTP client the remote backends share: one aiohttp session, errors as BackendError."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from uniagent_tools_search.errors import BackendError


class Upstream:
    """A lazily opened ``aiohttp`` session with a bound on requests in flight."""

    def __init__(self, name: str, *, timeout: float, max_concurrency: int) -> None:
        self.name = name
        self.timeout = aiohttp.ClientTimeout(total=timeout)
        self._limit = asyncio.Semaphore(max_concurrency)
        self._session: aiohttp.ClientSession | None = None

    def session(self) -> aiohttp.ClientSession:
        """The session (made on first use, inside the running loop)."""
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=self.timeout, headers={"User-Agent": "uniagent-tools-search/0.1"}
            )
        return self._session

    async def request(self, method: str, url: str, **kwargs: Any) -> tuple[int, bytes, str]:
        """Status, body and content type; connection failures and timeouts raise."""
        async with self._limit:
            try:
                async with self.session().request(method, url, **kwargs) as response:
                    body = await response.read()
                    return response.status, body, response.headers.get("Content-Type", "")
            except asyncio.TimeoutError:
                raise BackendError(
                    f"the {self.name} API did not answer within {self.timeout.total:g} s"
                ) from None
            except aiohttp.ClientError as exc:
                raise BackendError(
                    f"the {self.name} API is unreachable: {type(exc).__name__}: {exc}"
                ) from None

    async def close(self) -> None:
        """Close the session."""
        if self._session is not None:
            await self._session.close()
            self._session = None


def upstream_status_error(name: str, status: int, body: bytes) -> BackendError:
    """A BackendError for a non-2xx answer, with the start of the body."""
    text = body[:300].decode("utf-8", "replace").strip()
    retry = " (rate limited: retry later)" if status in (429, 503) else ""
    return BackendError(f"the {name} API answered HTTP {status}{retry}: {text}", status=502)
