"""The built-in agent: the ReAct loop of :mod:`uniagent.interaction` (``agent: {name: react}``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from uniagent.agent_run import EpisodeAgent, EpisodeContext
from uniagent.hookspecs import hookimpl
from uniagent.specs import AgentSpec


def react_agent(context: EpisodeContext) -> EpisodeAgent:
    """One episode of the built-in loop (imported when an episode runs, not with the
    plugins)."""
    from uniagent.interaction.agent import ReactAgent

    return ReactAgent(context)


#: It runs ``interaction.branching`` (tree rollouts); the resolver refuses branching for a
#: runner that does not say so.
react_agent.runs_branching = True  # type: ignore[attr-defined]


#: The built-in loop: the configured tools, parser and interaction limits, called directly.
REACT: AgentSpec[None] = AgentSpec(
    name="react",
    description="uniagent's own ReAct loop: the configured tools, parser and interaction "
    "limits, the model called directly (no gateway)",
    builtin=True,
    distribution="uniagent",
    runner=react_agent,
)


@hookimpl
def uniagent_agents() -> Iterator[AgentSpec[Any]]:
    """The built-in agents."""
    yield REACT
