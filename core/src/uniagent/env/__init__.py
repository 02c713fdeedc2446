"""Sandboxes: :class:`AgentEnv` over a deployment (host bash, container, remote server).

Quick start::

    from uniagent.env import AgentEnv

    async with AgentEnv.from_config({"type": "host"}) as env:
        obs = await env.run_action("echo hi", timeout=10)
        print(obs.output, obs.exit_code)

See docs/sandboxes.md.
"""

from __future__ import annotations

from uniagent.env.agent_env import AgentEnv, Observation
from uniagent.env.aio import use_pidfd_child_watcher
from uniagent.env.config import DEFAULT_ENV, DEFAULT_TOOLS_DIR, EnvConfig
from uniagent.env.errors import (
    ActionSyntaxError,
    ActionTimeoutError,
    CommandEncodingError,
    EnvError,
    EnvStartError,
    NonZeroExitError,
    SessionProtocolError,
    ShellKilledError,
    TerminalNotAliveError,
    ToolInstallError,
)
from uniagent.env.host import HostDeployment, HostDeploymentConfig
from uniagent.env.local import LocalDeployment, LocalDeploymentConfig
from uniagent.env.remote import RemoteDeployment, RemoteDeploymentConfig, make_runtime
from uniagent.env.runtime import Deployment

__all__ = [
    "DEFAULT_ENV",
    "DEFAULT_TOOLS_DIR",
    "ActionSyntaxError",
    "ActionTimeoutError",
    "AgentEnv",
    "CommandEncodingError",
    "Deployment",
    "EnvConfig",
    "EnvError",
    "EnvStartError",
    "HostDeployment",
    "HostDeploymentConfig",
    "LocalDeployment",
    "LocalDeploymentConfig",
    "NonZeroExitError",
    "Observation",
    "RemoteDeployment",
    "RemoteDeploymentConfig",
    "SessionProtocolError",
    "ShellKilledError",
    "TerminalNotAliveError",
    "ToolInstallError",
    "make_runtime",
    "use_pidfd_child_watcher",
]
