"""OpenAI Chat Completions (``/v1/chat/completions``): ``tools``/``tool_calls``, streaming."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from uniagent.gateway.session import ChatRequest, Completion, GatewayError
from uniagent.gateway.wire.common import (
    Json,
    arguments_object,
    dumps,
    max_tokens,
    need,
    new_id,
    now,
    opt,
    stops,
    text_parts,
)

WIRE = "chat"
_ROLES = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
    "tool": "tool",
}


def parse(body: Json) -> ChatRequest:
    """The internal request of a chat-completions body."""
    raw = need(body, "messages", list)
    if (opt(body, "n", int) or 1) != 1:
        raise GatewayError("n must be 1: the gateway records one generation per request", param="n")
    messages = [message(m, f"messages[{i}]") for i, m in enumerate(raw)]
    return ChatRequest(
        WIRE,
        body,
        messages,
        tools(body),
        max_tokens(body, "max_completion_tokens", "max_tokens"),
        stops(body, "stop"),
        "call_",
    )


def tools(body: Json) -> list[Json] | None:
    """The request's function tools as OpenAI schemas (name, description, parameters)."""
    out = []
    for i, tool in enumerate(opt(body, "tools", list) or ()):
        path = f"tools[{i}]"
        if need(tool, "type", str, path) != "function":
            raise GatewayError(f"{path}.type must be 'function'", param=f"{path}.type")
        fn = need(tool, "function", dict, path)
        out.append(
            schema(
                need(fn, "name", str, f"{path}.function"),
                fn.get("description"),
                fn.get("parameters"),
            )
        )
    return out or None


def schema(name: str, description: Any, parameters: Any) -> Json:
    """A tool schema in the internal (OpenAI chat) form."""
    fn: Json = {"name": name}
    if description:
        fn["description"] = description
    fn["parameters"] = (
        parameters if isinstance(parameters, dict) else {"type": "object", "properties": {}}
    )
    return {"type": "function", "function": fn}


def message(m: Any, path: str) -> Json:
    """One chat message in the internal form."""
    role = need(m, "role", str, path)
    if role not in _ROLES:
        raise GatewayError(
            f"{path}.role {role!r} is not one of {', '.join(_ROLES)}", param=f"{path}.role"
        )
    role = _ROLES[role]
    content = m.get("content")
    text = "" if content is None else text_parts(content, f"{path}.content")
    out: Json = {"role": role, "content": text}
    if role == "tool":
        out["tool_call_id"] = need(m, "tool_call_id", str, path)
    if role == "assistant":
        reasoning = m.get("reasoning_content") or m.get("reasoning")
        if isinstance(reasoning, str) and reasoning:
            out["reasoning_content"] = reasoning
        calls = []
        for j, call in enumerate(opt(m, "tool_calls", list, path) or ()):
            where = f"{path}.tool_calls[{j}]"
            fn = need(call, "function", dict, where)
            calls.append(
                {
                    "id": need(call, "id", str, where),
                    "type": "function",
                    "function": {
                        "name": need(fn, "name", str, f"{where}.function"),
                        "arguments": arguments_object(
                            fn.get("arguments"), f"{where}.function.arguments"
                        ),
                    },
                }
            )
        if calls:
            out["tool_calls"] = calls
    return out


def _calls(completion: Completion) -> list[Json]:
    return [
        {
            "id": c["id"],
            "type": "function",
            "function": {"name": c["name"], "arguments": dumps(c["arguments"])},
        }
        for c in completion.tool_calls
    ]


def _usage(c: Completion) -> Json:
    return {
        "prompt_tokens": c.prompt_tokens,
        "completion_tokens": c.completion_tokens,
        "total_tokens": c.prompt_tokens + c.completion_tokens,
    }


def response(c: Completion, model: str) -> Json:
    """The ``chat.completion`` object."""
    msg: Json = {"role": "assistant", "content": c.content or None}
    if c.reasoning:
        msg["reasoning_content"] = c.reasoning
    if c.tool_calls:
        msg["tool_calls"] = _calls(c)
    return {
        "id": new_id("chatcmpl-"),
        "object": "chat.completion",
        "created": now(),
        "model": model,
        "choices": [
            {"index": 0, "message": msg, "logprobs": None, "finish_reason": c.finish_reason}
        ],
        "usage": _usage(c),
    }


def chunks(text: str, size: int = 16) -> list[str]:
    """Text in pieces, as a server streams it."""
    return [text[i : i + size] for i in range(0, len(text), size)]


def stream(c: Completion, model: str, body: Json) -> Iterator[Json]:
    """SSE events (``data:`` JSON chunks, then ``[DONE]``)."""
    rid, created = new_id("chatcmpl-"), now()

    def chunk(delta: Json, finish: str | None = None, usage: Json | None = None) -> Json:
        data: Json = {
            "id": rid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }
        if usage is not None:
            data["choices"], data["usage"] = [], usage
        return {"data": dumps(data)}

    yield chunk({"role": "assistant", "content": ""})
    for piece in chunks(c.reasoning or ""):
        yield chunk({"reasoning_content": piece})
    for piece in chunks(c.content):
        yield chunk({"content": piece})
    for i, call in enumerate(_calls(c)):
        fn = call["function"]
        yield chunk(
            {
                "tool_calls": [
                    {
                        "index": i,
                        "id": call["id"],
                        "type": "function",
                        "function": {"name": fn["name"], "arguments": ""},
                    }
                ]
            }
        )
        for piece in chunks(fn["arguments"]):
            yield chunk({"tool_calls": [{"index": i, "function": {"arguments": piece}}]})
    yield chunk({}, c.finish_reason)
    if (body.get("stream_options") or {}).get("include_usage"):
        yield chunk({}, None, _usage(c))
    yield {"data": "[DONE]"}


def error(exc: GatewayError) -> Json:
    """OpenAI's error object."""
    return {"error": {"message": str(exc), "type": exc.kind, "param": exc.param, "code": exc.kind}}
