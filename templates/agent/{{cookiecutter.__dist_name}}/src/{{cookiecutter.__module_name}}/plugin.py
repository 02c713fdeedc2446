"""The plugin's ``uniagent`` entry point: it contributes the ``{{ cookiecutter.__record_name }}`` agent.

An agent here is a harness: a program uniagent installs (pinned), starts in the episode's
sandbox as the agent, with a gateway session (base URL and key) as its model, and waits for
within its time limit. The gateway records every token the model generates, so the
episode's trajectory is exact whatever the harness does. The example harness is the script
in ``bin/``: it speaks OpenAI Chat Completions and runs the model's ``bash`` calls.

An agent that is not a program in the sandbox (it calls the model itself, in this process)
gives ``AgentSpec(runner=...)`` instead of ``install``/``wire``/``launch``: a callable that
makes its ``uniagent.EpisodeAgent`` for each episode (see uniagent's docs/agents.md).
"""

from __future__ import annotations

import hashlib
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from uniagent import AgentCommand, AgentInstall, AgentLaunch, AgentOutcome, AgentSpec, hookimpl

SCRIPT = Path(__file__).parent / "bin" / "{{ cookiecutter.__record_name }}"


class Settings(BaseModel):
    """Settings, from ``agent.settings`` in the agent config: the harness's own limits."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    steps: int = Field(10, ge=1, description="model calls before it stops")
    timeout: float = Field(600.0, gt=0, description="seconds the whole run may take")


def launch(run: AgentLaunch, settings: Settings) -> AgentCommand:
    """The command line that runs the harness once in the sandbox, and its variables."""
    script = f"{run.bin}/{{ cookiecutter.__record_name }}"
    return AgentCommand(
        f"cd {shlex.quote(run.workdir)} && {shlex.quote(script)} {shlex.quote(run.instruction)}",
        env={
            "AGENT_BASE_URL": run.base_url + "/v1",
            "AGENT_API_KEY": run.api_key,
            "AGENT_STEPS": str(settings.steps),
        },
        timeout=settings.timeout,
    )


def outcome(exit_code: int | None, output: str, settings: Settings) -> AgentOutcome:
    """How it ended: 0 finished (its last answer is the submission), 2 out of steps."""
    if exit_code == 0:
        lines = output.strip().splitlines()
        return AgentOutcome("finished", submission=lines[-1] if lines else "")
    return AgentOutcome("max_step_limit" if exit_code == 2 else "format_error")


@hookimpl
def uniagent_agents() -> Iterator[AgentSpec[Any]]:
    """The ``{{ cookiecutter.__record_name }}`` agent."""
    yield AgentSpec(
        name="{{ cookiecutter.__record_name }}",
        description="a small harness that runs the model's bash calls (Chat Completions)",
        # A binary install is pinned by its sha256: here, the script this package ships.
        install=AgentInstall(
            "binary",
            str(SCRIPT),
            "0.1.0",
            "{{ cookiecutter.__record_name }}",
            sha256=hashlib.sha256(SCRIPT.read_bytes()).hexdigest(),
        ),
        wire="chat",
        launch=launch,
        outcome=outcome,
        settings=Settings,
    )
