"""The scanning shared by parsers of ``<tool_call>...</tool_call>`` blocks in model text."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from uniagent.parsers.base import (
    ErrorKind,
    ParseResult,
    ToolCall,
    ToolCallFormatError,
    WireCall,
    check_count,
    example_call,
    format_error,
    validate_call,
)
from uniagent.specs import ToolSpec


@dataclass
class RawCall:
    """A call as found in the text, before validation."""

    name: Any
    arguments: Any


class BlockError(Exception):
    """Raised by ``_parse_block``; turned into a :class:`ToolCallFormatError` by ``parse``."""

    def __init__(self, problem: str, kind: ErrorKind, tool: str | None = None) -> None:
        super().__init__(problem)
        self.problem, self.kind, self.tool = problem, kind, tool


class TaggedToolCallParser(ABC):
    """Base of parsers whose calls sit in ``<tool_call>...</tool_call>`` blocks.

    A leading ``<think>...</think>`` block (or, when the template opened it in
    the prompt, text up to a ``</think>`` before any call) is reasoning: it is
    kept in ``content`` but never scanned for calls (a model may mention the
    tags while thinking). ``think_tags=None`` turns this off.
    """

    name: str = ""
    stop_sequences: tuple[str, ...] = ()
    open_tag = "<tool_call>"
    close_tag = "</tool_call>"
    #: Text that shows a call written without its ``<tool_call>`` wrapper.
    bare_marker: str | None = None

    def __init__(self, think_tags: tuple[str, str] | None = ("<think>", "</think>")) -> None:
        self.think_tags = think_tags

    # -- to implement ------------------------------------------------------------------
    @abstractmethod
    def _parse_block(self, text: str, pos: int) -> tuple[RawCall, int]:
        """Parse one block whose body starts at ``pos``; return it and the index after it."""

    @abstractmethod
    def format_tool_call(self, call: ToolCall) -> str:
        """Render ``call`` exactly as the model would write it."""

    def _coerce(self, raw: RawCall, tools: Sequence[ToolSpec]) -> Any:
        """Arguments to validate (hook for formats whose values are untyped text)."""
        return raw.arguments

    def wire_arguments(
        self, name: str, arguments: dict[str, Any], tools: Sequence[Mapping[str, Any]] | None
    ) -> dict[str, Any]:
        """A call's arguments for a client, typed by its OpenAI tool schemas ``tools``
        (hook for formats whose values are untyped text; JSON formats are typed already)."""
        return arguments

    # -- shared ------------------------------------------------------------------------
    def format_tool_calls(self, calls: Sequence[ToolCall]) -> str:
        """Several calls as one block of text, separated by newlines."""
        return "\n".join(self.format_tool_call(c) for c in calls)

    def format_message(self, content: str, calls: Sequence[ToolCall]) -> str:
        """An assistant turn's text: the content, then the calls (as Qwen's template joins them)."""
        if not calls:
            return content
        return (content + "\n" if content else "") + self.format_tool_calls(calls)

    def format_example(self, tools: Sequence[ToolSpec]) -> str:
        """An example call of the first of ``tools``, for error messages."""
        return self.format_tool_call(example_call(tools))

    def format_tool_response(self, content: str) -> str:
        """``<tool_response>`` around the output, as Qwen/Hermes chat templates render it."""
        return f"<tool_response>\n{content}\n</tool_response>"

    def parse(
        self, text: str, tools: Sequence[ToolSpec], *, max_calls: int | None = None
    ) -> ParseResult:
        """Parse and validate every call in ``text``; raise :class:`ToolCallFormatError`."""
        start = self._scan_start(text, tools)
        segments = [text[:start]]
        raws: list[RawCall] = []
        try:
            for segment, raw in self._blocks(text, start, strict=True):
                segments.append(segment)
                if raw is not None:
                    raws.append(raw)
        except BlockError as exc:
            raise self._error(exc.problem, exc.kind, tools, text, tool=exc.tool) from None
        content = "\n".join(s.strip() for s in segments if s.strip())
        if not raws:
            problem = "no tool call found. Every reply must call a tool."
            if self.bare_marker and self.bare_marker in text[start:]:
                problem = (
                    f"no tool call found: wrap each call in {self.open_tag} ... {self.close_tag}."
                )
            raise format_error(
                problem,
                "no_tool_call",
                self,
                tools,
                content=content,
            )
        check_count(len(raws), max_calls, self, tools, content)
        calls = [
            validate_call(raw.name, self._coerce(raw, tools), tools, self, content=content)
            for raw in raws
        ]
        return ParseResult(content=content, tool_calls=calls)

    def read_calls(
        self, text: str, tools: Sequence[Mapping[str, Any]] | None
    ) -> tuple[str, list[WireCall]]:
        """The content outside the calls and each call's (name, arguments), unvalidated
        (:class:`~uniagent.parsers.base.CallReader`: what the gateway reads)."""
        segments: list[str] = []
        calls: list[WireCall] = []
        try:
            for segment, raw in self._blocks(text, 0, strict=False):
                segments.append(segment)
                if raw is None:
                    continue
                if not isinstance(raw.name, str) or not isinstance(raw.arguments, dict):
                    problem = "a call needs a string name and an object of arguments"
                    raise BlockError(problem, "malformed")
                calls.append((raw.name, self.wire_arguments(raw.name, dict(raw.arguments), tools)))
        except BlockError as exc:
            raise ToolCallFormatError(exc.problem, exc.kind, tool=exc.tool) from None
        content = "\n".join(s.strip() for s in segments if s.strip())
        return content, calls

    def _blocks(self, text: str, pos: int, *, strict: bool) -> Iterator[tuple[str, RawCall | None]]:
        """Each block from ``pos`` on, with the text before it; then the text after the last
        (with ``None``). Raises :class:`BlockError` for a malformed block and, ``strict``, for
        a closing tag without its opening tag."""
        while True:
            opening = text.find(self.open_tag, pos)
            closing = text.find(self.close_tag, pos) if strict else -1
            if closing != -1 and (opening == -1 or closing < opening):
                raise BlockError(
                    f"found {self.close_tag} without a matching {self.open_tag} before it.",
                    "malformed",
                )
            if opening == -1:
                yield text[pos:], None
                return
            raw, after = self._parse_block(text, opening + len(self.open_tag))
            yield text[pos:opening], raw
            pos = after

    def _scan_start(self, text: str, tools: Sequence[ToolSpec]) -> int:
        if self.think_tags is None:
            return 0
        open_think, close_think = self.think_tags
        end = text.find(close_think)
        if text.lstrip().startswith(open_think):
            if end == -1:
                raise self._error(
                    f"your {open_think} block is not closed with {close_think}; finish your "
                    "reasoning, close it, then call a tool.",
                    "unclosed_tag",
                    tools,
                    text,
                )
            return end + len(close_think)
        # Reasoning opened in the prompt: it ends at a close tag before any call.
        first_call = text.find(self.open_tag)
        if end != -1 and (first_call == -1 or end < first_call):
            return end + len(close_think)
        return 0

    def _error(
        self,
        problem: str,
        kind: ErrorKind,
        tools: Sequence[ToolSpec],
        text: str,
        *,
        tool: str | None = None,
    ) -> ToolCallFormatError:
        content = text.split(self.open_tag, 1)[0].strip()
        return format_error(problem, kind, self, tools, tool=tool, content=content)


def skip_ws(text: str, pos: int) -> int:
    """Index of the first non-whitespace character at or after ``pos``."""
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos
