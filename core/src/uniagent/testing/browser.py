"""Headless Chromium for browser tests and benches: Debian's ``chromium`` driven by Playwright.

Playwright's own browser download does not work on machines without internet, so this
launches the system's Chromium (``apt-get install chromium``; ``$UNIAGENT_CHROMIUM``
names another binary) with the flags a closed network and no GPU need.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from uniagent.errors import UniAgentError

CHROMIUM = "/usr/bin/chromium"
#: Without the networking flags Chromium keeps trying (and failing) to reach Google's
#: hosts; --no-sandbox because tests often run as root in containers.
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)


def chromium_path() -> str:
    """The Chromium binary: ``$UNIAGENT_CHROMIUM`` or Debian's ``/usr/bin/chromium``."""
    return os.environ.get("UNIAGENT_CHROMIUM", CHROMIUM)


def launch_chromium(playwright: Any) -> Any:
    """A headless Chromium from a started Playwright (``sync_playwright().start()``).

    Playwright gives each launch a fresh, empty profile of its own.
    """
    path = chromium_path()
    if not Path(path).exists():
        raise UniAgentError(
            f"no Chromium at {path}: apt-get install chromium, or set UNIAGENT_CHROMIUM"
        )
    return playwright.chromium.launch(executable_path=path, args=list(CHROMIUM_FLAGS))
