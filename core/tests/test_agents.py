"""The `agents` plugin kind: agent configs resolve (or fail, naming the key) before any
sandbox starts, `uniagent plugins --json` describes harnesses, and a harness episode runs
in the sandbox through a gateway session: its exit, time-out and crash map to exit
reasons, the backend's failure is infrastructure, and its tree is saved in rollout.json."""

from __future__ import annotations

import hashlib
import io
import json
import types
from pathlib import Path

import pytest
from pydantic import BaseModel, ConfigDict

from uniagent import AgentCommand, AgentInstall, AgentLaunch, AgentSpec, hookimpl
from uniagent.config import AgentConfig
from uniagent.errors import ConfigError
from uniagent.models.base import ModelError
from uniagent.plugins import load_plugins, reset_plugins
from uniagent.resolver import resolve
from uniagent.run.progress import Progress
from uniagent.run.runner import run
from uniagent.run.tasks import Task
from uniagent.testing.scripted import ScriptedTokenModel, hermes_call

pytest.importorskip("uvicorn", reason="the gateway extra")

#: A harness of a few lines: ask the gateway, run the tool call it gets, answer, repeat;
#: exit with $EXIT_WITH when the model stops calling tools.
HARNESS = r"""#!/usr/bin/python3
import json, os, subprocess, sys, urllib.request
url = os.environ["BASE"] + "/v1/chat/completions"
tools = [{"type": "function", "function": {"name": "bash", "description": "Run it.",
          "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                         "required": ["command"]}}}]
messages = [{"role": "user", "content": sys.argv[1]}]
for _ in range(int(os.environ["STEPS"])):
    req = urllib.request.Request(url, json.dumps({"model": "m", "messages": messages,
          "tools": tools}).encode(), {"Authorization": "Bearer " + os.environ["KEY"],
          "Content-Type": "application/json"})
    try:
        reply = json.load(urllib.request.urlopen(req))["choices"][0]["message"]
    except urllib.error.HTTPError as exc:
        print("gateway said", exc.code, exc.read().decode()); sys.exit(3)
    messages.append(reply)
    if not reply.get("tool_calls"):
        sys.exit(int(os.environ["EXIT_WITH"]))
    for call in reply["tool_calls"]:
        command = json.loads(call["function"]["arguments"])["command"]
        out = subprocess.run(command, shell=True, capture_output=True, text=True).stdout
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": out})
sys.exit(0)
"""


class TinySettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    exit_with: int = 0
    steps: int = 5
    timeout: float = 120.0


def tiny_spec(path: Path) -> AgentSpec[TinySettings]:
    digest = hashlib.sha256(path.read_bytes()).hexdigest()

    def launch(run: AgentLaunch, settings: TinySettings) -> AgentCommand:
        return AgentCommand(
            f"{run.bin}/tiny 'Write hello into out.txt.'",
            env={
                "BASE": run.base_url,
                "KEY": run.api_key,
                "EXIT_WITH": str(settings.exit_with),
                "STEPS": str(settings.steps),
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


@pytest.fixture
def tiny(tmp_path_factory, monkeypatch):
    cache = tmp_path_factory.mktemp("cache")
    monkeypatch.setenv("UNIAGENT_CACHE_DIR", str(cache))
    script = tmp_path_factory.mktemp("harness") / "tiny.py"
    script.write_text(HARNESS)
    spec = tiny_spec(script)
    reset_plugins()

    @hookimpl
    def uniagent_agents():
        return [spec]

    load_plugins().register(types.SimpleNamespace(uniagent_agents=uniagent_agents), "test-agents")
    yield spec
    reset_plugins()


def config(settings: dict | None = None, **deployment) -> AgentConfig:
    return AgentConfig.from_dict(
        {
            "agent": {"name": "tiny", "settings": settings or {}},
            "env": {
                "deployment": {"type": "host", "isolation": "bwrap", "network": True, **deployment}
            },
            "reward": {"name": "command", "settings": {"command": "grep -qx hello out.txt"}},
        }
    )


def test_the_default_agent_is_the_built_in_loop() -> None:
    agent = resolve(AgentConfig.from_dict({}))
    assert agent.agent.name == "react" and not agent.agent.is_harness


def test_an_unknown_agent_is_named_with_its_key_path() -> None:
    with pytest.raises(ConfigError, match=r"agent\.name: unknown agent 'nope'.*installed agents"):
        resolve(AgentConfig.from_dict({"agent": {"name": "nope"}}))


def test_an_unknown_agent_setting_is_named_with_its_key_path(tiny) -> None:
    with pytest.raises(ConfigError, match=r"agent\.settings\.stepz: unknown key"):
        resolve(config({"stepz": 3}))
    with pytest.raises(ConfigError, match=r"agent\.settings: agent 'react' takes no settings"):
        resolve(AgentConfig.from_dict({"agent": {"name": "react", "settings": {"x": 1}}}))


def test_a_harness_needs_a_sandbox_that_reaches_the_gateway(tiny) -> None:
    with pytest.raises(ConfigError, match=r"env\.deployment\.network: agent 'tiny'"):
        resolve(config(network=None))
    assert resolve(config(isolation="none", network=None)).agent.name == "tiny"


def test_an_unpinned_install_is_refused() -> None:
    with pytest.raises(ValueError, match="pin one exact version"):
        AgentInstall("pip", "mini-swe-agent", ">=2", "mini")


def test_plugins_json_lists_agents_with_install_and_wire(tiny) -> None:
    from uniagent.cli import plugins_report

    entry = next(p for p in plugins_report()["plugins"] if p["name"] == "test-agents")
    (agent,) = entry["agents"]
    assert agent["name"] == "tiny" and agent["wire"] == "chat"
    assert agent["install"]["kind"] == "binary" and agent["install"]["version"] == "1"
    assert agent["settings"]["properties"]["steps"]["default"] == 5


async def _run(agent_config: AgentConfig, model, out: Path) -> dict:
    await run(
        agent_config,
        [Task("t", {"problem_statement": "Write hello."})],
        [],
        lambda: model,
        out,
        retries=0,
        progress=Progress(io.StringIO(), live=False),
    )
    episode = out / "episodes" / "t" / "0"
    rollout = episode / "rollout.json"
    return {
        "result": json.loads((episode / "result.json").read_text()),
        "rollout": json.loads(rollout.read_text()) if rollout.exists() else None,
        "log": (episode / "log.txt").read_text(),
    }


WRITE = hermes_call("bash", {"command": "echo hello > out.txt"})


async def test_a_harness_solves_the_task_and_is_graded(tiny, qwen3_tokenizer, tmp_path) -> None:
    model = ScriptedTokenModel(qwen3_tokenizer, [WRITE, "Done."])
    done = await _run(config(), model, tmp_path / "out")
    result, rollout = done["result"], done["rollout"]
    assert result["exit_reason"] == "finished", done["log"][-2000:]
    assert result["reward"] == 1.0 and result["traj_masked"] is False
    assert rollout["tree"]["branches"] == 1 and len(rollout["tree"]["turns"]) == 2
    assert all(t["exact"] for t in rollout["tree"]["turns"])
    reply = qwen3_tokenizer.encode(WRITE, add_special_tokens=False) + [rollout["eot_id"]]
    gen = [i for i, m in zip(rollout["response_ids"], rollout["response_mask"]) if m]
    assert gen[: len(reply)] == reply


async def test_a_harness_exiting_non_zero_is_the_policys_outcome(
    tiny, qwen3_tokenizer, tmp_path
) -> None:
    model = ScriptedTokenModel(qwen3_tokenizer, ["I give up."])
    done = await _run(config({"exit_with": 2}), model, tmp_path / "out")
    result = done["result"]
    assert result["exit_reason"] == "format_error" and result["traj_masked"] is False
    assert result["outcome"] == "policy" and result["reward"] == 0.0


async def test_a_harness_past_its_time_limit_is_a_timeout(tiny, qwen3_tokenizer, tmp_path) -> None:
    model = ScriptedTokenModel(qwen3_tokenizer, [hermes_call("bash", {"command": "sleep 600"})])
    done = await _run(config({"timeout": 3}), model, tmp_path / "out")
    assert done["result"]["exit_reason"] == "timeout_error"
    assert done["result"]["traj_masked"] is False


async def test_the_backend_failing_under_a_harness_is_infrastructure(
    tiny, qwen3_tokenizer, tmp_path
) -> None:
    model = ScriptedTokenModel(qwen3_tokenizer, [ModelError("the server went away")])
    done = await _run(config(), model, tmp_path / "out")
    result = done["result"]
    assert result["exit_reason"] == "model_error" and result["traj_masked"] is True
    assert result["outcome"] == "infrastructure" and result["reward"] is None
    assert "the server went away" in result["error"]
