"""Search backends behind one interface: the local index, a web search API, arXiv.

A backend answers :class:`SearchQuery` objects with :class:`SearchResult` lists and may
return whole documents by id (:meth:`Backend.fetch`; only the local corpus does). The
service (:mod:`uniagent_tools_search.server`) owns the backends, caches their answers
and is the only part that holds API keys: the sandbox never sees them.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any, Protocol

from uniagent_tools_search.corpus import Document


@dataclass(frozen=True)
class SearchQuery:
    """What a tool asks: the query text, how many results, optional filters (arXiv)."""

    query: str
    top_k: int = 5
    category: str | None = None
    date_from: dt.date | None = None
    date_to: dt.date | None = None

    def cache_key(self, backend: str) -> str:
        """Equal for requests that must get the same answer (white space normalised)."""
        return "\x1f".join(
            (
                backend,
                " ".join(self.query.split()),
                str(self.top_k),
                self.category or "",
                str(self.date_from or ""),
                str(self.date_to or ""),
            )
        )


@dataclass(frozen=True)
class SearchResult:
    """One result: an id the agent can fetch (local) or cite, a title and a snippet."""

    id: str
    title: str
    snippet: str
    url: str | None = None
    score: float | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The API form of the result."""
        return {
            "id": self.id,
            "title": self.title,
            "snippet": self.snippet,
            "url": self.url,
            "score": self.score,
            "metadata": self.metadata,
        }


class Backend(Protocol):
    """A source of search results."""

    name: str
    #: Whether :meth:`fetch` returns documents.
    fetchable: bool

    async def search(self, query: SearchQuery) -> list[SearchResult]:
        """The ranked results (raises ``BackendError`` on upstream failure)."""
        ...

    async def fetch(self, doc_id: str) -> Document:
        """The whole document (raises ``BackendError`` with status 404 if unknown)."""
        ...

    def describe(self) -> dict[str, Any]:
        """What ``GET /health`` says about this backend."""
        ...

    async def close(self) -> None:
        """Release connections and threads."""
        ...
