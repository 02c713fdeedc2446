"""The built-in agent: the ReAct loop of :mod:`uniagent.interaction` (``agent: {name: react}``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from uniagent.hookspecs import hookimpl
from uniagent.specs import AgentSpec

#: The built-in loop: the configured tools, parser and interaction limits, called directly.
REACT: AgentSpec[None] = AgentSpec(
    name="react",
    description="uniagent's own ReAct loop: the configured tools, parser and interaction "
    "limits, the model called directly (no gateway)",
    builtin=True,
    distribution="uniagent",
)


@hookimpl
def uniagent_agents() -> Iterator[AgentSpec[Any]]:
    """The built-in agents."""
    yield REACT
