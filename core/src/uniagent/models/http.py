"""The HTTP client of the OpenAI-compatible backends: JSON over aiohttp, errors by status.

uniagent posts chat-completions bodies it builds itself and reads the replies as plain
JSON, so a typed SDK adds only cost: the official ``openai`` client took about 1.1 ms of
CPU per request here (its request options, headers and the httpx stack) and 0.8 s to
import; this one about 0.25 ms and 0.2 s (``bench/run.py``'s episodes make six requests
each). What the SDK gave is kept: one keep-alive connection pool shared by a model's
copies (no limit on connections: a thousand episodes may wait on one server),
``Authorization: Bearer <key>`` (or Basic from credentials in the URL, as httpx does),
the proxy the environment names (``HTTP_PROXY``, ``HTTPS_PROXY``, ``NO_PROXY``), and the
SDK's error classes by status (:class:`BadRequestError` 400, :class:`AuthenticationError`
401, ... :class:`InternalServerError` 5xx; :class:`APIConnectionError` and
:class:`APITimeoutError` when there is no answer), the error body's ``error`` object as
``body``, with its ``code``.

A session belongs to the event loop it was made in: a client used from another loop
(a new ``asyncio.run``) makes a new one there.
"""

from __future__ import annotations

import asyncio
import base64
import json
import urllib.request
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit


class APIError(Exception):
    """A request to the model server failed."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class APIConnectionError(APIError):
    """The server could not be reached, or the connection broke (retryable)."""


class APITimeoutError(APIConnectionError):
    """No whole answer within the client's timeout (retryable)."""


class APIStatusError(APIError):
    """The server answered with an error status (4xx, 5xx)."""

    def __init__(
        self, message: str, *, status_code: int, body: Any, headers: Mapping[str, str]
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        #: The error body's ``error`` object (or the whole body, or its text).
        self.body = body
        self.code = body.get("code") if isinstance(body, Mapping) else None
        self.headers = dict(headers)


class BadRequestError(APIStatusError):
    """400."""


class AuthenticationError(APIStatusError):
    """401."""


class PermissionDeniedError(APIStatusError):
    """403."""


class NotFoundError(APIStatusError):
    """404."""


class ConflictError(APIStatusError):
    """409."""


class UnprocessableEntityError(APIStatusError):
    """422."""


class RateLimitError(APIStatusError):
    """429."""


class InternalServerError(APIStatusError):
    """5xx."""


_BY_STATUS: dict[int, type[APIStatusError]] = {
    400: BadRequestError,
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: NotFoundError,
    409: ConflictError,
    422: UnprocessableEntityError,
    429: RateLimitError,
}


def status_error(status: int, raw: bytes, headers: Mapping[str, str]) -> APIStatusError:
    """The error for an answer with ``status`` and body ``raw``."""
    text = raw.decode("utf-8", "replace").strip()
    body: Any = text
    try:
        body = json.loads(text)
        message = f"Error code: {status} - {body}"
    except ValueError:
        message = text or f"Error code: {status}"
    if isinstance(body, Mapping):
        body = body.get("error", body)
    kind = _BY_STATUS.get(status) or (InternalServerError if status >= 500 else APIStatusError)
    return kind(message, status_code=status, body=body, headers=headers)


def _env_proxy(scheme: str, host: str) -> str | None:
    """The proxy the environment names for ``scheme://host``, unless NO_PROXY exempts it."""
    proxies = urllib.request.getproxies_environment()
    proxy = proxies.get(scheme.lower())
    if not proxy or urllib.request.proxy_bypass(host):
        return None
    return proxy


class JSONClient:
    """POST and GET JSON to one base URL through a keep-alive aiohttp session."""

    def __init__(self, base_url: str, api_key: str, *, timeout: float = 600.0) -> None:
        from uniagent import __version__

        parts = urlsplit(base_url)
        host = parts.netloc.rpartition("@")[2]  # host[:port], an IPv6 address in brackets
        self._base = urlunsplit((parts.scheme, host, parts.path.rstrip("/"), "", ""))
        self._query = parts.query
        self._headers = {
            "Content-Type": "application/json",
            "Accept": "application/json",
            "User-Agent": f"uniagent/{__version__}",
        }
        if parts.username is not None or parts.password is not None:
            # Credentials in the URL are sent as Basic authentication (httpx does so too).
            pair = f"{unquote(parts.username or '')}:{unquote(parts.password or '')}"
            self._headers["Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode()
        else:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self.timeout = timeout
        # The environment's proxy for this URL (HTTP(S)_PROXY, NO_PROXY), looked up once:
        # aiohttp's trust_env looks it up (and reads ~/.netrc) at every request, which
        # costs more than the request itself.
        self._proxy = _env_proxy(parts.scheme, parts.hostname or "")
        self._session: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _url(self, path: str) -> str:
        return self._base + path + (f"?{self._query}" if self._query else "")

    def _live_session(self) -> Any:
        import aiohttp

        loop = asyncio.get_running_loop()
        if self._session is None or self._loop is not loop or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0),
                timeout=aiohttp.ClientTimeout(total=self.timeout),
                headers=self._headers,
            )
            self._loop = loop
        return self._session

    async def request(self, method: str, path: str, body: Any = None) -> bytes:
        """The answer's body for a 2xx status; else :class:`APIStatusError`, or
        :class:`APIConnectionError` when there was no answer."""
        import aiohttp

        session = self._live_session()
        data = None if body is None else json.dumps(body, ensure_ascii=False).encode()
        try:
            async with session.request(
                method, self._url(path), data=data, proxy=self._proxy
            ) as response:
                raw = await response.read()
                status, headers = response.status, response.headers
        except asyncio.TimeoutError as exc:
            raise APITimeoutError(f"Request timed out (after {self.timeout:g} s)") from exc
        except aiohttp.ClientError as exc:
            raise APIConnectionError(f"Connection error: {exc or type(exc).__name__}") from exc
        if status >= 400:
            raise status_error(status, raw, headers)
        return bytes(raw)

    async def post(self, path: str, body: Mapping[str, Any]) -> bytes:
        """POST ``body`` as JSON to ``path``; the answer's bytes."""
        return await self.request("POST", path, body)

    async def models(self) -> list[dict[str, Any]]:
        """``GET /models``: the listed models (their ``data``; none from an answer that is
        not a model list)."""
        try:
            listed = json.loads(await self.request("GET", "/models"))
        except ValueError:
            return []
        data = listed.get("data") if isinstance(listed, Mapping) else None
        return [dict(entry) for entry in data or () if isinstance(entry, Mapping)]

    async def close(self) -> None:
        """Close the session (a session of a loop that has ended is dropped)."""
        session, self._session = self._session, None
        if session is None or session.closed:
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:  # pragma: no cover - close() is awaited
            running = None
        if running is self._loop:
            await session.close()
        else:  # made in another loop (now gone): its connections went with it
            session.detach()
