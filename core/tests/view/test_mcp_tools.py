"""The viewer lists an episode's tools (an MCP server's with their server) and shows its
rubric and turn scores, from a real run (the test MCP server over stdio, a rubric of two
``command`` rewards and a metric, a tool's turn score, a scripted token model), over the
API and in Chromium."""

from __future__ import annotations

import asyncio
import io
import json
import sys
import types
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from playwright.sync_api import expect
from pydantic import BaseModel

from uniagent import ToolSpec, hookimpl
from uniagent.config import AgentConfig
from uniagent.plugins import load_plugins, reset_plugins
from uniagent.run.progress import Progress
from uniagent.run.runner import run
from uniagent.tasks import Task
from uniagent.testing.scripted import ScriptedTokenModel, hermes_call

pytest.importorskip("mcp", reason="the view suite installs uniagent[mcp]")

SERVER = Path(__file__).parents[1] / "mcp_servers" / "demo_server.py"


class NoArgs(BaseModel):
    pass


@pytest.fixture(scope="module")
def mcp_run(tmp_path_factory: pytest.TempPathFactory, qwen3_tokenizer: Any) -> Path:
    """One finished episode that called the demo server's `add`, then `done` (a plugin's,
    which scores its turn 0.5), graded by a rubric: 0.75 x 1 + 0.25 x 0, and a metric."""
    done = ToolSpec(
        name="done", description="Finish.", arguments=NoArgs, render=lambda a: "echo ok",
        ends_episode=True, score=lambda arguments, output, exit_code: 0.5,
    )  # fmt: skip

    @hookimpl
    def uniagent_tools() -> list[ToolSpec]:
        return [done]

    reset_plugins()
    load_plugins().register(types.SimpleNamespace(uniagent_tools=uniagent_tools), "test-tools")
    server = {
        "name": "demo",
        "command": [sys.executable, str(SERVER)],
        "python": sys.executable,
        "include": ["add"],
    }
    config = AgentConfig.from_dict(
        {
            "tools": ["done", {"mcp": server}],
            "instance_template": "{q}",
            "env": {"deployment": {"type": "host", "isolation": "none"}},
            "reward": {
                "rubric": [
                    {
                        "name": "command",
                        "label": "passes",
                        "weight": 0.75,
                        "settings": {"command": "true"},
                    },
                    {
                        "name": "command",
                        "label": "fails",
                        "weight": 0.25,
                        "settings": {"command": "false"},
                    },
                ],
                "metrics": [{"name": "command", "label": "noted", "settings": {"command": "true"}}],
            },
        }
    )
    model = ScriptedTokenModel(
        qwen3_tokenizer, [hermes_call("add", {"a": 2, "b": 40}), hermes_call("done")]
    )
    out = tmp_path_factory.mktemp("mcp-view") / "run"
    try:
        asyncio.run(
            run(
                config,
                [Task("t", {"q": "add"})],
                [],
                lambda: model,
                out,
                progress=Progress(io.StringIO(), live=False),
            )
        )
    finally:
        reset_plugins()
    return out


def test_an_episodes_tools_name_their_mcp_server(mcp_run, viewer_of, page) -> None:
    (record,) = [json.loads(line) for line in (mcp_run / "results.jsonl").read_text().splitlines()]
    assert record["exit_reason"] == "finished" and record["tool_servers"] == {"add": "mcp:demo"}
    viewer = viewer_of(str(mcp_run))
    key = "episodes/t/0"
    tools = {t["name"]: t for t in viewer.json("/api/runs/0/episode", key=key)["tools"]}
    assert set(tools) == {"done", "add"}
    assert tools["add"]["server"] == "mcp:demo" and tools["done"]["server"] is None
    assert tools["add"]["parameters"]["required"] == ["a", "b"]
    assert tools["add"]["description"] == "Add two integers."

    page.goto(f"{viewer.url}#/r/0/e?key={quote(key, safe='')}&tab=result")
    rows = page.locator("#tools tbody tr")
    expect(rows).to_have_count(2)
    add = page.locator('#tools tr[data-tool="add"]')
    expect(add).to_contain_text("mcp:demo")
    expect(add).to_contain_text("a: integer, b: integer")
    expect(page.locator('#tools tr[data-tool="done"]')).to_contain_text("plugin")


def test_the_rubric_and_the_turn_scores_are_shown(mcp_run, viewer_of, page) -> None:
    (record,) = [json.loads(line) for line in (mcp_run / "results.jsonl").read_text().splitlines()]
    assert record["reward"] == 0.75 and record["turn_scores"] == {"1": 0.5}, record
    viewer = viewer_of(str(mcp_run))
    page.goto(f"{viewer.url}#/r/0/e?key={quote('episodes/t/0', safe='')}&tab=result")
    rows = page.locator("#rubric tbody tr")
    expect(rows).to_have_count(3)
    expect(page.locator("#rubric h3")).to_have_text("Rubric (weighted-sum)")
    expect(rows.nth(0)).to_contain_text("passes")
    expect(rows.nth(0)).to_contain_text("0.75")
    expect(rows.nth(1)).to_contain_text("fails")
    expect(rows.nth(2)).to_contain_text("metric (not trained on)")
    expect(page.locator(".facts").filter(has_text="turn scores")).to_contain_text("turn 2: 0.5")
