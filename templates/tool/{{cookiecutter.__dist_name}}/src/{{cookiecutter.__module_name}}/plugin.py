{% if cookiecutter.kind == "mcp" -%}
"""The plugin's ``uniagent`` entry point, and the ``tools`` entry of its MCP server.

The package ships an MCP server (``{{ cookiecutter.__module_name }}.server``) with the
``{{ cookiecutter.__record_name }}`` tool. An agent config lists it as ``tools: [{mcp: ...}]``;
:func:`mcp_entry` builds that entry. The module contributes no hook: uniagent lists the
server's tools when an episode starts (``uniagent plugins --config CONFIG`` shows them).
"""

from __future__ import annotations

from typing import Any, Literal

#: The module that serves the tools over stdio: ``python -m {{ cookiecutter.__module_name }}.server``.
SERVER_MODULE = "{{ cookiecutter.__module_name }}.server"


def mcp_entry(
    python: str = "python3", scope: Literal["sandbox", "process"] = "sandbox"
) -> dict[str, Any]:
    """The agent config's ``tools`` entry for the server, run by ``python`` (an interpreter
    with this package and ``mcp``: inside the sandbox unless ``scope`` is ``process``)."""
    return {
        "mcp": {
            "name": "{{ cookiecutter.__record_name }}",
            "command": [python, "-m", SERVER_MODULE],
            "python": python,
            "scope": scope,
        }
    }
{% else -%}
"""The plugin's ``uniagent`` entry point: it contributes the ``{{ cookiecutter.__record_name }}`` tool.

A tool is a :class:`uniagent.ToolSpec`: the name and description the model
sees, a pydantic model of its arguments (whose JSON schema becomes the
function's ``parameters``) and the scripts that do the work inside the sandbox.
uniagent uploads the scripts into the sandbox's tools directory, which is on
``PATH``, and turns a call ``{{ cookiecutter.__record_name }}(who="world")`` into the command
``{{ cookiecutter.__record_name }} --who world``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field
from uniagent import ToolSpec, hookimpl

#: Scripts shipped as package data and run inside the sandbox.
BIN = Path(__file__).resolve().parent / "bin"


class {{ cookiecutter.__class_name }}Arguments(BaseModel):
    """The tool's arguments; an unknown one is an error that the model is shown."""

    model_config = ConfigDict(extra="forbid")

    who: str = Field(description="Whom to greet, e.g. `world`.")
    greeting: str = Field("Hello", description="The greeting to use.")


@hookimpl
def uniagent_tools() -> Iterator[ToolSpec]:
    """The ``{{ cookiecutter.__record_name }}`` tool."""
    yield ToolSpec(
        name="{{ cookiecutter.__record_name }}",
        description="Greet someone by name and print the greeting.",
        arguments={{ cookiecutter.__class_name }}Arguments,
        scripts=(BIN / "{{ cookiecutter.__record_name }}",),
    )
{% endif -%}
