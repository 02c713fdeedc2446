"""The MCP server: ``python -m {{ cookiecutter.__module_name }}.server`` serves it over stdio.

Each ``@server.tool()`` function is one tool. Its signature becomes the JSON schema the
model sees (and that uniagent checks a call's arguments against), its docstring the
description; what it returns is what the model reads. Raise ``ToolError`` for a failure
the model should read and fix (its message goes back); any other exception is a crash,
of which the model sees only ``Error executing tool NAME``.
"""

from __future__ import annotations

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("{{ cookiecutter.__record_name }}")


@server.tool()
def {{ cookiecutter.__record_name }}(who: str, greeting: str = "Hello") -> str:
    """Greet someone by name and return the greeting."""
    if not who.strip():
        raise ToolError("say whom to greet: `who` is empty")
    return f"{greeting}, {who}!"


if __name__ == "__main__":
    server.run()
