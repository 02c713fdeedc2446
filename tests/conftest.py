"""Fixtures of the cross-package tests: the example task set, a TMPDIR to find sandboxes in."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tasks(tmp_path_factory) -> Path:
    """The swe_tiny example tasks (six small repositories with a bug each)."""
    out = tmp_path_factory.mktemp("swe_tiny")
    subprocess.run(
        [sys.executable, str(ROOT / "examples" / "swe_tiny" / "make_tasks.py"), str(out)],
        check=True,
        capture_output=True,
    )
    return out / "tasks.jsonl"


@pytest.fixture
def sandbox_tmp(tmp_path) -> Path:
    """A TMPDIR for the run, so the test can find any sandbox left behind."""
    path = tmp_path / "sandbox-tmp"
    path.mkdir()
    return path
