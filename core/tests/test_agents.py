"""The `agents` plugin kind: agent configs resolve (or fail, naming the key) before any
sandbox starts, and `uniagent plugins --json` describes harnesses. (Harness episodes:
core/tests/gateway/test_harness_episodes.py.)"""

from __future__ import annotations

import pytest

from uniagent import AgentInstall
from uniagent.config import AgentConfig
from uniagent.errors import ConfigError
from uniagent.resolver import resolve
from uniagent.testing.harness import tiny_config


def test_the_default_agent_is_the_built_in_loop() -> None:
    agent = resolve(AgentConfig.from_dict({}))
    assert agent.agent.name == "react" and not agent.agent.is_harness


def test_an_unknown_agent_is_named_with_its_key_path() -> None:
    with pytest.raises(ConfigError, match=r"agent\.name: unknown agent 'nope'.*installed agents"):
        resolve(AgentConfig.from_dict({"agent": {"name": "nope"}}))


def test_an_unknown_agent_setting_is_named_with_its_key_path(tiny) -> None:
    with pytest.raises(ConfigError, match=r"agent\.settings\.stepz: unknown key"):
        resolve(tiny_config({"stepz": 3}))
    with pytest.raises(ConfigError, match=r"agent\.settings: agent 'react' takes no settings"):
        resolve(AgentConfig.from_dict({"agent": {"name": "react", "settings": {"x": 1}}}))


def test_a_harness_needs_a_sandbox_that_reaches_the_gateway(tiny) -> None:
    with pytest.raises(ConfigError, match=r"env\.deployment\.network: agent 'tiny'"):
        resolve(tiny_config(network=None))
    assert resolve(tiny_config(isolation="none", network=None)).agent.name == "tiny"


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
