"""The gateway's HTTP app (Starlette + sse-starlette) and a server to run it (uvicorn).

Routes: ``/v1/chat/completions``, ``/v1/responses`` and ``/v1/messages``, each also under
``/s/{session}`` (the session by URL; without it, by the API key); ``GET``/``DELETE
/sessions/{id}`` (inspect, close: the session's key is required) and, when the gateway
allows it, ``POST /sessions`` (open one).
"""

from __future__ import annotations

import ipaddress
import socket
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from types import ModuleType
from typing import Any

import orjson
import uvicorn
from sse_starlette.sse import EventSourceResponse
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from uniagent.gateway.manager import Gateway
from uniagent.gateway.session import Completion, GatewayError, Session
from uniagent.gateway.wire import anthropic, openai_chat, responses
from uniagent.models.base import ContextLimitError, ModelError

#: Linux's IP_FREEBIND (not in every Python's socket module): bind to an address that is
#: not up yet.
IP_FREEBIND = getattr(socket, "IP_FREEBIND", 15)

WIRES: dict[str, ModuleType] = {
    "/v1/chat/completions": openai_chat,
    "/v1/responses": responses,
    "/v1/messages": anthropic,
}


def _key(request: Request) -> str | None:
    auth = request.headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    return request.headers.get("x-api-key")


def create_app(gateway: Gateway, *, model_name: str = "uniagent-gateway") -> Starlette:
    """The ASGI app serving ``gateway``."""

    def endpoint(wire: ModuleType) -> Callable[[Request], Any]:
        async def handle(request: Request) -> Response:
            try:
                session = gateway.find(request.path_params.get("session"), _key(request))
                try:
                    body = orjson.loads(await request.body())
                except orjson.JSONDecodeError as exc:
                    raise GatewayError(f"the request body is not JSON: {exc}") from None
                if not isinstance(body, dict):
                    raise GatewayError("the request body must be a JSON object")
                chat = wire.parse(body)
                completion = await session.complete(chat)
            except GatewayError as exc:
                return JSONResponse(wire.error(exc), status_code=exc.status)
            except ContextLimitError as exc:
                session.limit_errors.append(str(exc))  # the policy's: its history is too long
                full = GatewayError(f"context length exceeded: {exc}", param="messages")
                return JSONResponse(wire.error(full), status_code=400)
            except ModelError as exc:
                session.backend_failed(str(exc))  # the episode masks it: infrastructure
                failed = GatewayError(
                    f"the token backend failed: {exc}", status=502, kind="api_error"
                )
                return JSONResponse(wire.error(failed), status_code=502)
            model = body.get("model") if isinstance(body.get("model"), str) else model_name
            if body.get("stream"):
                events = _delivered(wire.stream(completion, model, body), completion, session)
                return EventSourceResponse(events, ping=600)
            completion.commit()
            return JSONResponse(wire.response(completion, model))

        return handle

    def owned(request: Request) -> Session:
        session = gateway.sessions.get(request.path_params["session"])
        if session is None or _key(request) != session.key:
            raise GatewayError(
                f"unknown session {request.path_params['session']!r} (or not its key)",
                status=404,
                kind="not_found_error",
            )
        return session

    async def inspect(request: Request) -> Response:
        try:
            return JSONResponse(owned(request).state())
        except GatewayError as exc:
            return JSONResponse(openai_chat.error(exc), status_code=exc.status)

    async def close(request: Request) -> Response:
        try:
            session = owned(request)
            return JSONResponse(gateway.close(session.id))
        except GatewayError as exc:
            return JSONResponse(openai_chat.error(exc), status_code=exc.status)

    async def open_session(request: Request) -> Response:
        if not gateway.open_sessions:
            exc = GatewayError(
                "this gateway opens sessions only from its library API",
                status=403,
                kind="permission_error",
            )
            return JSONResponse(openai_chat.error(exc), status_code=403)
        session = gateway.open_session()
        base = str(request.base_url).rstrip("/")
        return JSONResponse(
            {"id": session.id, "key": session.key, "base_url": f"{base}/s/{session.id}"}
        )

    async def models(request: Request) -> Response:
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {"id": model_name, "object": "model", "created": 0, "owned_by": "uniagent"}
                ],
            }
        )

    routes = []
    for path, wire in WIRES.items():
        routes += [
            Route(path, endpoint(wire), methods=["POST"]),
            Route("/s/{session}" + path, endpoint(wire), methods=["POST"]),
        ]
    routes += [
        Route("/v1/models", models),
        Route("/s/{session}/v1/models", models),
        Route("/sessions", open_session, methods=["POST"]),
        Route("/sessions/{session}", inspect, methods=["GET"]),
        Route("/sessions/{session}", close, methods=["DELETE"]),
    ]
    return Starlette(routes=routes)


async def _delivered(
    events: Iterator[dict[str, Any]], completion: Completion, session: Session
) -> AsyncIterator[dict[str, Any]]:
    """The events; the turn is recorded once all but the last were sent (the client then
    has the whole reply but its terminator), else it is noted as undelivered."""
    committed = False
    try:
        pending = next(events)
        for event in events:
            yield pending
            pending = event
        completion.commit()
        committed = True
        yield pending
    finally:
        if not committed:
            session.discard(completion)


class _PeersOnly:
    """ASGI middleware: only clients whose address is in ``networks`` are served (a
    listener on a container bridge's address must not serve other machines that route to
    it); any other connection gets a 403 and nothing else."""

    def __init__(self, app: Any, networks: Sequence[str]) -> None:
        self.app = app
        self.networks = [ipaddress.ip_network(n, strict=False) for n in networks]

    def allowed(self, client: Any) -> bool:
        try:
            address = ipaddress.ip_address(client[0])
        except (TypeError, ValueError, IndexError):
            return False
        return any(address in network for network in self.networks)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] in ("http", "websocket") and not self.allowed(scope.get("client")):
            if scope["type"] == "http":
                await Response("forbidden", status_code=403)(scope, receive, send)
            return
        await self.app(scope, receive, send)


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, ready: threading.Event) -> None:
        super().__init__(config)
        self.ready = ready

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        self.ready.set()


class RunningGateway:
    """A gateway served on a background thread (``with start(gw) as running: ...``)."""

    def __init__(
        self,
        gateway: Gateway,
        host: str,
        port: int,
        model_name: str,
        *,
        peers: Sequence[str] | None = None,
    ) -> None:
        self.gateway = gateway
        self._sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if peers is not None:  # a bridge's address, which may come and go with its containers
            self._sock.setsockopt(socket.IPPROTO_IP, IP_FREEBIND, 1)
        self._sock.bind((host, port))
        self.host, self.port = host, self._sock.getsockname()[1]
        app: Any = create_app(gateway, model_name=model_name)
        config = uvicorn.Config(
            app if peers is None else _PeersOnly(app, peers),
            log_level="warning",
            lifespan="off",
            access_log=False,
            proxy_headers=False,  # the peer's own address: no X-Forwarded-For can pose as one
        )
        self._ready = threading.Event()
        self._server = _Server(config, self._ready)
        self._thread = threading.Thread(
            target=self._server.run,
            kwargs={"sockets": [self._sock]},
            daemon=True,
            name="uniagent-gateway",
        )

    @property
    def url(self) -> str:
        """``http://host:port`` of the server."""
        return f"http://{self.host}:{self.port}"

    def base_url(self, session: Session) -> str:
        """The base URL a harness is given for ``session`` (append ``/v1`` for OpenAI)."""
        return f"{self.url}/s/{session.id}"

    def start(self) -> RunningGateway:
        """Start serving; return once the server accepts connections."""
        self._thread.start()
        while not self._ready.wait(timeout=1.0):
            if not self._thread.is_alive():
                raise RuntimeError("the gateway server stopped during startup")
        return self

    def stop(self) -> None:
        """Stop serving and wait for the thread."""
        self._server.should_exit = True
        self._thread.join()
        self._sock.close()

    def __enter__(self) -> RunningGateway:
        return self if self._thread.is_alive() else self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start(
    gateway: Gateway,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    model_name: str = "uniagent-gateway",
    peers: Sequence[str] | None = None,
) -> RunningGateway:
    """Serve ``gateway`` on a background thread (``port=0``: a free port); with ``peers``
    (networks), only to clients in them."""
    return RunningGateway(gateway, host, port, model_name, peers=peers).start()


def serve(
    gateway: Gateway,
    *,
    host: str = "127.0.0.1",
    port: int = 8400,
    model_name: str = "uniagent-gateway",
) -> None:
    """Serve ``gateway`` in this thread until interrupted."""
    uvicorn.run(
        create_app(gateway, model_name=model_name),
        host=host,
        port=port,
        log_level="warning",
        lifespan="off",
    )
