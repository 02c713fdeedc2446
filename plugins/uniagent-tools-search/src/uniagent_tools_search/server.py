"""The retrieval service: an aiohttp server on a Unix socket and/or 127.0.0.1.

API (JSON in, JSON out; documented in the plugin's README):

- ``GET /health``: ``{"status": "ok", "backends": {...}, "default_backend", "cache", ...}``
- ``POST /search`` ``{"query", "top_k"?, "backend"?, "category"?, "date_from"?,
  "date_to"?}``: ``{"backend", "query", "results": [{id, title, snippet, url, score,
  metadata}], "cached"}``
- ``POST /fetch`` ``{"id", "offset"?, "max_chars"?}``: ``{"id", "title", "url", "text",
  "offset", "total_chars", "next_offset"}`` (local corpus)

Errors are ``{"error": {"type", "message"}}`` with status 400 (bad request), 404 (no
such document or backend), 502 (the upstream API failed) or 503 (not configured).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import logging
import os
import signal
import socket
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from uniagent_tools_search.backends import Backend, SearchQuery
from uniagent_tools_search.cache import ResultCache
from uniagent_tools_search.config import SearchServiceConfig
from uniagent_tools_search.errors import BackendError, SearchError

log = logging.getLogger(__name__)
MAX_QUERY_CHARS = 2000
MAX_TOP_K = 50


class SearchBody(BaseModel):
    """The body of ``POST /search``."""

    model_config = ConfigDict(extra="forbid")

    query: str = Field(min_length=1, max_length=MAX_QUERY_CHARS)
    top_k: int = Field(5, ge=1, le=MAX_TOP_K)
    backend: Literal["local", "web", "arxiv"] | None = None
    category: str | None = Field(None, max_length=40)
    date_from: dt.date | None = None
    date_to: dt.date | None = None

    @field_validator("query")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("the query is empty")
        return value.strip()


class FetchBody(BaseModel):
    """The body of ``POST /fetch``."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(min_length=1, max_length=1000)
    offset: int = Field(0, ge=0)
    max_chars: int | None = Field(None, ge=1)


def _error(status: int, kind: str, message: str) -> web.Response:
    return web.json_response({"error": {"type": kind, "message": message}}, status=status)


def _invalid(exc: ValidationError) -> web.Response:
    problems = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "body"
        problems.append(
            f"{where}: {'unknown key' if err['type'] == 'extra_forbidden' else err['msg']}"
        )
    return _error(400, "bad_request", "; ".join(problems))


def build_backends(config: SearchServiceConfig) -> dict[str, Backend]:
    """The configured backends, loaded (the local index is read here)."""
    backends: dict[str, Backend] = {}
    if config.index:
        from uniagent_tools_search.backends.local import LocalBackend

        backends["local"] = LocalBackend(
            config.index, threads=config.threads, snippet_chars=config.snippet_chars
        )
    if config.web:
        from uniagent_tools_search.backends.web import WebBackend

        backends["web"] = WebBackend(config.web, snippet_chars=config.snippet_chars)
    if config.arxiv:
        from uniagent_tools_search.backends.arxiv import ArxivBackend

        backends["arxiv"] = ArxivBackend(config.arxiv, snippet_chars=config.snippet_chars)
    return backends


class SearchService:
    """The request handlers over a set of backends and one result cache."""

    def __init__(self, config: SearchServiceConfig, backends: dict[str, Backend]) -> None:
        self.config = config
        self.backends = backends
        self.cache = ResultCache(config.cache_size, config.cache_ttl)
        self.started = time.time()
        self.requests = 0
        self.errors = 0

    def app(self) -> web.Application:
        """The aiohttp application."""
        app = web.Application(client_max_size=64 * 1024, middlewares=[self._errors])
        app.router.add_get("/health", self.health)
        app.router.add_post("/search", self.search)
        app.router.add_post("/fetch", self.fetch)
        app.on_cleanup.append(self._close)
        return app

    @web.middleware
    async def _errors(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """Count requests; bad bodies and backend failures become JSON errors."""
        self.requests += 1
        try:
            return await handler(request)
        except ValidationError as exc:
            self.errors += 1
            return _invalid(exc)
        except BackendError as exc:
            self.errors += 1
            return _error(exc.status, exc.kind, str(exc))

    async def _close(self, _app: web.Application) -> None:
        for backend in self.backends.values():
            await backend.close()

    async def _body(self, request: web.Request) -> Any:
        try:
            return await request.json()
        except (ValueError, UnicodeDecodeError):
            raise BackendError("the request body is not JSON", status=400, kind="bad_request")

    async def health(self, _request: web.Request) -> web.Response:
        """Liveness and what the service serves."""
        return web.json_response(
            {
                "status": "ok",
                "pid": os.getpid(),
                "backends": {name: b.describe() for name, b in self.backends.items()},
                "default_backend": self.config.search_backend(),
                "settings": settings_digest(self.config),
                "cache": {"entries": len(self.cache), **vars(self.cache.stats)},
                "requests": self.requests,
                "errors": self.errors,
                "uptime_s": round(time.time() - self.started, 1),
            }
        )

    def _backend(self, name: str | None) -> Backend:
        name = name or self.config.search_backend()
        backend = self.backends.get(name or "")
        if backend is None:
            raise BackendError(
                f"the {name} backend is not configured on this service (it serves: "
                f"{', '.join(sorted(self.backends)) or 'nothing'})",
                status=503,
                kind="not_configured",
            )
        return backend

    async def search(self, request: web.Request) -> web.Response:
        """``POST /search``."""
        body = SearchBody.model_validate(await self._body(request))
        backend = self._backend(body.backend)
        query = SearchQuery(body.query, body.top_k, body.category, body.date_from, body.date_to)
        results, cached = await self.cache.get(
            query.cache_key(backend.name), lambda: backend.search(query)
        )
        return web.json_response(
            {
                "backend": backend.name,
                "query": body.query,
                "results": [r.to_json() for r in results],
                "cached": cached,
            }
        )

    async def fetch(self, request: web.Request) -> web.Response:
        """``POST /fetch``: a slice of a local document."""
        body = FetchBody.model_validate(await self._body(request))
        backend = self.backends.get("local")
        if backend is None:
            raise BackendError(
                "fetch needs the local corpus, which this service does not serve",
                status=503,
                kind="not_configured",
            )
        doc = await backend.fetch(body.id)
        limit = min(body.max_chars or self.config.max_fetch_chars, self.config.max_fetch_chars)
        text = doc.text[body.offset : body.offset + limit]
        end = body.offset + len(text)
        return web.json_response(
            {
                "id": doc.id,
                "title": doc.title,
                "url": doc.url,
                "text": text,
                "offset": body.offset,
                "total_chars": len(doc.text),
                "next_offset": end if end < len(doc.text) else None,
            }
        )


def prepare_socket_dir(path: Path, group: int | None = None) -> None:
    """Create the socket's directory (0700; 0710 of ``group``) or check that it is ours and
    private, then let ``group`` (the sandboxes' gid) through it."""
    folder = path.parent
    if not folder.exists():
        folder.mkdir(mode=0o700, parents=True)
    else:
        info = folder.stat()
        if info.st_uid != os.getuid() or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise SearchError(
                f"{folder} (the Unix socket's directory) must belong to this user and not be "
                "writable by others, or someone else could put a socket there; pick another path"
            )
    if group is not None:
        os.chown(folder, -1, group)
        folder.chmod(stat.S_IMODE(folder.stat().st_mode) | stat.S_IXGRP)


def open_socket(path: Path, group: int | None) -> None:
    """The socket's mode once it exists: 0600, or 0660 of ``group``."""
    if group is None:
        path.chmod(0o600)
    else:
        os.chown(path, -1, group)
        path.chmod(0o660)


def remove_stale_socket(path: Path) -> None:
    """Remove a socket file nobody listens on; refuse to replace a live one."""
    if not path.exists() and not path.is_symlink():
        return
    if not stat.S_ISSOCK(path.lstat().st_mode):
        raise SearchError(f"{path} exists and is not a socket; remove it or pick another path")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError):
        path.unlink(missing_ok=True)  # left by a process that died
        return
    finally:
        probe.close()
    raise SearchError(f"another server already listens on {path}")


async def serve(
    config: SearchServiceConfig,
    on_ready: Callable[[dict[str, Any]], None],
    stop: asyncio.Event | None = None,
) -> None:
    """Load the backends, listen, call ``on_ready(addresses)``, serve until ``stop`` is set.

    Without ``stop``, SIGTERM and SIGINT end it.
    """
    backends = await asyncio.to_thread(build_backends, config)
    service = SearchService(config, backends)
    runner = web.AppRunner(service.app(), access_log=None, handle_signals=False)
    await runner.setup()
    if stop is None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(ValueError, RuntimeError):  # not the main thread
                loop.add_signal_handler(sig, stop.set)
    addresses: dict[str, Any] = {"pid": os.getpid()}
    socket_path = Path(config.unix_socket) if config.unix_socket else None
    try:
        if socket_path is not None:
            prepare_socket_dir(socket_path, config.socket_group)
            remove_stale_socket(socket_path)
            await web.UnixSite(runner, str(socket_path)).start()
            open_socket(socket_path, config.socket_group)
            addresses["unix_socket"] = str(socket_path)
            addresses["url"] = f"unix://{socket_path}"
        if config.port is not None:
            host = "127.0.0.1" if config.host == "localhost" else config.host
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            tcp = socket.socket(family, socket.SOCK_STREAM)
            tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            tcp.bind((host, config.port))
            await web.SockSite(runner, tcp).start()
            port = tcp.getsockname()[1]
            shown = f"[{host}]" if family == socket.AF_INET6 else host
            addresses["http_url"] = f"http://{shown}:{port}"
            addresses.setdefault("url", addresses["http_url"])
        on_ready(addresses)
        await stop.wait()
    finally:
        await runner.cleanup()
        if socket_path is not None:
            socket_path.unlink(missing_ok=True)


def settings_digest(config: SearchServiceConfig) -> str:
    """A fingerprint of the settings, so a run attaches only to a service like its own."""
    import hashlib

    return hashlib.sha256(config.model_dump_json().encode()).hexdigest()[:16]


def ready_line(addresses: dict[str, Any]) -> str:
    """What ``uniagent-search serve`` prints on stdout once it listens (one JSON line)."""
    return json.dumps({"event": "ready", **addresses})
