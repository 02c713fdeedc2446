"""The installed distribution is found through its entry point and ships its scripts."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from importlib import metadata

import pytest
from uniagent import get_registry, reset_plugins

from uniagent_tools_swe import SCRIPTS_DIR, make_tools

TOOL_NAMES = {"execute_bash", "str_replace_editor", "submit", "finish"}


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
        assert tools[name].distribution == "uniagent-tools-swe"
        assert not tools[name].builtin


def test_entry_point_is_named_after_the_distribution() -> None:
    dist = metadata.distribution("uniagent-tools-swe")
    points = [ep for ep in dist.entry_points if ep.group == "uniagent"]
    assert [(ep.name, ep.value) for ep in points] == [
        ("uniagent-tools-swe", "uniagent_tools_swe.plugin")
    ]


def test_the_plugin_can_be_blocked(fresh_plugins: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UNIAGENT_DISABLE_PLUGINS", "uniagent-tools-swe")
    reset_plugins()
    assert not TOOL_NAMES & set(get_registry().tools())


def test_scripts_ship_inside_the_package() -> None:
    scripts = {path.name: path for spec in make_tools() for path in spec.scripts}
    assert set(scripts) == {"str_replace_editor", "submit"}
    for path in scripts.values():
        assert path.parent == SCRIPTS_DIR
        assert path.is_file()
    assert scripts["str_replace_editor"].read_text().startswith("#!/usr/bin/env python3\n")
    assert scripts["submit"].read_text().startswith("#!/usr/bin/env bash\n")


def test_scripts_are_executable() -> None:
    for name in ("str_replace_editor", "submit"):
        assert os.access(SCRIPTS_DIR / name, os.X_OK), name


def test_cli_lists_the_tools_with_their_schemas(
    fresh_plugins: None, capsys: pytest.CaptureFixture[str]
) -> None:
    from uniagent.testing import cli

    assert cli(["plugins", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    ours = next(p for p in report["plugins"] if p["name"] == "uniagent-tools-swe")
    assert ours["status"] == "loaded"
    schemas = {tool["name"]: tool["schema"] for tool in ours["tools"]}
    assert set(schemas) == TOOL_NAMES
    expected = {spec.name: spec.openai_schema() for spec in make_tools()}
    assert schemas == expected
