"""The gateway: token-exact training data from any agent harness, as a trajectory tree.

An HTTP server with OpenAI Chat Completions, OpenAI Responses and Anthropic Messages in
front of a :class:`TokenBackend`; each session keeps a :class:`TrajectoryTree` of every
token. Needs ``pip install 'uniagent[gateway]'``; see docs/gateway.md. Names load lazily,
so ``uniagent.gateway.cli`` imports without the extra.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from uniagent.gateway.backend import ScriptedBackend, TokenBackend, TokenModelBackend
    from uniagent.gateway.manager import Gateway
    from uniagent.gateway.server import RunningGateway, create_app, start
    from uniagent.gateway.session import ChatRequest, Completion, GatewayError, Session
    from uniagent.gateway.tree import Node, Sample, TrajectoryTree, Turn

_WHERE = {
    "ScriptedBackend": "backend",
    "TokenBackend": "backend",
    "TokenModelBackend": "backend",
    "Gateway": "manager",
    "RunningGateway": "server",
    "create_app": "server",
    "start": "server",
    "ChatRequest": "session",
    "Completion": "session",
    "GatewayError": "session",
    "Session": "session",
    "Node": "tree",
    "Sample": "tree",
    "TrajectoryTree": "tree",
    "Turn": "tree",
}
__all__ = [
    "ChatRequest",
    "Completion",
    "Gateway",
    "GatewayError",
    "Node",
    "RunningGateway",
    "Sample",
    "ScriptedBackend",
    "Session",
    "TokenBackend",
    "TokenModelBackend",
    "TrajectoryTree",
    "Turn",
    "create_app",
    "start",
]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'uniagent.gateway' has no attribute {name!r}")
    try:
        module = importlib.import_module(f"uniagent.gateway.{_WHERE[name]}")
    except ImportError as exc:
        raise ImportError(
            f"uniagent.gateway needs its extra ({exc.name} is missing): "
            "pip install 'uniagent[gateway]'"
        ) from exc
    return getattr(module, name)
