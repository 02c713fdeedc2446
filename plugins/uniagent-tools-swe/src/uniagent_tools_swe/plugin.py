"""The ``uniagent`` entry point of uniagent-tools-swe: contributes the four SWE tools."""

from __future__ import annotations

from collections.abc import Iterator

import uniagent

from uniagent_tools_swe.tools import make_tools


@uniagent.hookimpl
def uniagent_tools() -> Iterator[uniagent.ToolSpec]:
    """execute_bash, str_replace_editor, submit and finish, with their default settings."""
    yield from make_tools()
