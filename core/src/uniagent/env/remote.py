"""The ``remote`` deployment: an already running ``swerex-remote`` server.

SWE-ReX's ``RemoteRuntime`` is used with three fixes (SWE-ReX 1.4.0): requests
are retried when the connection cannot be made
(with SWE-ReX's own ``X-Request-ID`` idempotency key), the HTTP timeout of a
command is its action timeout plus a margin instead of aiohttp's 300 s total,
and a directory upload is zipped on a worker thread, not on the event loop.
``swe-rex`` and ``aiohttp`` come with ``pip install 'uniagent[swerex]'``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
import shutil
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from uniagent.env.config import renamed_keys
from uniagent.env.errors import EnvError, EnvStartError

log = logging.getLogger(__name__)

SWEREX_HINT = (
    "install the SWE-ReX extra: pip install 'uniagent[swerex]' (swe-rex==1.4.0 and aiohttp)"
)
#: Endpoints that may be repeated after the connection broke mid-request.
_IDEMPOTENT = frozenset({"is_alive", "read_file", "write_file", "close_session", "close"})


class RemoteDeploymentConfig(BaseModel):
    """An already running ``swerex-remote --auth-token TOKEN`` server."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any) -> Any:
        renames = {"startup_timeout": "server_start_timeout"}
        return renamed_keys(data, renames, "env.deployment", kind="remote")

    type: Literal["remote"] = "remote"
    host: str = Field(
        "http://127.0.0.1", description="URL of the server (http:// is added if missing)"
    )
    port: int | None = Field(None, description="port, unless part of host")
    auth_token: str = Field("", description="the server's --auth-token")
    server_start_timeout: float = Field(
        60.0, gt=0, description="seconds to wait for the server to answer"
    )
    request_timeout: float = Field(
        120.0, gt=0, description="HTTP timeout of calls other than commands"
    )
    request_margin: float = Field(
        60.0, ge=0, description="added to a command's timeout to get its HTTP timeout"
    )
    retries: int = Field(3, ge=0, description="retries of a request whose connection failed")


def _import_swerex() -> Any:
    try:
        import aiohttp  # noqa: F401
        from swerex.runtime.remote import RemoteRuntime
    except ImportError as exc:
        raise EnvStartError(f"this deployment needs SWE-ReX ({exc}); {SWEREX_HINT}") from exc
    return RemoteRuntime


@functools.lru_cache(maxsize=1)
def retrying_runtime_class() -> type:
    """SWE-ReX's ``RemoteRuntime`` with retries and per-request timeouts (imported lazily)."""
    base = _import_swerex()  # first: a missing extra gets the install hint
    import aiohttp
    from swerex.exceptions import SwerexException
    from swerex.runtime.abstract import UploadResponse

    class RetryingRemoteRuntime(base):  # type: ignore[misc, valid-type]
        """``RemoteRuntime`` that retries failed connections and sizes HTTP timeouts per call."""

        def __init__(
            self,
            *,
            retries: int = 3,
            request_timeout: float = 120.0,
            request_margin: float = 60.0,
            **kwargs: Any,
        ) -> None:
            super().__init__(logger=log, **kwargs)
            self.retries = retries
            self.request_timeout = request_timeout
            self.request_margin = request_margin

        def _http_timeout(self, payload: Any) -> aiohttp.ClientTimeout:
            seconds = getattr(payload, "timeout", None)
            if isinstance(seconds, (int, float)):
                return aiohttp.ClientTimeout(total=seconds + self.request_margin)
            if payload is not None and hasattr(payload, "command") and seconds is None:
                return aiohttp.ClientTimeout(total=None)  # a command without timeout
            return aiohttp.ClientTimeout(total=self.request_timeout)

        async def _post(self, endpoint: str, timeout: aiohttp.ClientTimeout, send: Any) -> Any:
            # One X-Request-ID for all tries: the server answers a repeat from its cache.
            headers = {**self._headers, "X-Request-ID": str(uuid.uuid4())}
            delay = 0.1
            for attempt in range(self.retries + 1):
                try:
                    connector = aiohttp.TCPConnector(force_close=True)
                    async with aiohttp.ClientSession(
                        connector=connector, timeout=timeout
                    ) as session:
                        return await send(session, f"{self._api_url}/{endpoint}", headers)
                except aiohttp.ClientConnectionError as exc:
                    retry = isinstance(exc, aiohttp.ClientConnectorError) or endpoint in _IDEMPOTENT
                    if not retry or attempt == self.retries:
                        raise
                    log.info("%s to %s failed (%s); retrying", endpoint, self._api_url, exc)
                await asyncio.sleep(delay + random.uniform(0, delay))
                delay = min(delay * 2, 5.0)
            raise AssertionError("unreachable")

        async def _request(
            self, endpoint: str, payload: Any, output_class: Any, num_retries: int = 0
        ) -> Any:
            async def send(
                session: aiohttp.ClientSession, url: str, headers: dict[str, str]
            ) -> Any:
                body = payload.model_dump() if payload is not None else None
                async with session.post(url, json=body, headers=headers) as resp:
                    await self._handle_response_errors(resp)
                    return output_class(**await resp.json())

            return await self._post(endpoint, self._http_timeout(payload), send)

        async def upload(self, request: Any) -> Any:
            source = Path(request.source_path).resolve()
            if not source.exists():
                raise EnvError(f"cannot upload {str(source)!r}: no such file or directory")
            with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as tmp:
                if source.is_dir():  # zipping can take a while: not on the event loop
                    archive = await asyncio.to_thread(
                        shutil.make_archive, str(Path(tmp) / "upload"), "zip", source
                    )
                    path, unzip = Path(archive), "true"
                else:
                    path, unzip = source, "false"

                async def send(
                    session: aiohttp.ClientSession, url: str, headers: dict[str, str]
                ) -> Any:
                    with open(path, "rb") as f:
                        data = aiohttp.FormData()
                        data.add_field("file", f, filename=path.name)
                        data.add_field("target_path", request.target_path)
                        data.add_field("unzip", unzip)
                        async with session.post(url, data=data, headers=headers) as resp:
                            await self._handle_response_errors(resp)
                            return UploadResponse(**(await resp.json()))

                timeout = aiohttp.ClientTimeout(total=self.request_timeout)
                return await self._post("upload", timeout, send)

        def _handle_transfer_exception(self, exc_transfer: Any) -> None:
            # Upstream prints the class path to stdout on every remote error; re-raise quietly.
            module_name, _, name = exc_transfer.class_path.rpartition(".")
            try:
                module = sys.modules.get(module_name) or __import__(module_name, fromlist=[name])
                exc = getattr(module, name)(exc_transfer.message)
            except Exception:
                exc = SwerexException(exc_transfer.message)
            exc.extra_info = exc_transfer.extra_info
            raise exc from None

    return RetryingRemoteRuntime


def make_runtime(
    *,
    host: str,
    port: int | None,
    auth_token: str,
    retries: int = 3,
    request_timeout: float = 120.0,
    request_margin: float = 60.0,
) -> Any:
    """A :func:`retrying_runtime_class` instance for ``host:port``."""
    cls = retrying_runtime_class()
    if not host.startswith(("http://", "https://")):
        host = f"http://{host}"
    return cls(
        host=host,
        port=port,
        auth_token=auth_token,
        timeout=10.0,
        retries=retries,
        request_timeout=request_timeout,
        request_margin=request_margin,
    )


async def wait_until_alive(runtime: Any, timeout: float, what: str, *, died: Any = None) -> None:
    """Poll ``runtime.is_alive`` with ``asyncio.sleep`` until it answers or ``timeout`` passes."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    last = "no answer yet"
    while True:
        response = await runtime.is_alive(timeout=min(5.0, max(0.5, timeout / 10)))
        if response:
            return
        last = getattr(response, "message", "") or last
        if died is not None and (reason := died()):
            raise EnvStartError(f"{what} stopped while starting: {reason}")
        if loop.time() >= deadline:
            raise EnvStartError(
                f"{what} did not answer within {timeout:g} s; last answer: {last.strip()[-2000:]}"
            )
        await asyncio.sleep(0.25)


class RemoteDeployment:
    """Connects to a running ``swerex-remote``; ``stop()`` closes our session, not the server."""

    def __init__(self, config: RemoteDeploymentConfig) -> None:
        self.config = config
        self._runtime: Any = None

    async def start(self) -> None:
        """Make the runtime and wait until the server answers."""
        c = self.config
        self._runtime = make_runtime(
            host=c.host,
            port=c.port,
            auth_token=c.auth_token,
            retries=c.retries,
            request_timeout=c.request_timeout,
            request_margin=c.request_margin,
        )
        where = self._runtime._api_url
        await wait_until_alive(
            self._runtime, c.server_start_timeout, f"the swerex-remote server at {where}"
        )

    async def stop(self) -> None:
        """Close the episode's session on the server (the server keeps running)."""
        runtime, self._runtime = self._runtime, None
        if runtime is None:
            return
        from uniagent.env.runtime import CloseBashSessionRequest

        try:
            await runtime.close_session(CloseBashSessionRequest(session="default"))
        except Exception as exc:
            log.debug("closing the remote session: %s", exc)

    @property
    def runtime(self) -> Any:
        """The SWE-ReX runtime (after :meth:`start`)."""
        if self._runtime is None:
            raise EnvError("the remote deployment is not started; await start() first")
        return self._runtime

    async def is_alive(self) -> bool:
        """Whether the server answers."""
        if self._runtime is None:
            return False
        return bool(await self._runtime.is_alive(timeout=self.config.request_timeout))

    async def sandbox_alive(self) -> bool:
        """Whether the server answers (the agent's shell may be gone)."""
        return await self.is_alive()

    async def kill_processes(self) -> None:
        """Only the episode's session ends: the server may serve others, so nothing else is
        killed (processes the agent detached survive; see docs/sandboxes.md)."""
        from uniagent.env.runtime import CloseBashSessionRequest

        if self._runtime is not None:
            with contextlib.suppress(Exception):
                await self._runtime.close_session(CloseBashSessionRequest(session="default"))

    @property
    def workdir(self) -> str | None:
        """None: the server's working directory (set ``workdir`` in the env settings)."""
        return None

    @property
    def tools_dir(self) -> str | None:
        """None: ``/usr/local/uniagent/tools`` unless the env settings say otherwise."""
        return None
