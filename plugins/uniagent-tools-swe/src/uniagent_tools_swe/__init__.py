"""SWE tools for uniagent: execute_bash, str_replace_editor, submit and finish."""

from __future__ import annotations

from uniagent_tools_swe.blocking import DEFAULT_BLOCKED, BlockRule, screen
from uniagent_tools_swe.tools import (
    BLOCKED_EXIT_CODE,
    DEFAULT_SUBMIT_EXCLUDE,
    SCRIPTS_DIR,
    ExecuteBashSettings,
    SubmitSettings,
    make_execute_bash,
    make_finish,
    make_str_replace_editor,
    make_submit,
    make_tools,
)

__all__ = [
    "BLOCKED_EXIT_CODE",
    "DEFAULT_BLOCKED",
    "DEFAULT_SUBMIT_EXCLUDE",
    "SCRIPTS_DIR",
    "BlockRule",
    "ExecuteBashSettings",
    "SubmitSettings",
    "make_execute_bash",
    "make_finish",
    "make_str_replace_editor",
    "make_submit",
    "make_tools",
    "screen",
]
