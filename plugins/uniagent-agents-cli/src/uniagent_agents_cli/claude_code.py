"""Claude Code (npm) through the gateway's Anthropic Messages: ``claude -p`` (print mode)."""

from __future__ import annotations

import json
import shlex

from pydantic import BaseModel, ConfigDict, Field

from uniagent import AgentCommand, AgentInstall, AgentLaunch, AgentOutcome, AgentSpec

PACKAGE, VERSION = "@anthropic-ai/claude-code", "2.1.332"


class ClaudeCodeSettings(BaseModel):
    """Claude Code's own limits and tools."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_turns: int = Field(30, ge=1, description="agentic turns before it stops (--max-turns)")
    timeout: float = Field(1800.0, gt=0, description="seconds the whole run may take")
    allowed_tools: list[str] = Field(
        default_factory=lambda: ["Bash", "Read", "Edit", "Write"],
        description="tools it may use without asking (--allowedTools)",
    )


def launch(run: AgentLaunch, settings: ClaudeCodeSettings) -> AgentCommand:
    """``claude -p INSTRUCTION --output-format json`` with the gateway as its API."""
    q = shlex.quote
    argv = [f"{run.bin}/claude", "-p", run.instruction, "--output-format", "json"]
    argv += ["--max-turns", str(settings.max_turns), "--allowedTools", *settings.allowed_tools]
    return AgentCommand(
        f"cd {q(run.workdir)} && " + " ".join(q(a) for a in argv) + " < /dev/null",
        env={
            "ANTHROPIC_BASE_URL": run.base_url,
            "ANTHROPIC_API_KEY": run.api_key,
            # Only the gateway: no telemetry, updates, error reports or other traffic.
            "DISABLE_TELEMETRY": "1",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_ERROR_REPORTING": "1",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        },
        timeout=settings.timeout,
    )


def outcome(exit_code: int | None, output: str, settings: ClaudeCodeSettings) -> AgentOutcome:
    """Its JSON result: ``success`` finished (the result text is the submission),
    ``error_max_turns`` the step limit; any other ending a format error."""
    result = None
    for line in reversed(output.strip().splitlines()):
        try:
            data = json.loads(line)
        except ValueError:
            continue
        if isinstance(data, dict) and data.get("type") == "result":
            result = data
            break
    if result is None:
        return AgentOutcome("finished" if exit_code == 0 else "format_error")
    if result.get("subtype") == "error_max_turns":
        return AgentOutcome("max_step_limit")
    if result.get("subtype") == "success" and not result.get("is_error"):
        return AgentOutcome("finished", submission=str(result.get("result") or ""))
    return AgentOutcome("format_error")


CLAUDE_CODE: AgentSpec[ClaudeCodeSettings] = AgentSpec(
    name="claude-code",
    description="Claude Code's print mode (`claude -p`), Anthropic Messages (streamed), "
    "telemetry and updates off",
    install=AgentInstall("npm", PACKAGE, VERSION, "claude"),
    wire="messages",
    launch=launch,
    outcome=outcome,
    deployments=("host", "local"),
    settings=ClaudeCodeSettings,
)
