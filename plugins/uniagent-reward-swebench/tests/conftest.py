"""Fixtures: the buggy repository and a real host sandbox."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from swebench_helpers import CalcRepo, make_calc_repo

from uniagent import open_env


@pytest.fixture
def calc_repo(tmp_path: Path) -> CalcRepo:
    """``add`` subtracts; the test patch adds tests for it (one in a new file)."""
    return make_calc_repo(tmp_path)


@pytest_asyncio.fixture
async def host_env() -> AsyncIterator[Any]:
    """A real host sandbox (uniagent's built-in ``host`` deployment), closed afterwards."""

    env = open_env({"type": "host", "isolation": "none"})
    await env.start()
    try:
        yield env
    finally:
        await env.close()


@pytest.fixture(autouse=True)
def _fresh_registry() -> Iterator[None]:
    """Each test sees the plugins as installed now."""
    from uniagent import reset_plugins

    reset_plugins()
    yield
    reset_plugins()
