"""The ``web`` backend: a web search API in the Perplexity / LiteLLM ``search`` format."""

from __future__ import annotations

import json
import os
from typing import Any

from uniagent_tools_search.backends import SearchQuery, SearchResult
from uniagent_tools_search.backends.http import Upstream, upstream_status_error
from uniagent_tools_search.config import WebSearchSettings
from uniagent_tools_search.corpus import Document
from uniagent_tools_search.errors import BackendError, SearchError

_SNIPPET_KEYS = ("snippet", "content", "description", "text")


class WebBackend:
    """``POST url {"query", "max_results"}`` with a bearer key from the run's environment."""

    name = "web"
    fetchable = False

    def __init__(self, settings: WebSearchSettings, *, snippet_chars: int = 300) -> None:
        self.settings = settings
        self.snippet_chars = snippet_chars
        self.api_key: str | None = None
        if settings.api_key_env:
            self.api_key = os.environ.get(settings.api_key_env)
            if not self.api_key:
                raise SearchError(
                    f"the web search backend needs its API key in ${settings.api_key_env} (the "
                    "environment of the run, not the sandbox's); set it, or set "
                    "web.api_key_env: null for an API without keys"
                )
        self.upstream = Upstream(
            "web search", timeout=settings.timeout, max_concurrency=settings.max_concurrency
        )

    async def search(self, query: SearchQuery) -> list[SearchResult]:
        """Ask the API; results keep its order."""
        if query.category or query.date_from or query.date_to:
            raise BackendError(
                "web search takes no category or date filters", status=400, kind="bad_request"
            )
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        body = {**self.settings.extra_body, "query": query.query, "max_results": query.top_k}
        status, raw, _ = await self.upstream.request(
            "POST", self.settings.url, data=json.dumps(body), headers=headers
        )
        if not 200 <= status < 300:
            raise upstream_status_error("web search", status, raw)
        try:
            data = json.loads(raw)
            items = data["results"]
            if not isinstance(items, list):
                raise TypeError("results is not a list")
        except (ValueError, KeyError, TypeError) as exc:
            raise BackendError(
                f'the web search API answered something other than {{"results": [...]}}: {exc}'
            ) from None
        return [self._result(item) for item in items[: query.top_k] if isinstance(item, dict)]

    def _result(self, item: dict[str, Any]) -> SearchResult:
        snippet = next((str(item[k]) for k in _SNIPPET_KEYS if item.get(k)), "")
        snippet = " ".join(snippet.split())
        if len(snippet) > self.snippet_chars:
            snippet = snippet[: self.snippet_chars].rsplit(" ", 1)[0] + " …"
        url = str(item.get("url") or "")
        metadata = {k: item[k] for k in ("date", "last_updated") if item.get(k)}
        return SearchResult(
            id=url,
            title=str(item.get("title") or url),
            snippet=snippet,
            url=url or None,
            metadata=metadata,
        )

    async def fetch(self, doc_id: str) -> Document:
        """Web pages are not fetched (the sandbox has no network; cite the URL instead)."""
        raise BackendError("web results cannot be fetched", status=404, kind="not_found")

    def describe(self) -> dict[str, Any]:
        """The endpoint (never the key)."""
        return {"url": self.settings.url, "authenticated": bool(self.api_key)}

    async def close(self) -> None:
        """Close the HTTP session."""
        await self.upstream.close()
