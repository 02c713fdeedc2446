"""A host-side client of the service (``unix:///path`` or ``http://127.0.0.1:PORT`` URLs).

The sandbox uses its own standard-library client (``scripts/search``); this one serves
the CLI, the service's start-up check, tests and benchmarks.
"""

from __future__ import annotations

from types import TracebackType
from typing import TYPE_CHECKING, Any

import aiohttp

from uniagent_tools_search.errors import SearchError

if TYPE_CHECKING:  # pragma: no cover
    from typing_extensions import Self


class ServiceError(SearchError):
    """The service answered with an error (``status`` and ``kind`` from its JSON)."""

    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(f"HTTP {status} {kind}: {message}")
        self.status = status
        self.kind = kind
        self.message = message


def split_url(url: str) -> tuple[str | None, str]:
    """``(unix socket path or None, HTTP base URL)`` of a service URL."""
    if url.startswith("unix://"):
        path = url[len("unix://") :]
        if not path.startswith("/"):
            raise SearchError(f"{url!r}: a unix:// URL needs an absolute path (unix:///run/x.sock)")
        return path, "http://localhost"
    if url.startswith(("http://", "https://")):
        return None, url.rstrip("/")
    raise SearchError(f"{url!r} is not a service URL (unix:///PATH or http://HOST:PORT)")


class SearchClient:
    """``async with SearchClient(url) as client: await client.search("...")``."""

    def __init__(self, url: str, *, timeout: float = 60.0, connections: int = 256) -> None:
        self.url = url
        socket_path, self.base = split_url(url)
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._socket_path = socket_path
        self._connections = connections
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Self:
        connector: aiohttp.BaseConnector
        if self._socket_path:
            connector = aiohttp.UnixConnector(path=self._socket_path, limit=self._connections)
        else:
            connector = aiohttp.TCPConnector(limit=self._connections)
        self._session = aiohttp.ClientSession(connector=connector, timeout=self._timeout)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._session is not None:
            await self._session.close()

    async def _call(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        if self._session is None:
            raise RuntimeError("use the client as `async with SearchClient(url) as client`")
        async with self._session.request(method, self.base + path, json=body) as response:
            data = await response.json(content_type=None)
            if response.status >= 400:
                error = (data or {}).get("error") or {}
                raise ServiceError(
                    response.status, error.get("type", "error"), error.get("message", str(data))
                )
            return data

    async def health(self) -> dict[str, Any]:
        """``GET /health``."""
        return await self._call("GET", "/health")

    async def search(self, query: str, top_k: int = 5, **filters: Any) -> dict[str, Any]:
        """``POST /search`` (filters: backend, category, date_from, date_to)."""
        body = {"query": query, "top_k": top_k, **{k: v for k, v in filters.items() if v}}
        return await self._call("POST", "/search", body)

    async def fetch(self, doc_id: str, offset: int = 0, max_chars: int | None = None) -> dict:
        """``POST /fetch``."""
        body: dict[str, Any] = {"id": doc_id, "offset": offset}
        if max_chars:
            body["max_chars"] = max_chars
        return await self._call("POST", "/fetch", body)
