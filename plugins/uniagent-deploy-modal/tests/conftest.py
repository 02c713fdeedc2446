"""Fixtures: Modal's cloud faked at ``App.lookup`` + ``Sandbox.create`` (see modal_fakes)."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import modal
import pytest
from modal_fakes import FakeModal, Method


@pytest.fixture
def fake_modal(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeModal]:
    """Replace ``modal.App.lookup`` and ``modal.Sandbox.create`` by local fakes."""
    with tempfile.TemporaryDirectory(prefix="fake-modal-") as tmp:
        fake = FakeModal(workdir=Path(tmp))
        monkeypatch.setattr(modal.App, "lookup", Method(fake.lookup))

        def no_sync_create(*args: Any, **kwargs: Any) -> Any:
            raise AssertionError("Sandbox.create must be awaited via .aio in async code")

        monkeypatch.setattr(modal.Sandbox, "create", Method(no_sync_create, fake.create))
        try:
            yield fake
        finally:
            for sandbox in fake.sandboxes:
                sandbox.kill()


@pytest.fixture(autouse=True)
def _fresh_registry() -> Iterator[None]:
    """Each test sees the plugins as installed now, and leaves no cached registry behind."""
    from uniagent import reset_plugins

    reset_plugins()
    yield
    reset_plugins()
