{% if cookiecutter.kind == "mcp" -%}
"""The plugin is found once installed, and its MCP server's tool works through `uniagent
run`: listed and called by a scripted model on the real Qwen3 tokenizer, with the server
in the episode's sandbox and as one process-wide server."""

from __future__ import annotations

import json
import sys
from importlib.metadata import entry_points
from pathlib import Path
from typing import Literal

import pytest
from uniagent.testing import ScriptedTokenModel, hermes_call, load_qwen3_tokenizer, run_tasks

from {{ cookiecutter.__module_name }}.plugin import mcp_entry

TOOL = "{{ cookiecutter.__record_name }}"


def test_plugin_is_discovered() -> None:
    """After ``pip install``, the distribution's entry point is in uniagent's group."""
    (entry,) = entry_points(group="uniagent", name="{{ cookiecutter.__dist_name }}")
    assert entry.load().mcp_entry is mcp_entry


@pytest.mark.parametrize("scope", ["sandbox", "process"])
async def test_the_server_runs_through_uniagent_run(
    scope: Literal["sandbox", "process"], tmp_path: Path
) -> None:
    """The model calls the tool twice (once wrongly: the server's error comes back): its turns."""
    config = {
        "tools": [mcp_entry(sys.executable, scope)],  # this interpreter has the package
        "env": {"deployment": {"type": "host", "isolation": "none"}},
        "interaction": {"max_turns": 2},
    }
    script = [hermes_call(TOOL, {"who": "world"}), hermes_call(TOOL, {"who": " "})]
    model = ScriptedTokenModel(load_qwen3_tokenizer(), script)
    out = tmp_path / "out"
    tasks = {"greet": {"problem_statement": "Greet the world."}}
    await run_tasks(config, tasks, model, out, retries=0)
    episode = out / "episodes" / "greet" / "0"
    result = json.loads((episode / "result.json").read_text())
    assert result["exit_reason"] == "max_step_limit", (episode / "log.txt").read_text()[-2000:]
    assert result["tool_servers"] == {TOOL: f"mcp:{TOOL}"}
    messages = json.loads((episode / "messages.json").read_text())
    greeted, refused = [str(m["content"]) for m in messages[2:] if m["role"] in ("user", "tool")]
    assert "Hello, world!" in greeted and "[exit code" not in greeted
    assert "say whom to greet" in refused and "[exit code 1]" in refused
{% else -%}
"""The plugin is found once installed, and its tool works in a real sandbox."""

from __future__ import annotations

from uniagent import get_registry, open_env

TOOL = "{{ cookiecutter.__record_name }}"


def test_plugin_is_discovered() -> None:
    """After ``pip install``, uniagent lists the tool as this distribution's."""
    assert get_registry().tools()[TOOL].distribution == "{{ cookiecutter.__dist_name }}"


def test_a_call_becomes_the_command_that_runs_the_script() -> None:
    """Arguments become ``--name value`` options; omitted optional ones are left out."""
    assert get_registry().tools()[TOOL].to_command({"who": "world"}) == f"{TOOL} --who world"


async def test_the_tool_greets_inside_a_host_sandbox() -> None:
    """Installed into a real sandbox, the script prints the greeting."""
    tool = get_registry().tools()[TOOL]
    env = open_env({"type": "host"})
    await env.start()
    try:
        await env.install_tools([tool])
        observation = await env.run_action(
            tool.to_command({"who": "world", "greeting": "Hi"}), timeout=30
        )
    finally:
        await env.close()
    assert observation.exit_code == 0, observation.output
    assert observation.output.strip() == "Hi, world!"
{% endif -%}
