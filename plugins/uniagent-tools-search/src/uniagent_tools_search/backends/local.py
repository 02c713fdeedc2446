"""The ``local`` backend: the BM25 index of a corpus, queried on worker threads."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from uniagent_tools_search.backends import SearchQuery, SearchResult
from uniagent_tools_search.corpus import Document
from uniagent_tools_search.errors import BackendError
from uniagent_tools_search.index import LocalIndex


class LocalBackend:
    """Ranks the documents of a local index; :meth:`fetch` returns them by id."""

    name = "local"
    fetchable = True

    def __init__(self, directory: str | Path, *, threads: int = 4, snippet_chars: int = 300):
        self.index = LocalIndex(directory)
        self.snippet_chars = snippet_chars
        # BM25 scoring is numpy work that releases the GIL in parts; threads keep the
        # event loop answering while queries run.
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="bm25")

    async def search(self, query: SearchQuery) -> list[SearchResult]:
        """BM25 over the corpus; documents without any query term are left out."""
        if query.category or query.date_from or query.date_to:
            raise BackendError(
                "the local corpus has no categories or dates; search without filters",
                status=400,
                kind="bad_request",
            )
        loop = asyncio.get_running_loop()
        hits = await loop.run_in_executor(
            self._pool, self.index.search, query.query, query.top_k, self.snippet_chars
        )
        return [
            SearchResult(
                id=hit.document.id,
                title=hit.document.title,
                snippet=hit.snippet,
                url=hit.document.url,
                score=round(hit.score, 4),
            )
            for hit in hits
        ]

    async def fetch(self, doc_id: str) -> Document:
        """The document with this id."""
        doc = self.index.by_id.get(doc_id)
        if doc is None:
            raise BackendError(
                f"no document with id {doc_id!r} in the local corpus; use an id from the "
                "search results",
                status=404,
                kind="not_found",
            )
        return doc

    def describe(self) -> dict[str, Any]:
        """Document count and index directory."""
        return {"documents": len(self.index), "index": str(self.index.directory)}

    async def close(self) -> None:
        """Stop the worker threads."""
        self._pool.shutdown(wait=False, cancel_futures=True)
