"""Prompt text the framework adds itself."""

from __future__ import annotations

import json
from collections.abc import Sequence

from uniagent.parsers import ToolCallParser
from uniagent.specs import ToolSpec


def tool_instructions(tools: Sequence[ToolSpec], parser: ToolCallParser) -> str:
    """The tool schemas and the call format, for models whose chat template drops tools."""
    schemas = "\n".join(
        json.dumps(t.openai_schema()["function"], ensure_ascii=False) for t in tools
    )
    return (
        "# Tools\n\nYou can call the following functions:\n<tools>\n"
        f"{schemas}\n</tools>\n\nTo call a function, write it exactly like this:\n"
        f"{parser.format_example(tools)}"
    )
