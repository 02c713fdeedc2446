"""Codex (npm) through the gateway's Responses API: ``codex exec`` (non-interactive)."""

from __future__ import annotations

import shlex

from pydantic import BaseModel, ConfigDict, Field

from uniagent import AgentCommand, AgentInstall, AgentLaunch, AgentSpec

PACKAGE, VERSION = "@openai/codex", "0.171.0"
KEY_VARIABLE = "UNIAGENT_GATEWAY_KEY"


class CodexSettings(BaseModel):
    """Codex's own limits and sandbox mode."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    timeout: float = Field(1800.0, gt=0, description="seconds the whole run may take")
    sandbox: str = Field(
        "danger-full-access",
        description="its own sandbox mode (-s): uniagent's sandbox already isolates it, and "
        "its bubblewrap inside another may not start",
    )


def config_toml(base_url: str) -> str:
    """Its config: the gateway as its only provider; web search, updates, analytics off."""
    return f"""model = "uniagent"
model_provider = "uniagent"
web_search = "disabled"
check_for_update_on_startup = false

[model_providers.uniagent]
name = "uniagent"
base_url = "{base_url}/v1"
env_key = "{KEY_VARIABLE}"
wire_api = "responses"

[agents]
enabled = false

[features]
goals = false
image_generation = false

[analytics]
enabled = false
"""


def launch(run: AgentLaunch, settings: CodexSettings) -> AgentCommand:
    """``codex exec --skip-git-repo-check --ephemeral -s MODE INSTRUCTION``."""
    q = shlex.quote
    argv = [f"{run.bin}/codex", "exec", "--skip-git-repo-check", "--ephemeral"]
    argv += ["-s", settings.sandbox, "-C", run.workdir, run.instruction]
    return AgentCommand(
        " ".join(q(a) for a in argv) + " < /dev/null",
        env={"CODEX_HOME": f"{run.home}/.codex", KEY_VARIABLE: run.api_key},
        files={".codex/config.toml": config_toml(run.base_url)},
        timeout=settings.timeout,
    )


CODEX: AgentSpec[CodexSettings] = AgentSpec(
    name="codex",
    description="Codex's `codex exec`, OpenAI Responses (streamed), updates and analytics off",
    install=AgentInstall("npm", PACKAGE, VERSION, "codex"),
    wire="responses",
    launch=launch,
    deployments=("host", "local"),
    settings=CodexSettings,
)
