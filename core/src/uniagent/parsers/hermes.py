"""The hermes format: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.

This is what Qwen2.5/Qwen3's chat templates teach (one JSON object per block,
one or more blocks per turn). ``arguments`` may also be a JSON-encoded string.
"""

from __future__ import annotations

import json
from typing import Any

from uniagent.parsers.base import ToolCall, shorten
from uniagent.parsers.text import BlockError, RawCall, TaggedToolCallParser, skip_ws

_DECODER = json.JSONDecoder()


class HermesParser(TaggedToolCallParser):
    """Parses ``<tool_call>`` blocks holding ``{"name": ..., "arguments": {...}}`` JSON."""

    name = "hermes"

    def format_tool_call(self, call: ToolCall) -> str:
        """Render ``call`` the way Qwen's chat template writes it."""
        body = json.dumps({"name": call.name, "arguments": call.arguments}, ensure_ascii=False)
        return f"{self.open_tag}\n{body}\n{self.close_tag}"

    def _parse_block(self, text: str, pos: int) -> tuple[RawCall, int]:
        start = skip_ws(text, pos)
        try:
            obj, end = _DECODER.raw_decode(text, start)
        except (ValueError, RecursionError) as exc:
            close = text.find(self.close_tag, pos)
            if close == -1:
                raise BlockError(
                    f"{self.open_tag} is not closed with {self.close_tag}.", "unclosed_tag"
                ) from None
            if not text[pos:close].strip():
                raise BlockError(f"the {self.open_tag} block is empty.", "malformed") from None
            raise BlockError(
                f"the text inside {self.open_tag} is not valid JSON ({_json_problem(exc, start)}).",
                "invalid_json",
            ) from None
        after = skip_ws(text, end)
        if not text.startswith(self.close_tag, after):
            close = text.find(self.close_tag, end)
            if close == -1:
                raise BlockError(
                    f"{self.open_tag} is not closed with {self.close_tag}.", "unclosed_tag"
                )
            raise BlockError(
                f"unexpected text after the JSON object inside {self.open_tag}: "
                f"{shorten(text[end:close], 80)}. Put exactly one JSON object in each block.",
                "invalid_json",
            )
        return self._raw_call(obj), after + len(self.close_tag)

    def _raw_call(self, obj: Any) -> RawCall:
        expected = 'a JSON object with the keys "name" and "arguments"'
        if not isinstance(obj, dict):
            raise BlockError(f"expected {expected}, got {shorten(obj, 80)}.", "malformed")
        extra = sorted(set(obj) - {"name", "arguments"})
        if "name" not in obj or extra:
            found = ", ".join(json.dumps(k) for k in obj) or "none"
            raise BlockError(f"expected {expected}; found the keys {found}.", "malformed")
        name, arguments = obj["name"], obj.get("arguments")
        if arguments is None:
            arguments = {}
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except (ValueError, RecursionError) as exc:
                raise BlockError(
                    f'"arguments" is a string that is not valid JSON ({_json_problem(exc, 0)}).',
                    "invalid_json",
                    tool=name if isinstance(name, str) else None,
                ) from None
        return RawCall(name=name, arguments=arguments)


def _json_problem(exc: BaseException, start: int) -> str:
    if isinstance(exc, json.JSONDecodeError):
        return f"{exc.msg} at character {exc.pos - start + 1}"
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    return str(exc)
