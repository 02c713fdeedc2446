"""The Qwen3-Coder XML format::

    <tool_call>
    <function=NAME>
    <parameter=P>
    value
    </parameter>
    </function>
    </tool_call>

Values are untyped text, typed here from the tool's JSON schema: integers,
numbers, booleans, arrays, objects and ``null`` are parsed; strings are kept
verbatim except for the single leading and trailing newline the format adds.
A value cannot contain ``</parameter>`` (the format has no escaping).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from uniagent.parsers.base import ToolCall, schema_types, shorten
from uniagent.parsers.text import BlockError, RawCall, TaggedToolCallParser, skip_ws
from uniagent.specs import ToolSpec

FUNCTION = "<function="
FUNCTION_END = "</function>"
PARAMETER = "<parameter="
PARAMETER_END = "</parameter>"


class Qwen3CoderParser(TaggedToolCallParser):
    """Parses Qwen3-Coder ``<function=NAME><parameter=P>value</parameter>`` calls."""

    name = "qwen3_coder"
    bare_marker = FUNCTION

    def format_tool_call(self, call: ToolCall) -> str:
        """Render ``call`` the way Qwen3-Coder's chat template writes it."""
        lines = [self.open_tag, f"{FUNCTION}{call.name}>"]
        for key, value in call.arguments.items():
            text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
            lines.append(f"{PARAMETER}{key}>\n{text}\n{PARAMETER_END}")
        lines += [FUNCTION_END, self.close_tag]
        return "\n".join(lines)

    def _coerce(self, raw: RawCall, tools: Sequence[ToolSpec]) -> Any:
        spec = next((t for t in tools if t.name == raw.name), None)
        if spec is None:
            return raw.arguments
        schema = spec.parameters_schema()
        defs = schema.get("$defs", {})
        props = schema["properties"]
        return {
            key: _typed(value, schema_types(props[key], defs)) if key in props else value
            for key, value in raw.arguments.items()
        }

    def wire_arguments(
        self, name: str, arguments: dict[str, Any], tools: Sequence[Mapping[str, Any]] | None
    ) -> dict[str, Any]:
        """Values are text: a non-string parameter of the client's schema read as JSON."""
        functions = (t.get("function") or {} for t in tools or ())
        schema: Mapping[str, Any] = next((f for f in functions if f.get("name") == name), {})
        props = (schema.get("parameters") or {}).get("properties") or {}
        out: dict[str, Any] = {}
        for key, value in arguments.items():
            kind = (props.get(key) or {}).get("type", "string")
            if isinstance(value, str) and kind != "string":
                with contextlib.suppress(ValueError, RecursionError):  # strict JSON, no NaN
                    value = json.loads(value, parse_constant=_no_constant)
            out[key] = value
        return out

    def _parse_block(self, text: str, pos: int) -> tuple[RawCall, int]:
        p = skip_ws(text, pos)
        if p >= len(text):
            raise self._unclosed()
        if not text.startswith(FUNCTION, p):
            raise BlockError(
                f"expected {FUNCTION}NAME> right after {self.open_tag}, found "
                f"{shorten(text[p : p + 40])}.",
                "malformed",
            )
        name, p = _tag_value(text, p, FUNCTION)
        arguments: dict[str, str] = {}
        while True:
            q = skip_ws(text, p)
            if q >= len(text):
                raise BlockError(
                    f"{FUNCTION}{name}> is not closed with {FUNCTION_END}.", "unclosed_tag", name
                )
            if text.startswith(FUNCTION_END, q):
                p = q + len(FUNCTION_END)
                break
            if not text.startswith(PARAMETER, q):
                if text.startswith(self.close_tag, q):
                    found = f"{self.close_tag} before {FUNCTION_END}"
                else:
                    found = shorten(text[q : q + 40])
                raise BlockError(
                    f"expected {PARAMETER}NAME> or {FUNCTION_END} inside {FUNCTION}{name}>, "
                    f"found {found}.",
                    "malformed",
                    name,
                )
            key, start = _tag_value(text, q, PARAMETER)
            end = text.find(PARAMETER_END, start)
            if end == -1:
                raise BlockError(
                    f"{PARAMETER}{key}> is not closed with {PARAMETER_END}.", "unclosed_tag", name
                )
            value = text[start:end]
            if PARAMETER in value:
                raise BlockError(
                    f"{PARAMETER}{key}> is not closed with {PARAMETER_END} before the next "
                    f"{PARAMETER}.",
                    "unclosed_tag",
                    name,
                )
            if key in arguments:
                raise BlockError(f"parameter {key!r} is given twice.", "malformed", name)
            value = value[1:] if value.startswith("\n") else value
            arguments[key] = value[:-1] if value.endswith("\n") else value
            p = end + len(PARAMETER_END)
        q = skip_ws(text, p)
        if text.startswith(self.close_tag, q):
            return RawCall(name=name, arguments=arguments), q + len(self.close_tag)
        if text.find(self.close_tag, q) == -1:
            raise self._unclosed()
        if text.startswith(FUNCTION, q):
            problem = f"put each {FUNCTION}...> in its own {self.open_tag} block."
        else:
            found = shorten(text[q : q + 40])
            problem = f"expected {self.close_tag} after {FUNCTION_END}, found {found}."
        raise BlockError(problem, "malformed", name)

    def _unclosed(self) -> BlockError:
        return BlockError(f"{self.open_tag} is not closed with {self.close_tag}.", "unclosed_tag")


def _tag_value(text: str, tag_start: int, prefix: str) -> tuple[str, int]:
    """The ``NAME`` of the ``<prefix=NAME>`` tag at ``tag_start``, and the index after it."""
    end = text.find(">", tag_start)
    if end == -1:
        raise BlockError(f"the tag {prefix}NAME> is not closed with '>'.", "unclosed_tag")
    value = text[tag_start + len(prefix) : end].strip()
    if not value or "\n" in value or "<" in value:
        raise BlockError(
            f"expected a tag of the form {prefix}NAME> on one line, found "
            f"{shorten(text[tag_start : end + 1], 60)}.",
            "malformed",
        )
    return value, end + 1


def _typed(value: str, types: set[str]) -> Any:
    """The value of a parameter typed from its schema types (strings stay verbatim)."""
    if "string" in types:
        return value
    stripped = value.strip()
    if "null" in types and stripped == "null":
        return None
    if "boolean" in types and stripped.lower() in ("true", "false"):
        return stripped.lower() == "true"
    try:
        return json.loads(stripped)
    except (ValueError, RecursionError):
        return value  # validation reports the bad value against the schema


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")
