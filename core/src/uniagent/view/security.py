"""What keeps other web pages out of ``uniagent view``: the ``Host`` check and the headers
every response carries (a Content-Security-Policy that allows no inline script).

DNS rebinding is the threat the ``Host`` check answers: a page on ``evil.example`` points
its name at 127.0.0.1 and then reads the viewer as its own origin. Such a request always
carries the attacker's *name* as ``Host``. So the viewer answers a ``Host`` that is an IP
address (a browser sends one only when the user typed that address, whatever the page),
and the few names that mean this machine: ``localhost``, the name given to ``--host``,
and, bound to a non-loopback address, the machine's own host names.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # starlette is the view extra's: `uniagent view` says if it is missing
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

#: Scripts and styles only from the viewer's own /static files: a model's output that
#: somehow reached the page as HTML could still not run script (no inline, no eval).
CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",
        "connect-src 'self'",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    ]
)
SECURITY_HEADERS = [
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
]


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and ``localhost``."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def is_wildcard(host: str) -> bool:
    """True for the any-address binds (``0.0.0.0``, ``::``, empty)."""
    if host in ("", "*"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_unspecified
    except ValueError:
        return False


def host_names(bound: str) -> frozenset[str]:
    """The ``Host`` names (not addresses: any address is answered) accepted when the
    server is bound to ``bound``."""
    names = {"localhost", bound.strip("[]").lower()}
    if not is_loopback(bound):  # reachable from elsewhere, by this machine's names too
        for name in (socket.gethostname(), _fqdn()):
            if name:
                names.add(name.lower())
    return frozenset(n for n in names if n and not _is_address(n))


def host_allowed(header: str, names: Iterable[str]) -> bool:
    """Whether a request whose ``Host`` header is ``header`` is answered."""
    host = header.strip().lower()
    if host.startswith("["):  # [v6] or [v6]:port
        address, closed, rest = host[1:].partition("]")
        if not closed or (rest and not rest.startswith(":")):
            return False
        return _is_address(address) and _is_port(rest[1:])
    if host.count(":") > 1:  # a bare IPv6 address (no port can follow it)
        return _is_address(host)
    name, _, port = host.partition(":")
    name = name.rstrip(".")  # "localhost." is localhost
    return bool(name) and _is_port(port) and (_is_address(name) or name in names)


class Guard:
    """ASGI middleware: refuse requests for other host names (400), and add
    :data:`SECURITY_HEADERS` to every response."""

    def __init__(self, app: ASGIApp, names: Iterable[str]) -> None:
        """Guard ``app``, answering the host ``names`` and every IP address."""
        self.app = app
        self.names = frozenset(n.lower() for n in names)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Check the ``Host`` of an HTTP request, then pass it on with the headers added."""
        from starlette.datastructures import Headers
        from starlette.responses import PlainTextResponse

        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS]
            await send(message)

        host = Headers(scope=scope).get("host", "")
        if not host_allowed(host, self.names):
            response = PlainTextResponse(
                f"Invalid host header {host!r}: open the viewer by its address "
                "(e.g. http://127.0.0.1:PORT/) or a name of this machine",
                status_code=400,
            )
            await response(scope, receive, send_with_headers)
            return
        await self.app(scope, receive, send_with_headers)


def _is_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _is_port(text: str) -> bool:
    return text == "" or (text.isascii() and text.isdigit() and len(text) <= 5)


def _fqdn() -> str:
    try:
        return socket.getfqdn()
    except OSError:
        return ""
