"""Stand-ins for the remote APIs (the narrowest seam): real HTTP servers on 127.0.0.1.

``/api/query`` answers like the arXiv API with recorded Atom feeds (``fixtures/``);
``/v1/search/web`` answers like a Perplexity / LiteLLM search endpoint. Every request
is recorded, so tests can check what the backends sent.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

if TYPE_CHECKING:  # pragma: no cover
    from typing_extensions import Self

FIXTURES = Path(__file__).parent / "fixtures"
#: The web API key of the run: the service gets it, the sandbox must never see it.
WEB_KEY_VARIABLE = "UNIAGENT_TEST_WEB_SEARCH_KEY"
WEB_KEY = "sk-test-never-in-the-sandbox"

WEB_RESULTS = [
    {
        "title": "Mount Everest - Wikipedia",
        "url": "https://en.wikipedia.org/wiki/Mount_Everest",
        "snippet": "Mount Everest is Earth's highest mountain above sea level, located in the "
        "Mahalangur Himal sub-range of the Himalayas.",
        "date": "2024-02-01",
        "last_updated": "2024-03-01",
    },
    {
        "title": "Everest height: 8,848.86 m | National Geographic",
        "url": "https://www.nationalgeographic.com/everest-height",
        "content": "In 2020 China and Nepal jointly announced a new height, 8,848.86 metres.",
    },
]


@dataclass
class Seen:
    """One request the fake upstream received."""

    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: Any


class FakeUpstream:
    """``with FakeUpstream() as up: up.arxiv_url, up.web_url, up.requests``."""

    def __init__(self) -> None:
        self.requests: list[Seen] = []
        self._lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _record(self, body: Any) -> Seen:
                parts = urlsplit(self.path)
                seen = Seen(
                    self.command,
                    parts.path,
                    parse_qs(parts.query),
                    {k.lower(): v for k, v in self.headers.items()},
                    body,
                )
                with owner._lock:
                    owner.requests.append(seen)
                return seen

            def _send(self, status: int, payload: bytes, kind: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def do_GET(self) -> None:
                seen = self._record(None)
                query = " ".join(seen.query.get("search_query", [""]))
                if seen.path != "/api/query":
                    self._send(404, b"not found", "text/plain")
                elif "overload" in query:
                    self._send(503, b"Rate exceeded.", "text/plain")
                else:
                    name = (
                        "error"
                        if "badquery" in query
                        else "attention"
                        if "attention" in query
                        else "empty"
                    )
                    data = (FIXTURES / f"arxiv_{name}.xml").read_bytes()
                    self._send(200, data, "application/atom+xml; charset=utf-8")

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                self._record(body)
                if self.path != "/v1/search/web":
                    self._send(404, b"{}", "application/json")
                elif body.get("query") == "boom":
                    self._send(500, b'{"error": "upstream exploded"}', "application/json")
                else:
                    answer = {"object": "search", "results": WEB_RESULTS[: body["max_results"]]}
                    self._send(200, json.dumps(answer).encode(), "application/json")

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    @property
    def base(self) -> str:
        """``http://127.0.0.1:PORT``."""
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    @property
    def arxiv_url(self) -> str:
        """The arXiv API stand-in's query endpoint."""
        return f"{self.base}/api/query"

    @property
    def web_url(self) -> str:
        """The search API stand-in's endpoint."""
        return f"{self.base}/v1/search/web"

    def seen(self, path: str) -> list[Seen]:
        """The requests received on ``path``."""
        with self._lock:
            return [r for r in self.requests if r.path == path]
