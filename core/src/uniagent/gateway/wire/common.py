"""Helpers shared by the wire formats."""

from __future__ import annotations

import time
import uuid
from typing import Any

import orjson

from uniagent.gateway.session import GatewayError

Json = dict[str, Any]


def need(body: Any, key: str, kind: type | tuple[type, ...], path: str = "") -> Any:
    """``body[key]``, which must be of ``kind``; a 400 naming the key path otherwise."""
    where = f"{path}.{key}" if path else key
    if not isinstance(body, dict) or key not in body:
        raise GatewayError(f"{where} is required", param=where)
    value = body[key]
    if not isinstance(value, kind):
        raise GatewayError(
            f"{where} must be {_kind_name(kind)}, not {type(value).__name__}", param=where
        )
    return value


def opt(body: Json, key: str, kind: type | tuple[type, ...], path: str = "") -> Any:
    """``body[key]`` if present and not null (checked like :func:`need`), else None."""
    if body.get(key) is None:
        return None
    return need(body, key, kind, path)


def _kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    names = {
        str: "a string",
        list: "an array",
        dict: "an object",
        int: "an integer",
        bool: "a boolean",
        float: "a number",
    }
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def text_parts(content: Any, path: str, kinds: tuple[str, ...] = ("text",)) -> str:
    """A string, or the text of a list of text parts; other parts are refused by name."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise GatewayError(f"{path} must be a string or an array of parts", param=path)
    texts = []
    for i, part in enumerate(content):
        kind = need(part, "type", str, f"{path}[{i}]")
        if kind not in kinds:
            raise GatewayError(
                f"{path}[{i}].type {kind!r} is not supported by the gateway "
                f"(only {', '.join(kinds)})",
                param=f"{path}[{i}].type",
            )
        texts.append(need(part, "text", str, f"{path}[{i}]"))
    return "".join(texts)


def arguments_object(raw: Any, path: str) -> dict[str, Any]:
    """Tool-call arguments as an object (JSON text is parsed)."""
    if isinstance(raw, dict):
        return raw
    if isinstance(raw, str):
        try:
            value = orjson.loads(raw) if raw.strip() else {}
        except orjson.JSONDecodeError as exc:
            raise GatewayError(f"{path} is not valid JSON: {exc}", param=path) from None
        if isinstance(value, dict):
            return value
    raise GatewayError(f"{path} must be a JSON object", param=path)


def dumps(value: Any) -> str:
    """Compact JSON text."""
    return orjson.dumps(value).decode()


def max_tokens(body: Json, *keys: str) -> int | None:
    """The first of ``keys`` that is set, checked to be a positive integer."""
    for key in keys:
        value = opt(body, key, int)
        if value is not None:
            if value <= 0 or isinstance(value, bool):
                raise GatewayError(f"{key} must be a positive integer", param=key)
            return int(value)
    return None


def stops(body: Json, key: str) -> list[str]:
    """A stop string or a list of them."""
    value = body.get(key)
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(s, str) for s in value):
        return list(value)
    raise GatewayError(f"{key} must be a string or an array of strings", param=key)


def new_id(prefix: str) -> str:
    """A response id."""
    return f"{prefix}{uuid.uuid4().hex[:24]}"


def now() -> int:
    """Seconds since the epoch."""
    return int(time.time())
