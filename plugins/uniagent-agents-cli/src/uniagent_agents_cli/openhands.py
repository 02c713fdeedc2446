"""OpenHands (the ``openhands-sdk`` agent, pip, Python >= 3.12) through the gateway's Chat
Completions: a small launcher runs its ``Agent`` in a ``Conversation`` in the work dir.

OpenHands' own CLI (``openhands --headless``) is a terminal UI with its own settings
store; the SDK is the documented way to run its agent from a program, so the harness is
the SDK's agent with its terminal and file-editor tools, native tool calling, no
condenser (a condenser would compact the history: the gateway keeps that as a branch).
"""

from __future__ import annotations

import json
import re
import shlex
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from uniagent import AgentCommand, AgentInstall, AgentLaunch, AgentOutcome, AgentSpec

VERSION = "1.58.2"
#: Printed by the launcher when the conversation ends: its status and last error code.
STATUS = "UNIAGENT_OPENHANDS_STATUS="
#: Printed once the SDK is imported and the conversation made, before the first model call.
STARTED = "UNIAGENT_OPENHANDS_STARTED"
EVENTS = "openhands-events.jsonl"
LAUNCHER = "uniagent_openhands.py"
SETTINGS = "openhands-settings.json"

#: Written into the harness's home and run with the venv's Python.
LAUNCHER_TEXT = f'''"""uniagent's OpenHands launcher (argv: settings, instruction, events log)."""
import json, os, sys

os.environ.setdefault("OPENHANDS_SUPPRESS_BANNER", "1")
from openhands.sdk import LLM, Agent, Conversation, Tool
from openhands.sdk.event.conversation_error import ConversationErrorEvent
import openhands.tools.file_editor, openhands.tools.task_tracker, openhands.tools.terminal

settings = json.load(open(sys.argv[1]))
instruction = open(sys.argv[2], encoding="utf-8").read()
llm = LLM(
    model=settings["model_name"], base_url=os.environ["UNIAGENT_BASE_URL"] + "/v1",
    api_key=os.environ["UNIAGENT_API_KEY"], usage_id="agent", num_retries=0,
    native_tool_calling=True, stream=False,
)
params = {{"terminal": {{"terminal_type": settings["terminal_type"]}}}}
tools = [Tool(name=name, params=params.get(name, {{}})) for name in settings["tools"]]
errors = []
log = open(sys.argv[3], "w", encoding="utf-8")


def keep(event):
    if isinstance(event, ConversationErrorEvent):
        errors.append(event.code)
    log.write(json.dumps({{"type": type(event).__name__, "event": str(event)[:2000]}}) + "\\n")
    log.flush()


conversation = Conversation(
    agent=Agent(llm=llm, tools=tools), workspace=os.getcwd(), visualizer=None,
    callbacks=[keep], max_iteration_per_run=settings["max_iterations"],
)
conversation.send_message(instruction)
print({STARTED!r}, flush=True)
try:
    conversation.run()
finally:
    status = getattr(conversation.state.execution_status, "value", "unknown")
    print()
    print({STATUS!r} + status + " " + (errors[-1] if errors else "-"))
'''


class OpenHandsSettings(BaseModel):
    """The OpenHands agent's own limits and tools."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_iterations: int = Field(30, ge=1, description="agent steps before it stops")
    timeout: float = Field(1800.0, gt=0, description="seconds the whole run may take")
    tools: tuple[Literal["terminal", "file_editor", "task_tracker"], ...] = Field(
        ("terminal", "file_editor"),
        description="its tools (OpenHands' own)",
    )
    terminal_type: Literal["subprocess", "tmux"] = Field(
        "subprocess",
        description="its terminal's backend (tmux leaves a server running in the sandbox)",
    )
    model_name: str = Field("openai/uniagent", description="litellm's model name (openai/...)")


def launch(run: AgentLaunch, settings: OpenHandsSettings) -> AgentCommand:
    """The launcher, in the work dir, with the gateway as its OpenAI-compatible model."""
    argv = [f"{run.bin}/python", *(f"{run.home}/{name}" for name in (LAUNCHER, SETTINGS))]
    argv += [f"{run.home}/instruction.md", f"{run.home}/{EVENTS}"]
    return AgentCommand(
        f"cd {shlex.quote(run.workdir)} && {shlex.join(argv)} < /dev/null",
        env={
            "UNIAGENT_BASE_URL": run.base_url,
            "UNIAGENT_API_KEY": run.api_key,
            "OPENHANDS_SUPPRESS_BANNER": "1",
            # litellm would fetch its cost map from GitHub at import.
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        },
        files={
            LAUNCHER: LAUNCHER_TEXT,
            SETTINGS: json.dumps(settings.model_dump(mode="json")),
            "instruction.md": run.instruction,
        },
        timeout=settings.timeout,
    )


def outcome(exit_code: int | None, output: str, settings: OpenHandsSettings) -> AgentOutcome:
    """The conversation's status: ``finished`` finished; its step limit
    (``MaxIterationsReached``) the step limit; any other end after the conversation started
    (stuck, an error on the model's output, killed by the agent's own command) a format error,
    the policy's outcome. A launcher that never started its conversation (the SDK does not
    import, its interpreter is gone) did so before the first model call, so before the
    policy could act: ``env_error``, infrastructure."""
    if not re.search(rf"^{STARTED}\s*$", output, flags=re.MULTILINE):
        return AgentOutcome("env_error")
    found = re.findall(rf"^{STATUS}(\S+) (\S+)\s*$", output, flags=re.MULTILINE)
    status, error = found[-1] if found else (None, None)
    if status == "finished" and exit_code == 0:
        return AgentOutcome("finished")
    if error == "MaxIterationsReached":
        return AgentOutcome("max_step_limit")
    return AgentOutcome("format_error")


OPENHANDS: AgentSpec[OpenHandsSettings] = AgentSpec(
    name="openhands",
    description="the OpenHands SDK's agent (terminal and file editor), OpenAI Chat "
    "Completions through litellm; needs Python >= 3.12 on this machine",
    install=AgentInstall(
        "pip",
        "openhands-sdk",
        VERSION,
        "python",
        extras=(f"openhands-tools=={VERSION}",),
        python="3.12",
    ),
    wire="chat",
    launch=launch,
    outcome=outcome,
    logs=(EVENTS,),
    settings=OpenHandsSettings,
)
