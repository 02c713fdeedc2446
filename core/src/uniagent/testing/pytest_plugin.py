"""pytest plugin shipped with uniagent: fixtures for plugin authors.

Loaded automatically wherever uniagent is installed; keep imports light.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture
def uniagent_registry() -> Iterator[object]:
    """A fresh, fully loaded registry; reset afterwards so tests do not leak plugins."""
    from uniagent.plugins import reset_plugins
    from uniagent.registry import get_registry

    reset_plugins()
    yield get_registry()
    reset_plugins()
