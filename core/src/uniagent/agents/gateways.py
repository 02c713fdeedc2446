"""One gateway per tokenizer and tool parser in this process, started when the first harness
episode needs it.

Every harness episode opens its own session on it, with its own model as the session's
backend (a verl worker makes a model per episode); the server runs on a background thread
until the process ends (its thread is a daemon).
"""

from __future__ import annotations

import threading
from typing import Any

from uniagent.errors import ConfigError
from uniagent.models.base import TokenChatModel

_lock = threading.Lock()
#: (id of the tokenizer, parser) -> (the tokenizer, kept so its id is not reused; the server)
_running: dict[tuple[int, str], tuple[Any, Any]] = {}


def require_token_model(model: Any, agent: str) -> None:
    """A :class:`ConfigError` unless the gateway can serve ``model`` to harness ``agent``."""
    if not isinstance(model, TokenChatModel):
        raise ConfigError(
            f"agent {agent!r} is a harness: it needs a token model behind the gateway (hf:, "
            f"or verl's server), not {type(model).__name__}, since the gateway records the "
            "token ids the model generates (an openai: server returns messages)"
        )


def gateway_for(model: Any, parser: str) -> Any:
    """The :class:`~uniagent.gateway.server.RunningGateway` for ``model``'s tokenizer and
    ``parser`` (open the episode's session with :func:`open_session`)."""
    require_token_model(model, "this")
    try:
        from uniagent.gateway.backend import TokenModelBackend
        from uniagent.gateway.manager import Gateway
        from uniagent.gateway.server import start
    except ImportError as exc:
        raise ConfigError(
            f"a harness agent needs uniagent's gateway extra ({exc.name} is missing): "
            "pip install 'uniagent[gateway]'"
        ) from None
    key = (id(model.tokenizer), parser)
    with _lock:
        if key not in _running:
            gateway = Gateway(TokenModelBackend(model), parser=parser)
            _running[key] = (model.tokenizer, start(gateway))
        return _running[key][1]


def open_session(model: Any, parser: str) -> tuple[Any, Any]:
    """A new session for one episode, ``model`` its backend; with the server it is on."""
    from uniagent.gateway.backend import TokenModelBackend

    running = gateway_for(model, parser)
    return running, running.gateway.open_session(backend=TokenModelBackend(model))


def stop_gateways() -> None:
    """Stop every gateway this module started (tests; a process's end stops them anyway)."""
    with _lock:
        running = [server for _, server in _running.values()]
        _running.clear()
    for server in running:
        server.stop()
