"""The built-in tool-call parsers, registered through ``uniagent_tool_parsers``."""

from __future__ import annotations

from collections.abc import Iterable

from uniagent.hookspecs import hookimpl
from uniagent.parsers import HermesParser, Qwen3CoderParser
from uniagent.specs import ParserSpec


@hookimpl
def uniagent_tool_parsers() -> Iterable[ParserSpec]:
    """``hermes`` and ``qwen3_coder``."""
    yield ParserSpec(
        name="hermes",
        factory=HermesParser,
        description='<tool_call>{"name": ..., "arguments": {...}}</tool_call> (Qwen2.5/Qwen3)',
    )
    yield ParserSpec(
        name="qwen3_coder",
        factory=Qwen3CoderParser,
        description="<tool_call><function=NAME><parameter=P>value</parameter>... (Qwen3-Coder)",
    )
