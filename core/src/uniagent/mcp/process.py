"""Process-wide MCP servers (``scope: process``): one server and one session per process.

A stdio server with ``scope: process`` is started by the run's process, not in the
sandbox: once, the first time an episode needs it (:func:`ensure_mcp_server`), and
shared by every later episode of the process. This process keeps one MCP
``ClientSession`` to it and serves a Unix socket; the client helper in each sandbox
sends one JSON line to the socket (``{"op": "list"}`` or ``{"op": "call", "tool": ...,
"arguments": {...}}``) and reads one JSON line back (see :func:`_answer`). The socket's
directory is bound read-only into bubblewrap sandboxes (:func:`socket_dir`).

The servers and their sessions live on one daemon thread with its own event loop, so
episodes on any loop (``uniagent run``'s, a verl worker's) share them. A server that
dies is noticed by the call that fails (the answer says ``failed``: an infrastructure
error, see :meth:`McpProcess.failed`) or by the ping of the next episode's
:func:`ensure_mcp_server`, which then starts a new one. ``uniagent run`` stops them at
its end (:func:`close_mcp_servers`); a verl worker keeps them until it exits.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import json
import logging
import os
import tempfile
import threading
from pathlib import Path
from typing import Any

from uniagent.env.errors import EnvStartError
from uniagent.mcp.config import McpServerConfig

log = logging.getLogger(__name__)

#: The gid that bubblewrap sandboxes started by root run as (the host deployment's default).
SANDBOX_GID = 65534
_STDERR_TAIL = 2000
_START_TIMEOUT_S = 60.0
_STOP_TIMEOUT_S = 10.0


def socket_dir() -> Path:
    """This process's directory of MCP sockets (created: 0700, or 0710 group 65534 as root)."""
    path = Path(tempfile.gettempdir()) / f"uniagent-mcp-{os.getuid()}-{os.getpid()}"
    path.mkdir(mode=0o700, exist_ok=True)
    info = path.lstat()
    if info.st_uid != os.getuid() or not path.is_dir() or path.is_symlink():
        raise EnvStartError(f"{path} is not a directory of this user: refusing to use it")
    if os.geteuid() == 0:  # the sandbox's uid 65534 may enter it, nobody else
        os.chown(path, 0, SANDBOX_GID)
        path.chmod(0o710)
    else:
        path.chmod(0o700)
    return path


def socket_path(config: McpServerConfig) -> Path:
    """Where the server ``config`` is served (a name unique to its settings)."""
    digest = hashlib.sha256(config.model_dump_json().encode()).hexdigest()[:12]
    return socket_dir() / f"{config.name}-{digest}.sock"


class McpProcess:
    """One started server: its session, the socket it is served on, and whether it died."""

    def __init__(self, config: McpServerConfig) -> None:
        self.config = config
        self.socket = socket_path(config)
        self.session: Any = None
        #: Why the server is gone (``None`` while it is up).
        self.dead: str | None = None
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._errlog = tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace")  # noqa: SIM115

    def failed(self) -> str | None:
        """Why the server is gone, if it is (the host's word, not the sandbox's)."""
        return self.dead

    def stderr_tail(self) -> str:
        self._errlog.seek(0)
        return self._errlog.read()[-_STDERR_TAIL:].strip()

    async def start(self) -> None:
        """Start the server and serve its socket (on a task of its own, which keeps them)."""
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._task = asyncio.create_task(self._run(ready))
        try:
            await ready
        except BaseException as exc:
            tail = self.stderr_tail()
            await self.close()
            raise EnvStartError(
                f"MCP server {self.config.name!r} (scope: process) did not start: "
                f"{_describe(exc)}" + (f"\nits stderr, last lines:\n{tail}" if tail else "")
            ) from None
        log.info("MCP server %s started for this process on %s", self.config.name, self.socket)

    async def _run(self, ready: asyncio.Future[None]) -> None:
        from mcp import ClientSession
        from mcp.client.stdio import StdioServerParameters, stdio_client

        command = list(self.config.command)
        params = StdioServerParameters(
            command=command[0], args=command[1:], env=dict(self.config.env) or None
        )
        try:
            async with (
                stdio_client(params, errlog=self._errlog) as streams,
                ClientSession(streams[0], streams[1]) as session,
            ):
                await asyncio.wait_for(
                    session.initialize(), self.config.timeout or _START_TIMEOUT_S
                )
                self.socket.unlink(missing_ok=True)
                server = await asyncio.start_unix_server(self._serve, path=str(self.socket))
                try:
                    if os.geteuid() == 0:
                        os.chown(self.socket, 0, SANDBOX_GID)
                    self.socket.chmod(0o660)
                    self.session = session
                    ready.set_result(None)
                    await self._stop.wait()
                finally:
                    server.close()
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc)
            elif self.dead is None:
                self.dead = _describe(exc)
            if not isinstance(exc, Exception):
                raise
        finally:
            self.dead = self.dead or "stopped"
            if not ready.done():
                ready.set_exception(RuntimeError("the server's session ended"))

    async def alive(self) -> bool:
        """Whether the server still answers a ping (a dead one is marked so)."""
        if self.dead is not None:
            return False
        try:
            await asyncio.wait_for(self.session.send_ping(), self.config.timeout or 30.0)
        except Exception as exc:
            self.dead = f"it does not answer a ping: {_describe(exc)}"
            return False
        return True

    async def close(self) -> None:
        self.dead = self.dead or "stopped"
        self._stop.set()
        if self._task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._task), _STOP_TIMEOUT_S)
            except BaseException as exc:  # a crashed server's transport may complain on exit
                log.debug("closing MCP server %s: %s", self.config.name, _describe(exc))
        self.socket.unlink(missing_ok=True)
        self._errlog.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await reader.readline()
            try:
                request = json.loads(line)
                if not isinstance(request, dict):
                    raise ValueError("not an object")
            except ValueError as exc:
                answer: dict[str, Any] = {"refused": f"a request that is not JSON: {exc}"}
            else:
                answer = await self._answer(request)
            writer.write(json.dumps(answer, ensure_ascii=False).encode() + b"\n")
            await writer.drain()
        except (ConnectionError, OSError):  # the helper went away (interrupted)
            pass
        finally:
            writer.close()

    async def _answer(self, request: dict[str, Any]) -> dict[str, Any]:
        """One request's answer: ``tools``, ``text`` + ``is_error``, ``refused`` (the call
        was refused: the model's to fix), ``timeout``, or ``failed`` (the server is gone)."""
        from mcp.shared.exceptions import MCPError
        from mcp_types import CONNECTION_CLOSED

        from uniagent.mcp.helper import list_tools, result_text

        if self.dead is not None:
            return {"failed": f"the MCP server is gone: {self.dead}"}
        timeout = self.config.timeout
        try:
            if request.get("op") == "list":
                return {"tools": await list_tools(self.session, timeout)}
            if request.get("op") != "call" or not isinstance(request.get("arguments"), dict):
                return {"refused": "a request is {op: list} or {op: call, tool, arguments}"}
            tool = str(request.get("tool"))
            if not self.config.keeps(tool):  # the socket is the sandbox's: include/exclude hold
                return {"refused": f"the MCP server {self.config.name!r} gives no tool {tool!r}"}
            result = await asyncio.wait_for(
                self.session.call_tool(tool, request["arguments"]), timeout
            )
            return {"text": result_text(result), "is_error": bool(result.is_error)}
        except TimeoutError:
            return {"timeout": f"the MCP server did not answer within {timeout} s"}
        except MCPError as exc:
            if exc.error.code != CONNECTION_CLOSED:
                return {"refused": f"the MCP server refused the call: {exc}"}
            self.dead = f"its connection closed: {exc}"
        except Exception as exc:  # the session broke: the server is gone
            self.dead = _describe(exc)
        tail = self.stderr_tail()
        log.warning("MCP server %s failed: %s", self.config.name, self.dead)
        return {
            "failed": f"the MCP server failed: {self.dead}"
            + (f"\nits stderr, last lines:\n{tail}" if tail else "")
        }


def _describe(exc: BaseException) -> str:
    inner = getattr(exc, "exceptions", None)
    if inner:  # an anyio task group's exception group: the first real cause
        return _describe(inner[0])
    return f"{type(exc).__name__}: {exc}".rstrip(": ")


_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
#: settings (JSON) -> the server of this process (touched on the servers' loop only).
_servers: dict[str, McpProcess] = {}
_starting: dict[str, asyncio.Lock] = {}


def _service_loop() -> asyncio.AbstractEventLoop:
    global _loop
    with _lock:
        if _loop is None or _loop.is_closed():
            loop = asyncio.new_event_loop()
            threading.Thread(
                target=loop.run_forever, name="uniagent-mcp-servers", daemon=True
            ).start()
            _loop = loop
        return _loop


async def _on_service_loop(coro: Any) -> Any:
    future: concurrent.futures.Future[Any] = asyncio.run_coroutine_threadsafe(coro, _service_loop())
    return await asyncio.wrap_future(future)


async def _ensure(config: McpServerConfig) -> McpProcess:
    key = config.model_dump_json()
    async with _starting.setdefault(key, asyncio.Lock()):
        server = _servers.get(key)
        if server is not None:
            if await server.alive():
                return server
            log.warning("MCP server %s is gone (%s): starting it again", config.name, server.dead)
            _servers.pop(key, None)
            await server.close()
        server = McpProcess(config)
        await server.start()  # EnvStartError: the episode's env_error; the next one tries again
        _servers[key] = server
        return server


async def ensure_mcp_server(config: McpServerConfig) -> McpProcess:
    """The running server of ``config`` in this process, started (or restarted) if needed.

    Raises :class:`~uniagent.env.errors.EnvStartError` when it does not start.
    """
    server: McpProcess = await _on_service_loop(_ensure(config))
    return server


async def _close_all() -> None:
    servers = list(_servers.values())
    _servers.clear()
    for server in servers:
        await server.close()


async def close_mcp_servers() -> None:
    """Stop every process-wide MCP server this process started (the end of ``uniagent run``)."""
    with _lock:
        running = _loop is not None and not _loop.is_closed()
    if running:
        await _on_service_loop(_close_all())
