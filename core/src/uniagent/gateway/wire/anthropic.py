"""Anthropic Messages (``/v1/messages``): ``tool_use``/``tool_result`` and ``thinking`` blocks."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any

from uniagent.gateway.session import ChatRequest, Completion, GatewayError
from uniagent.gateway.wire.common import (
    Json,
    dumps,
    max_tokens,
    need,
    new_id,
    opt,
    stops,
    text_parts,
)
from uniagent.gateway.wire.openai_chat import chunks, schema

WIRE = "messages"
_STOP = {"stop": "end_turn", "tool_calls": "tool_use", "length": "max_tokens"}


def parse(body: Json) -> ChatRequest:
    """The internal request of a messages body."""
    limit = max_tokens(body, "max_tokens")
    if limit is None:
        raise GatewayError("max_tokens is required", param="max_tokens")
    messages: list[Json] = []
    system = body.get("system")
    if system is not None:
        text = text_parts(system, "system")
        if text:
            messages.append({"role": "system", "content": text})
    for i, m in enumerate(need(body, "messages", list)):
        path = f"messages[{i}]"
        role = need(m, "role", str, path)
        content = m.get("content")
        if isinstance(content, str):
            content = [{"type": "text", "text": content}]
        if not isinstance(content, list):
            raise GatewayError(
                f"{path}.content must be a string or an array of blocks", param=f"{path}.content"
            )
        if role == "user":
            messages += _user(content, path)
        elif role == "assistant":
            messages.append(_assistant(content, path))
        elif role == "system":
            # Claude Code sends mid-conversation system messages (its environment notes).
            messages.append({"role": "system", "content": text_parts(content, f"{path}.content")})
        else:
            raise GatewayError(
                f"{path}.role must be user, assistant or system, not {role!r}",
                param=f"{path}.role",
            )
    tools = []
    for i, tool in enumerate(opt(body, "tools", list) or ()):
        path = f"tools[{i}]"
        if tool.get("type") not in (None, "custom"):
            raise GatewayError(
                f"{path}.type {tool.get('type')!r} is not supported (server tools "
                "run at Anthropic; only client tools)",
                param=f"{path}.type",
            )
        tools.append(
            schema(need(tool, "name", str, path), tool.get("description"), tool.get("input_schema"))
        )
    return ChatRequest(
        WIRE, body, messages, tools or None, limit, stops(body, "stop_sequences"), "toolu_"
    )


def _user(blocks: list[Any], path: str) -> list[Json]:
    """Tool results (as tool messages, in order), then the text as one user message."""
    out: list[Json] = []
    texts: list[str] = []
    for j, block in enumerate(blocks):
        where = f"{path}.content[{j}]"
        kind = need(block, "type", str, where)
        if kind == "text":
            texts.append(need(block, "text", str, where))
        elif kind == "tool_result":
            content = block.get("content")
            text = "" if content is None else text_parts(content, f"{where}.content")
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": need(block, "tool_use_id", str, where),
                    "content": text,
                }
            )
        else:
            raise GatewayError(
                f"{where}.type {kind!r} is not supported by the gateway", param=f"{where}.type"
            )
    if texts:
        out.append({"role": "user", "content": "\n\n".join(texts)})
    return out


def _assistant(blocks: list[Any], path: str) -> Json:
    texts: list[str] = []
    thinking: list[str] = []
    calls: list[Json] = []
    for j, block in enumerate(blocks):
        where = f"{path}.content[{j}]"
        kind = need(block, "type", str, where)
        if kind == "text":
            texts.append(need(block, "text", str, where))
        elif kind == "thinking":
            thinking.append(need(block, "thinking", str, where))
        elif kind == "tool_use":
            calls.append(
                {
                    "id": need(block, "id", str, where),
                    "type": "function",
                    "function": {
                        "name": need(block, "name", str, where),
                        "arguments": need(block, "input", dict, where),
                    },
                }
            )
        else:
            raise GatewayError(
                f"{where}.type {kind!r} is not supported by the gateway", param=f"{where}.type"
            )
    out: Json = {"role": "assistant", "content": "\n".join(texts)}
    if "".join(thinking):
        out["reasoning_content"] = "\n".join(thinking)
    if calls:
        out["tool_calls"] = calls
    return out


def _signature(text: str) -> str:
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def _blocks(c: Completion) -> list[Json]:
    blocks: list[Json] = []
    if c.reasoning:
        blocks.append(
            {"type": "thinking", "thinking": c.reasoning, "signature": _signature(c.reasoning)}
        )
    if c.content or not c.tool_calls:
        blocks.append({"type": "text", "text": c.content})
    for call in c.tool_calls:
        blocks.append(
            {"type": "tool_use", "id": call["id"], "name": call["name"], "input": call["arguments"]}
        )
    return blocks


def _usage(c: Completion) -> Json:
    return {
        "input_tokens": c.prompt_tokens,
        "output_tokens": c.completion_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }


def response(c: Completion, model: str) -> Json:
    """The ``message`` object."""
    return {
        "id": new_id("msg_"),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": _blocks(c),
        "stop_reason": _STOP[c.finish_reason],
        "stop_sequence": None,
        "usage": _usage(c),
    }


def stream(c: Completion, model: str, body: Json) -> Iterator[Json]:
    """SSE events ``message_start`` ... ``message_stop``, the way Anthropic streams."""

    def event(kind: str, **data: Any) -> Json:
        return {"event": kind, "data": dumps({"type": kind, **data})}

    start = {
        **response(c, model),
        "content": [],
        "stop_reason": None,
        "usage": {**_usage(c), "output_tokens": 0},
    }
    yield event("message_start", message=start)
    for index, block in enumerate(_blocks(c)):
        kind = block["type"]
        if kind == "thinking":
            yield event(
                "content_block_start",
                index=index,
                content_block={"type": "thinking", "thinking": "", "signature": ""},
            )
            for piece in chunks(block["thinking"]):
                yield event(
                    "content_block_delta",
                    index=index,
                    delta={"type": "thinking_delta", "thinking": piece},
                )
            yield event(
                "content_block_delta",
                index=index,
                delta={"type": "signature_delta", "signature": block["signature"]},
            )
        elif kind == "text":
            yield event(
                "content_block_start", index=index, content_block={"type": "text", "text": ""}
            )
            for piece in chunks(block["text"]):
                yield event(
                    "content_block_delta", index=index, delta={"type": "text_delta", "text": piece}
                )
        else:
            yield event("content_block_start", index=index, content_block={**block, "input": {}})
            for piece in chunks(dumps(block["input"])):
                yield event(
                    "content_block_delta",
                    index=index,
                    delta={"type": "input_json_delta", "partial_json": piece},
                )
        yield event("content_block_stop", index=index)
    yield event(
        "message_delta",
        delta={"stop_reason": _STOP[c.finish_reason], "stop_sequence": None},
        usage={"output_tokens": c.completion_tokens},
    )
    yield event("message_stop")


def error(exc: GatewayError) -> Json:
    """Anthropic's error object."""
    return {"type": "error", "error": {"type": exc.kind, "message": str(exc)}}
