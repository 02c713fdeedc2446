"""An MCP server for the tests, built with the ``mcp`` SDK: ``python demo_server.py [http]``.

Over stdio by default; ``http``: streamable HTTP on 127.0.0.1, its port printed first.

Tools: ``add`` (two ints), ``pid`` (the server's process id and cwd), ``write_note``
(writes a file in its cwd: it acts where it runs), ``fail`` (raises), ``crash`` (the
process exits mid-call) and ``hang`` (never answers; it first writes ``hang.started`` in
its cwd so a test can wait on that).
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
from pathlib import Path

from mcp.server.mcpserver import MCPServer

server = MCPServer("demo")


@server.tool()
def add(a: int, b: int) -> str:
    """Add two integers."""
    return str(a + b)


@server.tool()
def pid() -> str:
    """The server's process id and working directory."""
    return f"pid {os.getpid()} cwd {os.getcwd()}"


@server.tool()
def write_note(name: str, text: str) -> str:
    """Write text to a file of the current directory."""
    path = Path(name)
    path.write_text(text)
    return f"wrote {len(text)} characters to {path.resolve()}"


@server.tool()
def fail(reason: str) -> str:
    """Always raises."""
    raise ValueError(f"fail was asked to fail: {reason}")


@server.tool()
def crash() -> str:
    """The server process exits during the call."""
    os._exit(7)


@server.tool()
async def hang() -> str:
    """Never answers."""
    Path("hang.started").write_text("1")
    await asyncio.Event().wait()
    return "unreachable"


if __name__ == "__main__":
    if sys.argv[1:2] == ["http"]:
        import uvicorn

        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)  # connections wait in the backlog until uvicorn serves them
        print(sock.getsockname()[1], flush=True)
        app = server.streamable_http_app()
        uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])
    else:
        server.run()
