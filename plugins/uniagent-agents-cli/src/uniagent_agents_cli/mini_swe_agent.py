"""mini-swe-agent (pip) through the gateway's Chat Completions: ``mini`` in yolo mode."""

from __future__ import annotations

import re
import shlex

from pydantic import BaseModel, ConfigDict, Field

from uniagent import AgentCommand, AgentInstall, AgentLaunch, AgentOutcome, AgentSpec

VERSION = "2.4.6"
TRAJECTORY = "trajectory.json"
#: Printed after ``mini`` exits: the exit status its trajectory records.
STATUS = "UNIAGENT_MINI_EXIT_STATUS="


class MiniSweAgentSettings(BaseModel):
    """mini-swe-agent's own limits and config."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    step_limit: int = Field(30, ge=1, description="model calls before it stops (LimitsExceeded)")
    timeout: float = Field(1800.0, gt=0, description="seconds the whole run may take")
    config: str = Field("mini.yaml", description="its config file (a name it ships, or a path)")
    model_name: str = Field("openai/uniagent", description="litellm's model name (openai/...)")


def launch(run: AgentLaunch, settings: MiniSweAgentSettings) -> AgentCommand:
    """``mini -y --exit-immediately`` with the gateway as its OpenAI-compatible model."""
    q = shlex.quote
    trajectory = f"{run.home}/{TRAJECTORY}"
    options = [
        "-y",
        "--exit-immediately",
        "-m",
        settings.model_name,
        "-t",
        run.instruction,
        "-c",
        settings.config,
        "-c",
        f"model.model_kwargs.api_base={run.base_url}/v1",
        "-c",
        f"agent.step_limit={settings.step_limit}",
        "-c",
        "agent.cost_limit=0",
        "-c",
        f"environment.cwd={run.workdir}",
        "-o",
        trajectory,
    ]
    status = (
        "import json,sys; print(); print("
        f"{STATUS!r} + json.load(open(sys.argv[1]))['info']['exit_status'])"
    )
    command = (
        f"{q(run.bin + '/mini')} {' '.join(q(o) for o in options)} < /dev/null; code=$?; "
        f"{q(run.bin + '/python')} -c {q(status)} {q(trajectory)} 2>/dev/null; (exit $code)"
    )
    return AgentCommand(
        command,
        env={
            "OPENAI_API_KEY": run.api_key,
            "MSWEA_CONFIGURED": "true",
            "MSWEA_COST_TRACKING": "ignore_errors",
            # litellm would fetch its cost map from GitHub at import.
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        },
        timeout=settings.timeout,
    )


def outcome(exit_code: int | None, output: str, settings: MiniSweAgentSettings) -> AgentOutcome:
    """Its trajectory's exit status: ``Submitted`` finished, ``LimitsExceeded`` the step
    limit; any other ending (it gave up, or crashed on the model's output) a format error."""
    found = re.findall(rf"^{STATUS}(\S+)\s*$", output, flags=re.MULTILINE)
    status = found[-1] if found else None
    if status == "Submitted":
        return AgentOutcome("finished")
    if status == "LimitsExceeded":
        return AgentOutcome("max_step_limit")
    return AgentOutcome("finished" if exit_code == 0 and status is None else "format_error")


MINI_SWE_AGENT: AgentSpec[MiniSweAgentSettings] = AgentSpec(
    name="mini-swe-agent",
    description="mini-swe-agent's `mini` (yolo, exits when it submits), OpenAI Chat "
    "Completions through litellm",
    install=AgentInstall("pip", "mini-swe-agent", VERSION, "mini"),
    wire="chat",
    launch=launch,
    outcome=outcome,
    logs=(TRAJECTORY,),
    deployments=("host", "local"),
    settings=MiniSweAgentSettings,
)
