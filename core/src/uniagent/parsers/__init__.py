"""Tool-call parsers: model text (or chat-API ``tool_calls``) → validated :class:`ToolCall` s.

Built-in formats: ``hermes`` (JSON in ``<tool_call>`` blocks) and ``qwen3_coder``
(Qwen3-Coder's XML). Plugins add more through ``uniagent_tool_parsers``; look a
parser up by name with :func:`uniagent.get_parser`.
"""

from __future__ import annotations

from uniagent.parsers.base import (
    ErrorKind,
    ParseResult,
    StructuredCalls,
    ToolCall,
    ToolCallFormatError,
    ToolCallParser,
    tool_calls_from_openai,
    validate_call,
)
from uniagent.parsers.hermes import HermesParser
from uniagent.parsers.qwen3_coder import Qwen3CoderParser
from uniagent.parsers.text import TaggedToolCallParser

__all__ = [
    "ErrorKind",
    "HermesParser",
    "ParseResult",
    "Qwen3CoderParser",
    "StructuredCalls",
    "TaggedToolCallParser",
    "ToolCall",
    "ToolCallFormatError",
    "ToolCallParser",
    "tool_calls_from_openai",
    "validate_call",
]
