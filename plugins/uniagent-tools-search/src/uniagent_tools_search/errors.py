"""Errors of the search plugin; each message says what was wrong and what to do."""

from __future__ import annotations

from uniagent import ConfigError, UniAgentError


class SearchError(UniAgentError):
    """Base class of the search plugin's errors."""


class CorpusError(SearchError, ValueError):
    """A corpus file is malformed; the message names the file and line."""


class SearchIndexError(SearchError):
    """An index directory is missing, incomplete or from another format version."""


class BackendError(SearchError):
    """A search backend failed (an upstream API, a missing document)."""

    def __init__(self, message: str, *, status: int = 502, kind: str = "upstream_error") -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind


__all__ = ["BackendError", "ConfigError", "CorpusError", "SearchError", "SearchIndexError"]
