"""A harness of a few lines for tests of harness agents (``binary`` install, Chat
Completions): it asks the gateway, runs the ``bash`` call it gets, answers, repeats; exits
with ``exit_with`` when the model stops calling tools. With ``restarts``, it then starts
the conversation again from a new first message that many times (each a new branch of the
session's tree, as a subagent makes); with ``fork`` too, each restart instead goes on from
the first reply with a changed tool output (a branch after the model's first reply, whose
generated tokens the branches share, as a retried tool call or a parallel fork makes)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from uniagent.config import AgentConfig
from uniagent.specs import AgentCommand, AgentInstall, AgentLaunch, AgentSpec

#: The harness script (``#!/usr/bin/python3``: the sandbox sees the system's Python).
HARNESS = r"""#!/usr/bin/python3
import json, os, subprocess, sys, urllib.error, urllib.request
url = os.environ["BASE"] + "/v1/chat/completions"
tools = [{"type": "function", "function": {"name": "bash", "description": "Run it.",
          "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                         "required": ["command"]}}}]
def conversation(messages):
    for _ in range(int(os.environ["STEPS"])):
        req = urllib.request.Request(url, json.dumps({"model": "m", "messages": messages,
              "tools": tools}).encode(), {"Authorization": "Bearer " + os.environ["KEY"],
              "Content-Type": "application/json"})
        try:
            reply = json.load(urllib.request.urlopen(req))["choices"][0]["message"]
        except urllib.error.HTTPError as exc:
            print("gateway said", exc.code, exc.read().decode())
            if os.environ["RETRY_ERRORS"] == "1":  # as litellm's clients do: for ever here
                while True:
                    try:
                        urllib.request.urlopen(req)
                    except urllib.error.HTTPError:
                        pass
            sys.exit(3)
        messages.append(reply)
        if not reply.get("tool_calls"):
            return messages
        for call in reply["tool_calls"]:
            command = json.loads(call["function"]["arguments"])["command"]
            out = subprocess.run(command, shell=True, capture_output=True, text=True).stdout
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": out})
    return messages
first = conversation([{"role": "user", "content": sys.argv[1]}])
for i in range(int(os.environ["RESTARTS"])):
    if os.environ["FORK"] == "1" and len(first) > 2:
        tool = dict(first[2], content=first[2]["content"] + f"(fork {i + 1})")
        conversation(first[:2] + [tool])
    else:
        conversation([{"role": "user", "content": f"Again ({i + 1}): " + sys.argv[1]}])
sys.exit(int(os.environ["EXIT_WITH"]))
"""


class TinySettings(BaseModel):
    """The harness's settings (``agent.settings``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    exit_with: int = 0
    steps: int = 5
    restarts: int = 0
    fork: bool = False
    timeout: float = 120.0
    #: Ask again, for ever, when the gateway answers an error (a harness's client retries).
    retry_errors: bool = False


def tiny_spec(path: Path) -> AgentSpec[TinySettings]:
    """The harness agent ``tiny`` running the script at ``path`` (write :data:`HARNESS` there)."""
    digest = hashlib.sha256(path.read_bytes()).hexdigest()

    def launch(run: AgentLaunch, settings: TinySettings) -> AgentCommand:
        return AgentCommand(
            f"{run.bin}/tiny 'Write hello into out.txt.'",
            env={
                "BASE": run.base_url,
                "KEY": run.api_key,
                "EXIT_WITH": str(settings.exit_with),
                "STEPS": str(settings.steps),
                "RESTARTS": str(settings.restarts),
                "FORK": "1" if settings.fork else "0",
                "RETRY_ERRORS": "1" if settings.retry_errors else "0",
            },
            timeout=settings.timeout,
        )

    return AgentSpec(
        name="tiny",
        install=AgentInstall("binary", str(path), "1", "tiny", sha256=digest),
        wire="chat",
        launch=launch,
        settings=TinySettings,
    )


def tiny_config(settings: dict[str, Any] | None = None, **deployment: Any) -> AgentConfig:
    """A config running ``tiny`` (registered by the test) in a bubblewrap sandbox with
    network (the gateway is on 127.0.0.1), graded by ``command`` (``out.txt`` says hello);
    ``deployment`` keys override the sandbox's."""
    return AgentConfig.from_dict(
        {
            "agent": {"name": "tiny", "settings": settings or {}},
            "env": {
                "deployment": {"type": "host", "isolation": "bwrap", "network": True, **deployment}
            },
            "reward": {"name": "command", "settings": {"command": "grep -qx hello out.txt"}},
        }
    )
