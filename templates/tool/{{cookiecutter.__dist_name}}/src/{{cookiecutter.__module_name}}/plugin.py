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
