"""The plugin's ``uniagent`` entry point: it contributes the ``{{ cookiecutter.__record_name }}`` tool-call parser.

A parser turns what the model wrote into validated tool calls, and writes calls
back in the same format (for examples in error messages). The example format
is ReAct's::

    Thought: I should greet the world.
    Action: hello
    Action Input: {"who": "world"}

Errors are :class:`uniagent.parsers.ToolCallFormatError` whose text is fed back
to the model, so say what was wrong and show the expected format. ``read_calls`` is what
the gateway needs to serve a harness agent with this format (``uniagent.CallReader``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from uniagent import (
    ParseResult,
    ParserSpec,
    ToolCall,
    ToolCallFormatError,
    ToolSpec,
    check_count,
    example_call,
    format_error,
    hookimpl,
    validate_call,
)

_ACTION = re.compile(r"^Action:[ \t]*(?P<name>[^\n]*?)[ \t]*$", re.MULTILINE)
_INPUT = re.compile(r"\s*Action Input:[ \t]*")
_JSON = json.JSONDecoder()


class {{ cookiecutter.__class_name }}Parser:
    """``Action: <tool>`` followed by ``Action Input: <JSON arguments>``, once per call."""

    name = "{{ cookiecutter.__record_name }}"
    #: ReAct models tend to write the tool's output themselves; stop them there.
    stop_sequences: tuple[str, ...] = ("\nObservation:",)

    def parse(
        self, text: str, tools: Sequence[ToolSpec], *, max_calls: int | None = None
    ) -> ParseResult:
        """Every ``Action`` in ``text``, validated against ``tools``; the text before is content."""
        try:
            content, actions = _actions(text)
        except ToolCallFormatError as exc:  # shown to the model with an example of the format
            raise format_error(
                str(exc), exc.kind, self, tools, tool=exc.tool, content=exc.content
            ) from None
        if not actions:
            raise format_error(
                "no `Action:` line found. Every reply must call a tool.",
                "no_tool_call",
                self,
                tools,
                content=content,
            )
        check_count(len(actions), max_calls, self, tools, content)
        calls = [validate_call(n, a, tools, self, content=content) for n, a in actions]
        return ParseResult(content=content, tool_calls=calls)

    def read_calls(
        self, text: str, tools: Sequence[Mapping[str, Any]] | None
    ) -> tuple[str, list[tuple[str, dict[str, Any]]]]:
        """The calls as the gateway hands them to a harness: each name and its arguments,
        not validated (the harness checks them against its own tools); the text before is
        content."""
        content, actions = _actions(text)
        for name, arguments in actions:
            if not isinstance(arguments, dict):
                raise ToolCallFormatError(
                    f"the Action Input of {name} is not a JSON object.", "malformed", tool=name
                )
        return content, actions

    def format_tool_call(self, call: ToolCall) -> str:
        """``call`` as the model writes it."""
        arguments = json.dumps(call.arguments, ensure_ascii=False)
        return f"Action: {call.name}\nAction Input: {arguments}"

    def format_example(self, tools: Sequence[ToolSpec]) -> str:
        """An example call of the first of ``tools``, for error messages."""
        return self.format_tool_call(example_call(tools))

    def format_tool_response(self, content: str) -> str:
        """A tool's output as a ReAct model reads it (sent as a user message to chat APIs)."""
        return f"Observation: {content}"


def _actions(text: str) -> tuple[str, list[tuple[str, Any]]]:
    """The text before the first ``Action`` and each call's name and JSON arguments."""
    actions = list(_ACTION.finditer(text))
    content = text[: actions[0].start()].strip() if actions else text.strip()
    calls = []
    for action in actions:
        name = action["name"]
        found = _INPUT.match(text, action.end())
        if found is None:
            raise ToolCallFormatError(
                f"`Action: {name}` must be followed by an `Action Input:` line.",
                "malformed",
                tool=name,
                content=content,
            )
        try:
            arguments, _ = _JSON.raw_decode(text, found.end())
        except json.JSONDecodeError as exc:
            raise ToolCallFormatError(
                f"the Action Input of {name} is not valid JSON ({exc.msg}).",
                "invalid_json",
                tool=name,
                content=content,
            ) from None
        calls.append((name, arguments))
    return content, calls


@hookimpl
def uniagent_tool_parsers() -> Iterator[ParserSpec]:
    """The ``{{ cookiecutter.__record_name }}`` parser."""
    yield ParserSpec(
        name="{{ cookiecutter.__record_name }}",
        factory={{ cookiecutter.__class_name }}Parser,
        description="Action: <tool> / Action Input: <JSON arguments> (ReAct)",
    )
