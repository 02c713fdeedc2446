"""One gateway per tokenizer and tool parser in this process, started when the first harness
episode needs it.

Every harness episode opens its own session on it, with its own model as the session's
backend (a verl worker makes a model per episode); the server runs on a background thread
until the process ends (its thread is a daemon). It listens on 127.0.0.1; for harnesses in
containers the same gateway is also served on the container network's address on this
machine (a bridge's gateway address), to clients of that network only.
"""

from __future__ import annotations

import threading
from typing import Any

from uniagent.errors import ConfigError
from uniagent.models.base import TokenChatModel
from uniagent.models.spec import GUIDED_REASON
from uniagent.specs import ParserSpec

_lock = threading.Lock()
#: (id of the tokenizer, parser) -> (the tokenizer, kept so its id is not reused; the server)
_running: dict[tuple[int, str], tuple[Any, Any]] = {}
#: (id of the tokenizer, parser, address) -> the server on a container network's address
_bridged: dict[tuple[int, str, str], Any] = {}


#: Why a model with guided decoding cannot serve a harness (nor ``uniagent gateway``).


def check_harness_spec(spec: str, agent: str) -> None:
    """A :class:`ConfigError` for a ``--model`` spec the gateway cannot serve to harness
    ``agent``, from its text alone (before anything loads)."""
    from uniagent.models.spec import is_guided

    if is_guided(spec):
        raise ConfigError(f"model spec {spec!r}: agent {agent!r} is a harness: {GUIDED_REASON}")


def require_token_model(model: Any, agent: str) -> None:
    """A :class:`ConfigError` unless the gateway can serve ``model`` to harness ``agent``."""
    if not isinstance(model, TokenChatModel):
        raise ConfigError(
            f"agent {agent!r} is a harness: it needs a token model behind the gateway (hf:, "
            f"a served model's token ids: ServedTokenModel, or verl's server), not "
            f"{type(model).__name__}, since the gateway records the token ids the model "
            "generates (OpenAIChatModel sends chat messages; from_spec('openai:...', "
            "token_backend=True) makes the token backend)"
        )
    if getattr(model, "guided", None) is not None:
        raise ConfigError(f"agent {agent!r} is a harness: {GUIDED_REASON}")


def gateway_for(model: Any, parser: ParserSpec | str) -> Any:
    """The :class:`~uniagent.gateway.server.RunningGateway` for ``model``'s tokenizer and
    ``parser`` (the resolved agent's parser, or an installed parser's name; open the
    episode's session with :func:`open_session`)."""
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
    key = (id(model.tokenizer), _name(parser))
    with _lock:
        if key not in _running:
            made = parser if isinstance(parser, str) else parser.factory()
            gateway = Gateway(TokenModelBackend(model), parser=made)
            _running[key] = (model.tokenizer, start(gateway))
        return _running[key][1]


def _name(parser: ParserSpec | str) -> str:
    return parser if isinstance(parser, str) else parser.name


def served_on(model: Any, parser: ParserSpec | str, address: str, network: str) -> Any:
    """The gateway of ``model`` and ``parser`` also served on ``address`` (an address of
    this machine on a container network), to clients in ``network`` only."""
    from uniagent.gateway.server import start

    running = gateway_for(model, parser)
    key = (id(model.tokenizer), _name(parser), address)
    with _lock:
        if key not in _bridged:
            _bridged[key] = start(running.gateway, host=address, peers=[network])
        return _bridged[key]


def open_session(
    model: Any, parser: ParserSpec | str, listen: tuple[str, str] | None = None
) -> tuple[Any, Any]:
    """A new session for one episode, ``model`` its backend; with the server it is on
    (``listen``: the one on that container network's ``(address, network)``)."""
    from uniagent.gateway.backend import TokenModelBackend

    running = gateway_for(model, parser)
    if listen is not None:
        running = served_on(model, parser, *listen)
    return running, running.gateway.open_session(backend=TokenModelBackend(model))


def stop_gateways() -> None:
    """Stop every gateway this module started (tests; a process's end stops them anyway)."""
    with _lock:
        running = [*_bridged.values(), *(server for _, server in _running.values())]
        _running.clear()
        _bridged.clear()
    for server in running:
        server.stop()
