"""The MCP client helper that runs inside the sandbox (standalone: only the ``mcp`` SDK).

``python3 helper.py SERVER.json list`` prints the server's tools as one JSON object;
``python3 helper.py SERVER.json call TOOL ARGS_JSON`` calls one tool and prints its result
as text. Exit codes: 0 done, 1 the tool reported an error, 2 the server failed (did not
start, crashed, broke the protocol), 3 the call timed out. Everything it says goes to
stdout (the sandbox merges the streams); the server's own stderr is kept aside and its
tail shown only when the server failed.
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


def _text(result: Any) -> str:
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


async def _main(server: dict[str, Any], argv: list[str], errlog: TextIO) -> int:
    timeout = server.get("timeout")
    from mcp.shared.exceptions import MCPError
    from mcp_types import CONNECTION_CLOSED, PaginatedRequestParams

    async with _session(server, errlog) as session:
        if argv[0] == "list":
            tools: list[dict[str, Any]] = []
            cursor = None
            while True:
                params = PaginatedRequestParams(cursor=cursor) if cursor else None
                page = await asyncio.wait_for(session.list_tools(params=params), timeout)
                tools += [
                    {
                        "name": t.name,
                        "description": t.description or "",
                        "input_schema": t.input_schema,
                    }
                    for t in page.tools
                ]
                cursor = page.next_cursor
                if not cursor:
                    break
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
        text = _text(result)
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


def main(argv: list[str]) -> int:
    """Run one ``list`` or ``call``; the exit code says how it went."""
    with open(argv[0], encoding="utf-8") as file:
        server = json.load(file)
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
