"""Serving the viewer: bind a local port, print the address, run uvicorn until Ctrl-C."""

from __future__ import annotations

import errno
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from uniagent.errors import ConfigError
from uniagent.view.security import is_loopback, is_wildcard

DEFAULT_PORT = 8765
_PORT_TRIES = 20  # with the default port taken, the next ones are tried


def bind(host: str, port: int | None) -> socket.socket:
    """A listening socket on ``host``: ``port``, or the first free one from the default."""
    candidates = [port] if port is not None else range(DEFAULT_PORT, DEFAULT_PORT + _PORT_TRIES)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    last: OSError | None = None
    for candidate in candidates:
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # Accepted connections inherit it: without, uvicorn on a socket it is handed answers
        # each keep-alive request 40 ms late (Nagle's algorithm meets delayed ACKs).
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            sock.bind((host, candidate))
        except OSError as exc:
            sock.close()
            last = exc
            if exc.errno == errno.EADDRINUSE:
                continue
            raise ConfigError(f"cannot listen on {host}:{candidate}: {exc.strerror}") from None
        sock.listen(128)
        sock.set_inheritable(True)
        return sock
    if port is not None:
        raise ConfigError(f"port {port} on {host} is in use; pass another --port (0: any free one)")
    raise ConfigError(
        f"ports {DEFAULT_PORT}-{DEFAULT_PORT + _PORT_TRIES - 1} on {host} are all in use ({last}); "
        "pass --port N (0: any free one)"
    )


def serve(
    paths: Sequence[Path],
    *,
    host: str = "127.0.0.1",
    port: int | None = None,
    tokenizer: str | None = None,
    poll_interval: float = 0.5,
    out: TextIO | None = None,
) -> None:
    """Index the run folders, then serve them until interrupted."""
    try:
        import uvicorn

        from uniagent.view.app import create_app
    except ImportError as exc:
        raise ConfigError(
            f"uniagent view needs its web server ({exc.name} is missing): "
            "pip install 'uniagent[view]'"
        ) from None
    from uniagent.view.catalog import Catalog
    from uniagent.view.rundir import NotFound

    out = out or sys.stdout
    if poll_interval <= 0:
        raise ConfigError("--poll must be a positive number of seconds")
    try:
        catalog = Catalog([Path(p) for p in paths])
    except NotFound as exc:
        raise ConfigError(str(exc)) from None
    runs = catalog.runs
    # The Host names answered follow from the address (see uniagent.view.security): a
    # web page elsewhere cannot read the runs through DNS rebinding.
    app = create_app(catalog, tokenizer=tokenizer, poll_interval=poll_interval, host=host)
    sock = bind(host, port)
    bound_port = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    total = sum(len(r.rows) for r in runs)
    names = ", ".join(r.name for r in runs[:5]) + (" ..." if len(runs) > 5 else "")
    print(f"uniagent view: {len(runs)} run(s), {total} episodes ({names})", file=out)
    if catalog.watched:
        folders = ", ".join(str(p) for p in catalog.watched)
        print(f"uniagent view: runs that start in {folders} appear as they start", file=out)
    if not is_loopback(host):
        where = "every address of this machine" if is_wildcard(host) else host
        print(
            f"uniagent view: listening on {where}: anyone who reaches it can read the runs",
            file=out,
        )
    print(
        f"uniagent view: serving http://{shown}:{bound_port}/  (Ctrl-C to stop)",
        file=out,
        flush=True,
    )
    config = uvicorn.Config(app, log_level="warning", access_log=False, timeout_graceful_shutdown=2)
    uvicorn.Server(config).run(sockets=[sock])
