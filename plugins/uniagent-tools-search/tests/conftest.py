"""Fixtures: the real example corpus and index, the fake remote APIs, a running service."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from upstream import WEB_KEY, WEB_KEY_VARIABLE, FakeUpstream

from uniagent_tools_search.config import ArxivSettings, SearchServiceConfig, WebSearchSettings
from uniagent_tools_search.example_data import write_example
from uniagent_tools_search.index import build_index
from uniagent_tools_search.service import SearchServiceProcess, start_search_service

#: Sockets live outside /tmp, where other tests' directories come and go.
SOCKET_PARENT = "/var/tmp"


@pytest.fixture(scope="session")
def example(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """corpus.jsonl (about 10,000 Wikipedia lead sections) and tasks.jsonl (FanOutQA)."""
    return write_example(tmp_path_factory.mktemp("example"))


@pytest.fixture(scope="session")
def index_dir(example: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A BM25 index of the example corpus."""
    out = tmp_path_factory.mktemp("index")
    build_index(example["corpus"], out)
    return out


def private_dir() -> Path:
    """A fresh 0700 directory for a Unix socket, outside /tmp."""
    return Path(tempfile.mkdtemp(prefix="uniagent-search-test-", dir=SOCKET_PARENT))


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    """A private directory for one test's socket, removed afterwards."""
    path = private_dir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def upstream() -> Iterator[FakeUpstream]:
    """The arXiv and web-search stand-ins."""
    with FakeUpstream() as server:
        yield server


@pytest.fixture(scope="session")
def service_config(index_dir: Path, upstream: FakeUpstream) -> Iterator[SearchServiceConfig]:
    """Settings serving all three backends on a Unix socket and a TCP port."""
    folder = private_dir()
    yield SearchServiceConfig(
        index=str(index_dir),
        web=WebSearchSettings(url=upstream.web_url, api_key_env=WEB_KEY_VARIABLE),
        arxiv=ArxivSettings(url=upstream.arxiv_url, min_interval=0),
        unix_socket=str(folder / "search.sock"),
        port=0,
    )
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def service(service_config: SearchServiceConfig) -> Iterator[SearchServiceProcess]:
    """The service as a run starts it: a child process, ready when this returns."""
    os.environ[WEB_KEY_VARIABLE] = WEB_KEY  # the run's environment, inherited by the child
    try:
        handle = asyncio.run(start_search_service(service_config))
    finally:
        del os.environ[WEB_KEY_VARIABLE]
    yield handle
    asyncio.run(handle.stop())
