"""The ``arxiv`` backend: the arXiv API's query format, Atom answers parsed with feedparser.

A free-text query becomes ``all:`` terms joined with ``AND``; a query that already uses
the API's syntax (``ti:``, ``au:``, ``abs:``, ``cat:``, ``AND``/``OR``/``ANDNOT``) is
passed on. A category adds ``AND cat:<category>``, dates add
``AND submittedDate:[YYYYMMDD0000 TO YYYYMMDD2359]``. Requests are spaced by
``min_interval`` seconds, as arXiv's terms of use ask (3 s).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import re
import time
from typing import Any
from urllib.parse import urlencode

import feedparser

from uniagent_tools_search.backends import SearchQuery, SearchResult
from uniagent_tools_search.backends.http import Upstream, upstream_status_error
from uniagent_tools_search.config import ArxivSettings
from uniagent_tools_search.corpus import Document
from uniagent_tools_search.errors import BackendError

_FIELDED = re.compile(r"\b(ti|au|abs|co|jr|cat|rn|id|all|submittedDate):|\b(AND|OR|ANDNOT)\b")
_CATEGORY = re.compile(r"^[a-z][a-z-]*(\.[A-Za-z][A-Za-z-]*)?$")
_WORD = re.compile(r"[\w.+-]+", re.UNICODE)
_ABS_ID = re.compile(r"arxiv\.org/abs/(.+)$")


def search_query(
    text: str,
    category: str | None = None,
    date_from: dt.date | None = None,
    date_to: dt.date | None = None,
) -> str:
    """The API's ``search_query`` for a free-text (or already fielded) query and filters."""
    if _FIELDED.search(text):
        base = f"({text.strip()})"
    else:
        words = [w for w in _WORD.findall(text) if w.strip(".+-")]
        if not words:
            raise BackendError(
                "the query has no words to search for", status=400, kind="bad_request"
            )
        base = " AND ".join(f"all:{w}" for w in words)
        base = f"({base})" if len(words) > 1 else base
    parts = [base]
    if category:
        if not _CATEGORY.match(category):
            raise BackendError(
                f"{category!r} is not an arXiv category (e.g. cs.LG, hep-th, math.CO)",
                status=400,
                kind="bad_request",
            )
        parts.append(f"cat:{category}")
    if date_from or date_to:
        low = (date_from or dt.date(1991, 1, 1)).strftime("%Y%m%d") + "0000"
        high = (date_to or dt.date(9999, 12, 31)).strftime("%Y%m%d") + "2359"
        parts.append(f"submittedDate:[{low} TO {high}]")
    return " AND ".join(parts)


def _short_id(entry_id: str) -> str:
    match = _ABS_ID.search(entry_id)
    return match.group(1) if match else entry_id


def _clean(text: str) -> str:
    return " ".join(str(text or "").split())


def parse_feed(raw: bytes, snippet_chars: int) -> list[SearchResult]:
    """Results from an arXiv Atom feed; the API's error entries raise BackendError."""
    feed = feedparser.parse(raw)
    if feed.get("bozo") and not feed.entries:
        raise BackendError(
            f"the arXiv API answered something that is not Atom: {feed.bozo_exception}"
        )
    results = []
    for entry in feed.entries:
        entry_id = str(entry.get("id", ""))
        if "/api/errors" in entry_id:  # arXiv reports bad queries as a feed with one entry
            raise BackendError(
                f"arXiv rejected the query: {_clean(entry.get('summary', ''))}",
                status=400,
                kind="bad_request",
            )
        summary = _clean(entry.get("summary", ""))
        if len(summary) > snippet_chars:
            summary = summary[:snippet_chars].rsplit(" ", 1)[0] + " …"
        pdf = next(
            (link.get("href") for link in entry.get("links", []) if link.get("title") == "pdf"),
            None,
        )
        metadata: dict[str, Any] = {
            "authors": [a.get("name") for a in entry.get("authors", []) if a.get("name")],
            "published": str(entry.get("published", ""))[:10],
            "updated": str(entry.get("updated", ""))[:10],
            "primary_category": (entry.get("arxiv_primary_category") or {}).get("term"),
            "categories": [t.get("term") for t in entry.get("tags", []) if t.get("term")],
        }
        for key, name in (
            ("arxiv_comment", "comment"),
            ("arxiv_journal_ref", "journal_ref"),
            ("arxiv_doi", "doi"),
        ):
            if entry.get(key):
                metadata[name] = _clean(entry[key])
        if pdf:
            metadata["pdf_url"] = pdf
        results.append(
            SearchResult(
                id=_short_id(entry_id),
                title=_clean(entry.get("title", "")),
                snippet=summary,
                url=entry_id or None,
                metadata=metadata,
            )
        )
    return results


class ArxivBackend:
    """Searches arXiv through its public API."""

    name = "arxiv"
    fetchable = False

    def __init__(self, settings: ArxivSettings, *, snippet_chars: int = 300) -> None:
        self.settings = settings
        self.snippet_chars = snippet_chars
        self.upstream = Upstream("arXiv", timeout=settings.timeout, max_concurrency=1)
        self._spacing = asyncio.Lock()
        self._last = float("-inf")

    async def _wait_turn(self) -> None:
        async with self._spacing:
            delay = self._last + self.settings.min_interval - time.monotonic()
            if delay > 0:  # arXiv's rate limit, not a test synchronisation
                await asyncio.sleep(delay)
            self._last = time.monotonic()

    async def search(self, query: SearchQuery) -> list[SearchResult]:
        """Most relevant first, at most ``top_k``."""
        params = {
            "search_query": search_query(
                query.query, query.category, query.date_from, query.date_to
            ),
            "start": 0,
            "max_results": query.top_k,
            "sortBy": "relevance",
            "sortOrder": "descending",
        }
        await self._wait_turn()
        status, raw, _ = await self.upstream.request(
            "GET", f"{self.settings.url}?{urlencode(params)}"
        )
        if not 200 <= status < 300:
            raise upstream_status_error("arXiv", status, raw)
        results = await asyncio.to_thread(parse_feed, raw, self.snippet_chars)
        return results[: query.top_k]

    async def fetch(self, doc_id: str) -> Document:
        """arXiv papers are not fetched (cite the id or URL instead)."""
        raise BackendError("arXiv results cannot be fetched", status=404, kind="not_found")

    def describe(self) -> dict[str, Any]:
        """The endpoint."""
        return {"url": self.settings.url, "min_interval": self.settings.min_interval}

    async def close(self) -> None:
        """Close the HTTP session."""
        await self.upstream.close()
