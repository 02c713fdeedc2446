"""Settings of the search service (``services: {search: ...}`` and ``uniagent-search serve``)."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlparse

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from uniagent.sandbox import SANDBOX_UID

DEFAULT_ARXIV_URL = "https://export.arxiv.org/api/query"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _http_url(value: str) -> str:
    parsed = urlparse(value)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise ValueError(f"{value!r} is not an http(s) URL")
    return value


class WebSearchSettings(_Strict):
    """A web search API in the Perplexity / LiteLLM ``search`` format.

    ``POST url`` with ``{"query": ..., "max_results": N, **extra_body}`` and
    ``Authorization: Bearer $<api_key_env>``; the answer holds ``results``, a list of
    ``{title, url, snippet, date?}`` (``content`` or ``description`` are read when
    ``snippet`` is missing, as Tavily and Brave name it).
    """

    url: str = Field(description="the search endpoint, e.g. http://localhost:4000/v1/search/brave")
    api_key_env: str | None = Field(
        "SEARCH_API_KEY",
        description="environment variable (of the run, never the sandbox) holding the API key; "
        "null: send no key",
    )
    extra_body: dict[str, Any] = Field(
        default_factory=dict, description="more request fields, e.g. {country: US}"
    )
    timeout: float = Field(30.0, gt=0, description="seconds per upstream request")
    max_concurrency: int = Field(8, ge=1, description="upstream requests at once")

    @field_validator("url")
    @classmethod
    def _http(cls, value: str) -> str:
        return _http_url(value)


class ArxivSettings(_Strict):
    """The arXiv API (``export.arxiv.org/api/query``, Atom answers)."""

    url: str = Field(DEFAULT_ARXIV_URL, description="the arXiv API query endpoint")
    min_interval: float = Field(
        3.0, ge=0, description="seconds between upstream requests (arXiv asks for 3)"
    )
    timeout: float = Field(30.0, gt=0, description="seconds per upstream request")

    @field_validator("url")
    @classmethod
    def _http(cls, value: str) -> str:
        return _http_url(value)


class SearchServiceConfig(_Strict):
    """The retrieval service: which backends it serves and where it listens."""

    index: str | None = Field(
        None, description="local backend: an index directory built by `uniagent-search index`"
    )
    web: WebSearchSettings | None = Field(None, description="web backend settings")
    arxiv: ArxivSettings | None = Field(None, description="arxiv backend settings")
    default_backend: Literal["local", "web"] | None = Field(
        None, description="backend of the `search` tool (default: local if index, else web)"
    )
    unix_socket: str | None = Field(
        None,
        description="listen on this Unix socket (what bubblewrap sandboxes reach); its "
        "directory is created with mode 0700 (0710 with socket_group)",
    )
    socket_group: int | None = Field(
        default_factory=lambda: SANDBOX_UID if os.geteuid() == 0 else None,
        ge=0,
        description="gid that may connect to the Unix socket besides this user (the socket "
        "0660, its directory 0710, both of that group). Default: when the service runs as "
        "root, the group bubblewrap sandboxes started by root run as (the host deployment's "
        "sandbox_uid, 65534 unless set); otherwise none: sandboxes run as this user",
    )
    host: str = Field("127.0.0.1", description="TCP address (loopback only)")
    port: int | None = Field(
        None, ge=0, le=65535, description="TCP port (0: any free one; null: no TCP listener)"
    )
    cache_size: int = Field(4096, ge=0, description="results kept in the LRU cache (0: none)")
    cache_ttl: float = Field(
        86400.0, gt=0, description="seconds a web or arXiv result stays cached"
    )
    threads: int = Field(4, ge=1, description="threads that run BM25 queries")
    snippet_chars: int = Field(300, ge=40, description="length of result snippets")
    max_fetch_chars: int = Field(
        20000, ge=100, description="most characters fetch_document returns at once"
    )
    startup_timeout: float = Field(120.0, gt=0, description="seconds to load and start")
    log_file: str | None = Field(None, description="service log (default: discarded)")

    @field_validator("index", "unix_socket", "log_file")
    @classmethod
    def _absolute(cls, value: str | None) -> str | None:
        # The service runs as its own process: relative paths are fixed here, once.
        return str(Path(value).expanduser().absolute()) if value else value

    @field_validator("unix_socket")
    @classmethod
    def _short_enough(cls, value: str | None) -> str | None:
        if value and len(value.encode()) > 100:
            raise ValueError(f"Unix socket paths must be under 100 bytes, {value!r} is longer")
        return value

    @field_validator("host")
    @classmethod
    def _loopback(cls, value: str) -> str:
        if value != "localhost" and not ipaddress.ip_address(value).is_loopback:
            raise ValueError(f"the service listens on loopback only, not {value!r}")
        return value

    @model_validator(mode="after")
    def _usable(self) -> SearchServiceConfig:
        if not (self.index or self.web or self.arxiv):
            raise ValueError("no backend: give index (local), web or arxiv")
        if self.unix_socket is None and self.port is None:
            raise ValueError("nowhere to listen: give unix_socket or port")
        default = self.default_backend
        if default == "local" and not self.index or default == "web" and not self.web:
            raise ValueError(f"default_backend {default!r} is not configured")
        return self

    def search_backend(self) -> str | None:
        """The backend answering requests that name none (the `search` tool)."""
        if self.default_backend:
            return self.default_backend
        return "local" if self.index else ("web" if self.web else None)
