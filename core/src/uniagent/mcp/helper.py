"""The MCP client helper that runs inside the sandbox (standalone: only the ``mcp`` SDK).

``python3 helper.py SERVER.json list`` prints the server's tools as one JSON object;
``python3 helper.py SERVER.json call TOOL ARGS_JSON`` calls one tool and prints its result
as text. Exit codes: 0 done, 1 the tool reported an error, 2 the server failed (did not
start, crashed, broke the protocol), 3 the call timed out. Everything it says goes to
stdout (the sandbox merges the streams); the server's own stderr is kept aside and its
tail shown only when the server failed.

A process-wide server (``scope: process``, :mod:`uniagent.mcp.process`) is reached
through its Unix socket instead (``SERVER.json`` then names ``socket``): one JSON line
out, one back. That needs only the standard library in the sandbox.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, TextIO

TOOL_ERROR, SERVER_ERROR, TIMEOUT = 1, 2, 3
_STDERR_TAIL = 2000


@asynccontextmanager
async def _session(server: dict[str, Any], errlog: TextIO) -> AsyncIterator[Any]:
    from mcp import ClientSession

    if server.get("transport", "stdio") == "stdio":
        from mcp.client.stdio import StdioServerParameters, stdio_client

        command = list(server["command"])
        params = StdioServerParameters(
            command=command[0], args=command[1:], env=dict(server.get("env") or {}) or None
        )
        transport = stdio_client(params, errlog=errlog)
    else:
        from mcp.client.streamable_http import streamable_http_client

        transport = streamable_http_client(server["url"])
    async with transport as streams, ClientSession(streams[0], streams[1]) as session:
        await session.initialize()
        yield session


def result_text(result: Any) -> str:
    """A tool result's content as text (what the model sees)."""
    parts: list[str] = []
    for item in result.content:
        kind = getattr(item, "type", "")
        if kind == "text":
            parts.append(item.text)
        elif kind == "resource" and hasattr(item.resource, "text"):
            parts.append(item.resource.text)
        else:  # images, audio, links: described, not inlined
            data = item.model_dump(mode="json", exclude={"data", "blob"}, exclude_none=True)
            parts.append(f"[{kind} content: {json.dumps(data, ensure_ascii=False)}]")
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    return "\n".join(parts)


async def list_tools(session: Any, timeout: float | None) -> list[dict[str, Any]]:
    """Every tool the session's server lists (all pages), as plain JSON data."""
    from mcp_types import PaginatedRequestParams

    tools: list[dict[str, Any]] = []
    cursor = None
    while True:
        params = PaginatedRequestParams(cursor=cursor) if cursor else None
        page = await asyncio.wait_for(session.list_tools(params=params), timeout)
        tools += [
            {"name": t.name, "description": t.description or "", "input_schema": t.input_schema}
            for t in page.tools
        ]
        cursor = page.next_cursor
        if not cursor:
            return tools


async def _main(server: dict[str, Any], argv: list[str], errlog: TextIO) -> int:
    timeout = server.get("timeout")
    from mcp.shared.exceptions import MCPError
    from mcp_types import CONNECTION_CLOSED

    async with _session(server, errlog) as session:
        if argv[0] == "list":
            tools = await list_tools(session, timeout)
            print(json.dumps({"tools": tools}, ensure_ascii=False))
            return 0
        name, arguments = argv[1], json.loads(argv[2])
        try:
            result = await asyncio.wait_for(session.call_tool(name, arguments), timeout)
        except MCPError as exc:
            if exc.error.code == CONNECTION_CLOSED:  # the server went away: not the call's fault
                raise
            print(f"[the MCP server refused the call: {exc}]")
            return TOOL_ERROR
        text = result_text(result)
        if text:
            print(text)
        return TOOL_ERROR if result.is_error else 0


def _cause(exc: BaseException) -> BaseException:
    inner = getattr(exc, "exceptions", None)
    if inner:  # an anyio task group's exception group: the first real cause
        return _cause(inner[0])
    return exc


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".rstrip(": ")


def _via_socket(server: dict[str, Any], argv: list[str]) -> int:
    """``list`` or ``call`` through the socket of a process-wide server."""
    import socket

    if argv[0] == "list":
        request: dict[str, Any] = {"op": "list"}
    else:
        request = {"op": "call", "tool": argv[1], "arguments": json.loads(argv[2])}
    timeout = server.get("timeout")
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(None if timeout is None else float(timeout) + 30)
            conn.connect(server["socket"])
            conn.sendall(json.dumps(request).encode() + b"\n")
            with conn.makefile("rb") as stream:
                line = stream.readline()
        answer = json.loads(line)
    except (OSError, ValueError) as exc:
        print(f"[the MCP server failed: {_describe(exc)}]")
        return SERVER_ERROR
    if "tools" in answer:
        print(json.dumps({"tools": answer["tools"]}, ensure_ascii=False))
        return 0
    if "text" in answer:
        if answer["text"]:
            print(answer["text"])
        return TOOL_ERROR if answer.get("is_error") else 0
    if "refused" in answer:
        print(f"[{answer['refused']}]")
        return TOOL_ERROR
    if "timeout" in answer:
        print(f"[{answer['timeout']}]")
        return TIMEOUT
    print(f"[{answer.get('failed', 'the MCP server failed: no answer')}]")
    return SERVER_ERROR


def main(argv: list[str]) -> int:
    """Run one ``list`` or ``call``; the exit code says how it went."""
    with open(argv[0], encoding="utf-8") as file:
        server = json.load(file)
    if server.get("socket"):
        return _via_socket(server, argv[1:])
    with tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace") as errlog:
        try:
            return asyncio.run(_main(server, argv[1:], errlog))
        except BaseException as exc:  # every failure is reported, not raised
            cause = _cause(exc)
            if isinstance(cause, KeyboardInterrupt):
                raise
            if isinstance(cause, TimeoutError):
                print(f"[the MCP server did not answer within {server.get('timeout')} s]")
                return TIMEOUT
            exc = cause
            errlog.seek(0)
            tail = errlog.read()[-_STDERR_TAIL:].strip()
            print(f"[the MCP server failed: {_describe(exc)}]")
            if tail:
                print(f"[its stderr, last lines:]\n{tail}")
            return SERVER_ERROR


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
