"""Sandboxes: :class:`AgentEnv` over a deployment (host bash, container, remote server).

Quick start::

    import uniagent

    async with uniagent.open_env({"type": "host"}) as env:
        obs = await env.run_action("echo hi", timeout=10)
        print(obs.output, obs.exit_code)

See docs/sandboxes.md.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

#: Each name and its module, imported on first use: ``uniagent.env.config`` (the config's
#: ``env`` section) must not pull in every backend.
_EXPORTS: dict[str, str] = {
    "AgentEnv": "uniagent.env.agent_env",
    "Fork": "uniagent.env.agent_env",
    "Snapshot": "uniagent.env.agent_env",
    "Observation": "uniagent.env.agent_env",
    "use_pidfd_child_watcher": "uniagent.env.aio",
    "many_sandboxes_gc": "uniagent.env.aio",
    "DEFAULT_ENV": "uniagent.env.config",
    "DEFAULT_TOOLS_DIR": "uniagent.env.config",
    "EnvConfig": "uniagent.env.config",
    **{
        name: "uniagent.env.errors"
        for name in (
            "ActionError",
            "ActionSyntaxError",
            "ActionTimeoutError",
            "CommandEncodingError",
            "EnvError",
            "EnvStartError",
            "NonZeroExitError",
            "SessionProtocolError",
            "ShellKilledError",
            "TerminalNotAliveError",
            "ToolInstallError",
        )
    },
    "HostDeployment": "uniagent.env.host",
    "HostDeploymentConfig": "uniagent.env.host",
    "LocalDeployment": "uniagent.env.local",
    "LocalDeploymentConfig": "uniagent.env.local",
    "RemoteDeployment": "uniagent.env.remote",
    "RemoteDeploymentConfig": "uniagent.env.remote",
    "make_runtime": "uniagent.env.remote",
    "Deployment": "uniagent.env.runtime",
}

__all__ = [
    "DEFAULT_ENV",
    "DEFAULT_TOOLS_DIR",
    "ActionError",
    "ActionSyntaxError",
    "ActionTimeoutError",
    "AgentEnv",
    "CommandEncodingError",
    "Deployment",
    "EnvConfig",
    "EnvError",
    "EnvStartError",
    "Fork",
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
    "Snapshot",
    "TerminalNotAliveError",
    "ToolInstallError",
    "make_runtime",
    "many_sandboxes_gc",
    "use_pidfd_child_watcher",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'uniagent.env' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


if TYPE_CHECKING:  # pragma: no cover
    from uniagent.env.agent_env import AgentEnv, Fork, Observation, Snapshot
    from uniagent.env.aio import many_sandboxes_gc, use_pidfd_child_watcher
    from uniagent.env.config import DEFAULT_ENV, DEFAULT_TOOLS_DIR, EnvConfig
    from uniagent.env.errors import (
        ActionError,
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
