"""Starting and stopping the search service for a run (the ``search`` ServiceSpec).

``start_search_service(settings)`` runs ``uniagent-search serve`` as a child process and
returns once it listens (it prints one JSON "ready" line; no polling). The child dies
with its parent (``PR_SET_PDEATHSIG``), so a killed run or training worker leaves no
server behind. Processes on one machine that share a Unix socket path share one
server: under a lock beside the socket, a process that finds a live server there
attaches to it (and never stops it) instead of starting a second one — several verl
workers or Ray actors of one node then use one index in memory.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import IO, Any

import aiohttp

from uniagent_tools_search.client import SearchClient
from uniagent_tools_search.config import SearchServiceConfig
from uniagent_tools_search.errors import SearchError
from uniagent_tools_search.server import prepare_socket_dir, settings_digest

log = logging.getLogger(__name__)
_STOP_TIMEOUT_S = 10.0


class SearchServiceProcess:
    """A running service: its addresses and, when this process started it, the child."""

    def __init__(self, addresses: dict[str, Any], proc: subprocess.Popen[bytes] | None) -> None:
        self.addresses = addresses
        self.proc = proc

    @property
    def url(self) -> str:
        """Where tools reach it (``unix://...`` when it has a socket, else ``http://...``)."""
        return str(self.addresses["url"])

    @property
    def owned(self) -> bool:
        """Whether this process started it (and so stops it)."""
        return self.proc is not None

    async def stop(self) -> None:
        """Stop the child (SIGTERM, then SIGKILL); an attached service is left running."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.stdout is not None:
            proc.stdout.close()
        if proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.to_thread(proc.wait, _STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            await asyncio.to_thread(proc.wait)


def _lock(socket_path: Path | None) -> IO[str] | None:
    """Hold the lock beside the socket (blocking: run on a thread)."""
    if socket_path is None:
        return None
    prepare_socket_dir(socket_path)
    handle = open(socket_path.with_name(socket_path.name + ".lock"), "a+")  # noqa: SIM115
    fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
    return handle


async def _live(url: str) -> dict[str, Any] | None:
    try:
        async with SearchClient(url, timeout=10) as client:
            return await client.health()
    except (SearchError, aiohttp.ClientError, OSError, TimeoutError, ValueError):
        return None


def serve_command(settings: SearchServiceConfig) -> list[str]:
    """The child's command line: this interpreter, the settings as JSON, our pid."""
    return [
        sys.executable,
        "-m",
        "uniagent_tools_search.cli",
        "serve",
        "--config-json",
        settings.model_dump_json(),
        "--parent-pid",
        str(os.getpid()),
    ]


async def start_search_service(settings: SearchServiceConfig) -> SearchServiceProcess:
    """Start (or attach to) the service described by ``settings``; see the module doc."""
    socket_path = Path(settings.unix_socket) if settings.unix_socket else None
    lock = await asyncio.to_thread(_lock, socket_path)
    try:
        if socket_path is not None and socket_path.exists():
            health = await _live(f"unix://{socket_path}")
            if health is not None and health.get("settings") != settings_digest(settings):
                raise SearchError(
                    f"a search service with other settings (another index or backends) already "
                    f"listens on {socket_path} (pid {health.get('pid')}); give this run another "
                    "unix_socket"
                )
            if health is not None:
                log.info("attaching to the search service already at %s", socket_path)
                return SearchServiceProcess(
                    {"url": f"unix://{socket_path}", "pid": health.get("pid")}, None
                )
        return await _spawn(settings)
    finally:
        if lock is not None:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)
            lock.close()


def _popen(settings: SearchServiceConfig) -> tuple[subprocess.Popen[bytes], IO[bytes]]:
    """The child and the file its stderr goes to (the log file, else a temporary one)."""
    log_target: IO[bytes] = (
        open(settings.log_file, "ab")  # noqa: SIM115 - the child's stderr, closed by _spawn
        if settings.log_file
        else tempfile.TemporaryFile()  # noqa: SIM115 - the same
    )
    try:
        proc = subprocess.Popen(
            serve_command(settings),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=log_target,
            start_new_session=True,  # Ctrl-C of the run reaches the run, which stops us
        )
    except BaseException:
        log_target.close()
        raise
    return proc, log_target


async def _spawn(settings: SearchServiceConfig) -> SearchServiceProcess:
    # Forked from the event loop's thread: PR_SET_PDEATHSIG fires when the thread that
    # forked dies, and the loop's thread lives as long as the run.
    proc, log_target = _popen(settings)
    try:
        assert proc.stdout is not None
        try:
            line = await asyncio.wait_for(
                asyncio.to_thread(proc.stdout.readline), settings.startup_timeout
            )
        except asyncio.TimeoutError:
            proc.kill()
            await asyncio.to_thread(proc.wait)
            raise SearchError(
                f"the search service did not start within {settings.startup_timeout:g} s "
                "(startup_timeout); a large index takes longer to load"
            ) from None
        try:
            ready = json.loads(line)
            assert ready.get("event") == "ready"
        except (ValueError, AssertionError, AttributeError):
            await asyncio.to_thread(proc.wait)
            detail = _tail(log_target, settings.log_file)
            raise SearchError(
                f"the search service exited (status {proc.returncode}) before it was ready:\n"
                f"{detail}"
            ) from None
        log.info("search service %s started at %s", proc.pid, ready["url"])
        return SearchServiceProcess(ready, proc)
    finally:
        log_target.close()


def _tail(handle: IO[bytes], path: str | None) -> str:
    try:
        if path:
            data = Path(path).read_bytes()
        else:
            handle.seek(0)
            data = handle.read()
    except OSError:
        return "(no log)"
    return data.decode("utf-8", "replace").strip()[-3000:] or "(no output)"
