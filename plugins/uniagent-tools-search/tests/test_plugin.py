"""The installed distribution is found through its entry point and ships its scripts."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from importlib import metadata

import pytest
from uniagent import get_registry, reset_plugins

from uniagent_tools_search.config import SearchServiceConfig
from uniagent_tools_search.tools import SCRIPTS_DIR, make_tools

TOOL_NAMES = {"search", "search_arxiv", "fetch_document"}
DIST = "uniagent-tools-search"


@pytest.fixture
def fresh_plugins(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for var in ("UNIAGENT_LOAD_PLUGINS", "UNIAGENT_DISABLE_PLUGINS"):
        monkeypatch.delenv(var, raising=False)
    reset_plugins()
    yield
    reset_plugins()


def test_plugin_is_discovered(fresh_plugins: None) -> None:
    tools = get_registry().tools()
    assert set(tools) >= TOOL_NAMES
    for name in TOOL_NAMES:
        assert tools[name].distribution == DIST and not tools[name].builtin
    assert get_registry().rewards()["search_qa"].distribution == DIST
    service = get_registry().services()["search"]
    assert service.distribution == DIST and service.config is SearchServiceConfig


def test_entry_point_is_named_after_the_distribution() -> None:
    points = [ep for ep in metadata.distribution(DIST).entry_points if ep.group == "uniagent"]
    assert [(ep.name, ep.value) for ep in points] == [(DIST, "uniagent_tools_search.plugin")]


def test_the_plugin_can_be_blocked(fresh_plugins: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UNIAGENT_DISABLE_PLUGINS", DIST)
    reset_plugins()
    assert not TOOL_NAMES & set(get_registry().tools())
    assert "search" not in get_registry().services()


def test_each_tool_ships_its_script_and_all_three_are_the_same_program() -> None:
    scripts = {path.name: path for spec in make_tools() for path in spec.scripts}
    assert set(scripts) == TOOL_NAMES
    texts = {path.read_bytes() for path in scripts.values()}
    assert len(texts) == 1 and next(iter(texts)).startswith(b"#!/usr/bin/env python3\n")
    for path in scripts.values():
        assert path.parent == SCRIPTS_DIR and os.access(path, os.X_OK)


def test_uniagent_plugins_lists_the_tools_the_reward_and_the_service(
    fresh_plugins: None, capsys: pytest.CaptureFixture[str]
) -> None:
    from uniagent.testing import cli

    assert cli(["plugins", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    ours = next(p for p in report["plugins"] if p["name"] == DIST)
    assert ours["status"] == "loaded"
    assert ours["contributes"]["tools"] == sorted(TOOL_NAMES)
    assert ours["contributes"]["rewards"] == ["search_qa"]
    assert ours["contributes"]["services"] == ["search"]
    schemas = {tool["name"]: tool["schema"] for tool in ours["tools"]}
    assert schemas == {spec.name: spec.openai_schema() for spec in make_tools()}
    assert cli(["plugins"]) == 0
    text = capsys.readouterr().out
    assert "tools: fetch_document, search, search_arxiv" in text
    assert "rewards: search_qa" in text and "services: search" in text


def test_schemas_have_no_nulls_and_forbid_unknown_arguments() -> None:
    for spec in make_tools():
        schema = spec.parameters_schema()
        assert schema["additionalProperties"] is False
        assert "anyOf" not in json.dumps(schema)
    assert make_tools()[0].parameters_schema()["required"] == ["query"]
