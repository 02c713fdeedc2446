"""The core starts the service named in an agent config before episodes and stops it after."""

from __future__ import annotations

from pathlib import Path

import pytest
from uniagent import AgentConfig, ConfigError, open_env, resolve, running_services

from uniagent_tools_search.tools import make_search


def agent_config(index_dir: Path, socket: Path, **settings: object) -> AgentConfig:
    return AgentConfig.from_dict(
        {
            "tools": ["search"],
            "services": {
                "search": {"index": str(index_dir), "unix_socket": str(socket), **settings}
            },
            "env": {
                "deployment": {
                    "type": "host",
                    "isolation": "bwrap",
                    "ro_binds": [str(socket.parent)],
                },
                "env": {"UNIAGENT_SEARCH_URL": f"unix://{socket}"},
            },
        }
    )


async def test_a_run_starts_the_service_its_sandboxes_use_and_stops_it(index_dir, socket_dir):
    socket = socket_dir / "search.sock"
    config = agent_config(index_dir, socket)
    async with running_services(resolve(config)):
        env = open_env(config.env.deployment, config.env)
        async with env:
            await env.install_tools([make_search()])
            obs = await env.run_action("search --query 'Leonardo da Vinci Mona Lisa'", timeout=60)
        assert obs.exit_code == 0 and "[1] " in obs.output, obs.output
    assert not socket.exists()


def test_bad_service_settings_fail_when_the_config_is_resolved(index_dir, socket_dir) -> None:
    # resolve() is where a run checks plugin settings, before any service or sandbox starts.
    with pytest.raises(ConfigError, match=r"services\.search\.cache_sise: unknown key"):
        resolve(agent_config(index_dir, socket_dir / "s.sock", cache_sise=10))
    with pytest.raises(ConfigError, match=r"services\.search\.host: .*loopback only"):
        resolve(agent_config(index_dir, socket_dir / "s.sock", host="0.0.0.0", port=8080))
    assert not (socket_dir / "s.sock").exists()
