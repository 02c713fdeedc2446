"""The plugin's hook: the harnesses it contributes."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from uniagent import AgentSpec, hookimpl
from uniagent_agents_cli.claude_code import CLAUDE_CODE
from uniagent_agents_cli.codex import CODEX
from uniagent_agents_cli.mini_swe_agent import MINI_SWE_AGENT
from uniagent_agents_cli.openhands import OPENHANDS


@hookimpl
def uniagent_agents() -> Iterator[AgentSpec[Any]]:
    """mini-swe-agent, Claude Code, Codex and OpenHands."""
    yield MINI_SWE_AGENT
    yield CLAUDE_CODE
    yield CODEX
    yield OPENHANDS
