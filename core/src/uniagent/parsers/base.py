"""Tool-call types, the parser protocol and the validation shared by every parser.

A parser turns the text a model wrote into :class:`ToolCall` records, or raises
:class:`ToolCallFormatError` whose message is written to be fed back to the
model: what was wrong, the expected format (an example), the allowed tool names
and, for a bad parameter, that tool's parameters.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import ValidationError

from uniagent.errors import UniAgentError
from uniagent.specs import ToolSpec

ErrorKind = Literal[
    "no_tool_call",
    "unclosed_tag",
    "malformed",
    "invalid_json",
    "unknown_tool",
    "missing_parameter",
    "unknown_parameter",
    "invalid_value",
    "too_many_calls",
]

#: Order in which argument problems decide the error ``kind`` when several occur.
_KIND_PRIORITY: tuple[ErrorKind, ...] = ("unknown_parameter", "missing_parameter", "invalid_value")
_MAX_SHOWN = 200


@dataclass(frozen=True)
class ToolCall:
    """One call of a tool by name with its (validated) arguments."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict, hash=False)
    id: str | None = None


@dataclass(frozen=True)
class ParseResult:
    """What a parser found: the text outside tool calls (e.g. the reasoning) and the calls."""

    content: str
    tool_calls: list[ToolCall] = field(default_factory=list, hash=False)


class ToolCallFormatError(UniAgentError, ValueError):
    """The model's tool call could not be used; ``str(exc)`` is meant for the model.

    ``kind`` classifies the problem (see :data:`ErrorKind`), ``tool`` names the
    tool concerned when known, and ``content`` holds the text outside tool calls
    so a loop that accepts plain answers can still use it (``no_tool_call``).
    """

    def __init__(
        self, message: str, kind: ErrorKind, *, tool: str | None = None, content: str = ""
    ) -> None:
        super().__init__(message)
        self.kind: ErrorKind = kind
        self.tool = tool
        self.content = content


@runtime_checkable
class ToolCallParser(Protocol):
    """Turns model text into tool calls and renders tool calls as the model writes them."""

    name: str
    #: Strings at which generation may stop (none needed for the built-in formats).
    stop_sequences: tuple[str, ...]

    def parse(
        self, text: str, tools: Sequence[ToolSpec], *, max_calls: int | None = None
    ) -> ParseResult:
        """Parse and validate the calls in ``text``; raise :class:`ToolCallFormatError`."""
        ...

    def format_tool_call(self, call: ToolCall) -> str:
        """Render ``call`` exactly as the model would write it."""
        ...

    def format_example(self, tools: Sequence[ToolSpec]) -> str:
        """An example call of one of ``tools`` in this format, for error messages."""
        ...

    def format_tool_response(self, content: str) -> str:
        """A tool's output as the model expects to read it in a user message.

        Used when a chat API is sent the conversation (message mode) and the model
        wrote its calls as text: a strict API accepts ``role: tool`` only as the
        answer of a structured call, so the output goes in a user message, the way
        the model's chat template renders tool results (``versionadded:: 0.2``).
        """
        ...


#: A call as the gateway hands it to a client: the tool's name and its arguments.
WireCall = tuple[str, dict[str, Any]]


@runtime_checkable
class CallReader(Protocol):
    """What the gateway needs of a parser besides :class:`ToolCallParser` (every parser
    that has it serves harnesses: the built-in ones, and any from a plugin)."""

    def read_calls(
        self, text: str, tools: Sequence[Mapping[str, Any]] | None
    ) -> tuple[str, list[WireCall]]:
        """The text outside the calls in ``text`` (reasoning already removed) and each
        call's name and arguments, as a client of a chat API receives them: not validated
        (the client checks them against its own tools), typed by the client's OpenAI tool
        schemas ``tools`` where the format writes values as text. Raise
        :class:`ToolCallFormatError` for a malformed call."""
        ...


class StructuredCalls:
    """The "format" of calls a chat API returned as structured ``tool_calls``.

    It parses nothing (the API did); it shapes error messages and examples as
    function calls, not as text the model should write.
    """

    name = "structured"
    stop_sequences: tuple[str, ...] = ()

    def parse(
        self, text: str, tools: Sequence[ToolSpec], *, max_calls: int | None = None
    ) -> ParseResult:
        """Structured calls are not in the text."""
        raise format_error(
            "no tool call found; call one of the tools.", "no_tool_call", self, tools, content=text
        )

    def format_tool_call(self, call: ToolCall) -> str:
        """The call as a function call with JSON arguments."""
        args = json.dumps(dict(call.arguments), ensure_ascii=False)
        return f"a function call to {call.name} with arguments {args}"

    def format_example(self, tools: Sequence[ToolSpec]) -> str:
        """An example function call (through the API's tool calling, not as text)."""
        return (
            f"{self.format_tool_call(example_call(tools))} (use the API's tool calling; do not "
            "write the call as text)"
        )

    def format_tool_response(self, content: str) -> str:
        """Structured calls are answered with tool messages; the content as it is."""
        return content


# -- schema helpers ------------------------------------------------------------------
def schema_types(prop: Mapping[str, Any], defs: Mapping[str, Any]) -> set[str]:
    """The JSON types a schema property admits (``anyOf``/``oneOf``/``$ref`` followed)."""
    found: set[str] = set()
    _collect_types(prop, defs, found, depth=0)
    return found


def _collect_types(prop: Any, defs: Mapping[str, Any], found: set[str], depth: int) -> None:
    if not isinstance(prop, Mapping) or depth > 20:
        return
    kind = prop.get("type")
    if isinstance(kind, str):
        found.add(kind)
    elif isinstance(kind, list):
        found.update(k for k in kind if isinstance(k, str))
    if "enum" in prop and not kind:
        for value in prop["enum"]:
            found.add(_json_type(value))
    if "const" in prop and not kind:
        found.add(_json_type(prop["const"]))
    ref = prop.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        _collect_types(defs.get(ref.rsplit("/", 1)[-1]), defs, found, depth + 1)
    for key in ("anyOf", "oneOf", "allOf"):
        for sub in prop.get(key, ()) or ():
            _collect_types(sub, defs, found, depth + 1)


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def placeholder(types: set[str]) -> Any:
    """A plausible example value for a parameter of the given JSON types."""
    for kind, value in (
        ("string", "..."),
        ("integer", 1),
        ("number", 1.5),
        ("boolean", True),
        ("array", []),
        ("object", {}),
    ):
        if kind in types:
            return value
    return "..."


def example_call(tools: Sequence[ToolSpec], tool_name: str | None = None) -> ToolCall:
    """A call of ``tool_name`` (else the first tool) with placeholder required arguments."""
    by_name = {t.name: t for t in tools}
    tool = by_name.get(tool_name or "") or (tools[0] if tools else None)
    if tool is None:
        return ToolCall(name="tool_name", arguments={"parameter": "value"})
    schema = tool.parameters_schema()
    defs = schema.get("$defs", {})
    args = {
        name: _enum_values(prop, defs)[0]
        if _enum_values(prop, defs)
        else placeholder(schema_types(prop, defs))
        for name, prop in schema["properties"].items()
        if name in schema["required"]
    }
    return ToolCall(name=tool.name, arguments=args)


def _enum_values(prop: Mapping[str, Any], defs: Mapping[str, Any]) -> list[Any]:
    ref = prop.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        prop = defs.get(ref.rsplit("/", 1)[-1], {})
    if "const" in prop:
        return [prop["const"]]
    return list(prop.get("enum") or ())


def describe_parameters(tool: ToolSpec) -> str:
    """``name (type, required), ...`` for error messages."""
    schema = tool.parameters_schema()
    defs = schema.get("$defs", {})
    parts = []
    for name, prop in schema["properties"].items():
        types = sorted(schema_types(prop, defs) - {"null"}) or ["any"]
        enum = _enum_values(prop, defs)
        kind = "one of " + ", ".join(json.dumps(v) for v in enum) if enum else " or ".join(types)
        need = "required" if name in schema["required"] else "optional"
        parts.append(f"{name} ({kind}, {need})")
    return ", ".join(parts) if parts else "none (call it with no arguments)"


def shorten(value: Any, limit: int = _MAX_SHOWN) -> str:
    """``repr``-like text of ``value`` cut to ``limit`` characters."""
    text = value if isinstance(value, str) else repr(value)
    text = json.dumps(text, ensure_ascii=False) if isinstance(value, str) else text
    return text if len(text) <= limit else text[: limit - 3] + "..."


# -- error messages and validation ---------------------------------------------------
def format_error(
    problem: str,
    kind: ErrorKind,
    parser: ToolCallParser,
    tools: Sequence[ToolSpec],
    *,
    tool: str | None = None,
    content: str = "",
) -> ToolCallFormatError:
    """Build a model-readable :class:`ToolCallFormatError` (problem, format, tools)."""
    lines = [f"Invalid tool call: {problem}"]
    spec = next((t for t in tools if t.name == tool), None)
    if spec is not None and kind in ("missing_parameter", "unknown_parameter", "invalid_value"):
        lines.append(f"Parameters of {spec.name}: {describe_parameters(spec)}.")
    names = ", ".join(t.name for t in tools) or "none"
    lines.append(f"Available tools: {names}.")
    lines.append("Write each tool call in exactly this format, for example:")
    lines.append(parser.format_example(tools if spec is None else [spec]))
    return ToolCallFormatError("\n".join(lines), kind, tool=tool, content=content)


def validate_call(
    name: Any,
    arguments: Any,
    tools: Sequence[ToolSpec],
    parser: ToolCallParser,
    *,
    call_id: str | None = None,
    content: str = "",
) -> ToolCall:
    """Check a call against the tools; return it with pydantic-normalised arguments."""
    if not isinstance(name, str) or not name:
        raise format_error(
            f"the tool name must be a non-empty string, got {shorten(name)}.",
            "malformed",
            parser,
            tools,
            content=content,
        )
    spec = next((t for t in tools if t.name == name), None)
    if spec is None:
        raise format_error(
            f"there is no tool named {shorten(name)}.",
            "unknown_tool",
            parser,
            tools,
            tool=None,
            content=content,
        )
    if not isinstance(arguments, Mapping):
        raise format_error(
            f"the arguments of {name} must be an object of parameter names to values, "
            f"got {shorten(arguments)}.",
            "invalid_value",
            parser,
            tools,
            tool=name,
            content=content,
        )
    problems: list[tuple[ErrorKind, str]] = []
    schema = spec.parameters_schema()
    if spec.arguments.model_config.get("extra") != "allow":
        for key in arguments:
            if key not in schema["properties"]:
                problems.append(("unknown_parameter", f"{name} has no parameter {shorten(key)}."))
    try:
        validated = spec.validate_arguments(arguments)
    except ValidationError as exc:
        problems.extend(_pydantic_problems(name, exc))
    if problems:
        kinds = {k for k, _ in problems}
        kind = next(k for k in _KIND_PRIORITY if k in kinds)
        raise format_error(
            " ".join(text for _, text in problems),
            kind,
            parser,
            tools,
            tool=name,
            content=content,
        )
    normalised = validated.model_dump(mode="json", exclude_unset=True)
    return ToolCall(name=name, arguments=normalised, id=call_id)


def _pydantic_problems(tool: str, exc: ValidationError) -> list[tuple[ErrorKind, str]]:
    out: list[tuple[ErrorKind, str]] = []
    for err in exc.errors(include_url=False):
        loc = ".".join(str(part) for part in err.get("loc", ()))
        if err.get("type") == "missing" and len(err.get("loc", ())) == 1:
            out.append(("missing_parameter", f'missing required parameter "{loc}" of {tool}.'))
        elif err.get("type") == "extra_forbidden":
            if len(err.get("loc", ())) == 1:
                continue  # already reported as an unknown parameter
            out.append(("unknown_parameter", f'parameter "{loc}": unexpected key.'))
        else:
            where = f'parameter "{loc}"' if loc else f"arguments of {tool}"
            got = shorten(err.get("input"), 80)
            out.append(("invalid_value", f"{where}: {err.get('msg', 'invalid')} (got {got})."))
    return out


def tool_calls_from_openai(
    message_tool_calls: Sequence[Any] | None,
    tools: Sequence[ToolSpec],
    *,
    parser: ToolCallParser | None = None,
    max_calls: int | None = None,
    content: str = "",
) -> list[ToolCall]:
    """Validate structured chat-API ``tool_calls`` (JSON-string arguments) as parsers do.

    Accepts OpenAI SDK objects or plain dicts. ``parser`` only shapes the example
    in error messages (default: function calls through the API, see
    :class:`StructuredCalls`).
    """
    if parser is None:
        parser = StructuredCalls()
    raw_calls = list(message_tool_calls or ())
    if not raw_calls:
        raise format_error(
            "no tool call found; call one of the tools.",
            "no_tool_call",
            parser,
            tools,
            content=content,
        )
    check_count(len(raw_calls), max_calls, parser, tools, content)
    calls = []
    for raw in raw_calls:
        function = _get(raw, "function")
        name = _get(function, "name")
        arguments: Any = _get(function, "arguments")
        if arguments is None or (isinstance(arguments, str) and not arguments.strip()):
            arguments = {}
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except (ValueError, RecursionError) as exc:
                raise format_error(
                    f"the arguments of {name if isinstance(name, str) else shorten(name, 60)} "
                    f"are not valid JSON ({exc}).",
                    "invalid_json",
                    parser,
                    tools,
                    tool=name if isinstance(name, str) else None,
                    content=content,
                ) from None
        calls.append(
            validate_call(name, arguments, tools, parser, call_id=_get(raw, "id"), content=content)
        )
    return calls


def check_count(
    count: int,
    max_calls: int | None,
    parser: ToolCallParser,
    tools: Sequence[ToolSpec],
    content: str,
) -> None:
    """Raise ``too_many_calls`` when ``count`` exceeds ``max_calls``."""
    if max_calls is not None and count > max_calls:
        allowed = "1 tool call" if max_calls == 1 else f"{max_calls} tool calls"
        raise format_error(
            f"you made {count} tool calls in one turn; at most {allowed} is allowed per turn.",
            "too_many_calls",
            parser,
            tools,
            content=content,
        )


def _get(obj: Any, key: str) -> Any:
    if obj is None:
        return None
    if isinstance(obj, Mapping):
        return obj.get(key)
    return getattr(obj, key, None)
