"""The gateway's sessions: open, find (by id or API key), inspect, close."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from uniagent.errors import UnknownPluginNameError
from uniagent.gateway.backend import TokenBackend
from uniagent.gateway.session import (
    MAX_IN_FLIGHT,
    Exactness,
    GatewayError,
    Session,
    new_key,
    new_session_id,
)
from uniagent.parsers import ToolCallParser


class Gateway:
    """Sessions in front of one token backend (the HTTP app is :func:`create_app`)."""

    def __init__(
        self,
        backend: TokenBackend,
        *,
        parser: str | ToolCallParser = "hermes",
        chat_template_kwargs: Mapping[str, Any] | None = None,
        exactness: Exactness = "on_close",
        open_sessions: bool = False,
        session_backend: Callable[[], TokenBackend] | None = None,
        max_in_flight: int = MAX_IN_FLIGHT,
    ) -> None:
        """``session_backend``: a fresh backend for each session opened without one (the
        CLI's ``--scripted``: every session replays the script from its first reply);
        without it, those sessions share ``backend``. ``max_in_flight``: requests a session
        may have waiting for the backend at once (more are answered 429)."""
        if max_in_flight < 1:
            raise GatewayError(f"max_in_flight must be at least 1, not {max_in_flight}")
        self.max_in_flight = max_in_flight
        if isinstance(parser, str):  # an installed parser, the built-ins' or a plugin's
            from uniagent.registry import get_parser

            try:
                parser = get_parser(parser)
            except UnknownPluginNameError as exc:
                raise GatewayError(str(exc)) from None
        if exactness not in ("eager", "on_close", "off"):
            raise GatewayError(f"exactness must be eager, on_close or off, not {exactness!r}")
        self.backend, self.parser = backend, parser
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.exactness: Exactness = exactness
        #: Whether ``POST /sessions`` may open sessions over HTTP (the CLI's mode).
        self.open_sessions = open_sessions
        self.session_backend = session_backend
        self.sessions: dict[str, Session] = {}
        self._by_key: dict[str, Session] = {}

    def open_session(
        self, session_id: str | None = None, *, backend: TokenBackend | None = None
    ) -> Session:
        """A new session with its own id and API key (and its own ``backend``, if given: an
        episode's model in front of the same tokenizer, e.g. one per verl episode)."""
        session_id = session_id or new_session_id()
        if session_id in self.sessions:
            raise GatewayError(f"session {session_id!r} exists", status=409)
        if backend is None:
            backend = self.session_backend() if self.session_backend else self.backend
        session = Session(
            session_id,
            new_key(),
            backend,
            self.parser,
            self.chat_template_kwargs,
            self.exactness,
            self.max_in_flight,
        )
        self.sessions[session_id] = session
        self._by_key[session.key] = session
        return session

    def find(self, session_id: str | None, key: str | None) -> Session:
        """The session named by the URL path, else by the API key; a clear error otherwise."""
        if session_id is not None:
            session = self.sessions.get(session_id)
            if session is None:
                raise GatewayError(
                    f"unknown session {session_id!r}", status=404, kind="not_found_error"
                )
        else:
            session = self._by_key.get(key or "")
            if session is None:
                raise GatewayError(
                    "no session: use a base URL /s/{session}/v1 or the API key of a session",
                    status=401,
                    kind="authentication_error",
                )
        if session.closed:
            raise GatewayError(
                f"session {session.id!r} is closed", status=404, kind="not_found_error"
            )
        return session

    def close(self, session_id: str) -> dict[str, Any]:
        """Close a session and return its state and tree."""
        session = self.sessions.get(session_id)
        if session is None:
            raise GatewayError(
                f"unknown session {session_id!r}", status=404, kind="not_found_error"
            )
        self._by_key.pop(session.key, None)
        return session.close()

    def forget(self, session_id: str) -> None:
        """Drop a closed session (its owner kept what :meth:`close` returned): a long run's
        gateway then holds only the sessions of the episodes still going."""
        session = self.sessions.get(session_id)
        if session is not None and session.closed:
            del self.sessions[session_id]
