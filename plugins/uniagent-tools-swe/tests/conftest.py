"""Fixtures: a real host sandbox with the four tools installed as an episode installs them."""

from __future__ import annotations

import shlex
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from uniagent import AgentEnv, Observation, ToolSpec, open_env

from uniagent_tools_swe import make_tools

TIMEOUT = 30.0


class Sandbox:
    """A started host ``AgentEnv`` with the tools installed, and helpers to call them."""

    def __init__(self, env: AgentEnv, tools: dict[str, ToolSpec], workdir: Path) -> None:
        self.env = env
        self.tools = tools
        self.workdir = workdir

    async def call(self, name: str, **arguments: Any) -> Observation:
        """Validate a call like the loop does, render it and run it in the session."""
        spec = self.tools[name]
        validated = spec.validate_arguments(arguments).model_dump(mode="json", exclude_unset=True)
        return await self.env.run_action(spec.to_command(validated), timeout=TIMEOUT)

    async def run(self, command: str) -> Observation:
        """Run a raw bash command in the session."""
        return await self.env.run_action(command, timeout=TIMEOUT)

    async def export(self, **variables: str) -> None:
        """Set environment variables in the persistent session (seen by later tool calls)."""
        assignments = " ".join(f"{k}={shlex.quote(v)}" for k, v in variables.items())
        obs = await self.run(f"export {assignments}")
        assert obs.exit_code == 0, obs.output


@pytest.fixture
def tools() -> dict[str, ToolSpec]:
    """The four tool specs with their default settings, by name."""
    return {spec.name: spec for spec in make_tools()}


@pytest_asyncio.fixture
async def sandbox(tools: dict[str, ToolSpec], tmp_path: Path) -> AsyncIterator[Sandbox]:
    """A host sandbox, tools installed, the session's working directory a fresh temp dir."""
    workdir = tmp_path / "work"
    workdir.mkdir()
    env = open_env({"type": "host", "isolation": "none"})
    async with env:
        await env.install_tools(list(tools.values()))
        box = Sandbox(env, tools, workdir)
        obs = await box.run(f"cd {shlex.quote(str(workdir))}")
        assert obs.exit_code == 0, obs.output
        yield box
