"""OpenAI Responses (``/v1/responses``): message, reasoning and function-call items, streaming.

Stateless only: the whole conversation comes in ``input`` (what Codex sends with
``store: false``); ``previous_response_id`` is refused with a clear error.
"""

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
    text_parts,
)
from uniagent.gateway.wire.openai_chat import chunks, schema

WIRE = "responses"
_TEXT = ("input_text", "output_text", "text")


def parse(body: Json) -> ChatRequest:
    """The internal request of a responses body."""
    if body.get("previous_response_id") is not None:
        raise GatewayError(
            "previous_response_id is not supported: send the whole conversation "
            "in input (store: false)",
            param="previous_response_id",
        )
    messages: list[Json] = []
    instructions = opt(body, "instructions", str)
    if instructions:
        messages.append({"role": "system", "content": instructions})
    raw = body.get("input")
    if isinstance(raw, str):
        messages.append({"role": "user", "content": raw})
    elif isinstance(raw, list):
        messages += _items(raw)
    else:
        raise GatewayError("input must be a string or an array of items", param="input")
    return ChatRequest(
        WIRE, body, messages, _tools(body), max_tokens(body, "max_output_tokens"), [], "call_"
    )


def _tools(body: Json) -> list[Json] | None:
    out = []
    for i, tool in enumerate(opt(body, "tools", list) or ()):
        path = f"tools[{i}]"
        kind = need(tool, "type", str, path)
        if kind != "function":
            raise GatewayError(
                f"{path}.type {kind!r} is not supported (only function tools)", param=f"{path}.type"
            )
        out.append(
            schema(need(tool, "name", str, path), tool.get("description"), tool.get("parameters"))
        )
    return out or None


def _items(items: list[Any]) -> list[Json]:
    """Input items as internal messages: a reply's reasoning, message and calls become one."""
    out: list[Json] = []
    pending: Json | None = None

    def flush() -> None:
        nonlocal pending
        if pending is not None:
            out.append(pending)
            pending = None

    for i, item in enumerate(items):
        path = f"input[{i}]"
        if not isinstance(item, dict):
            raise GatewayError(f"{path} must be an object", param=path)
        kind = item.get("type", "message")
        if kind == "message":
            role = need(item, "role", str, path)
            text = text_parts(item.get("content") or "", f"{path}.content", _TEXT)
            if role == "assistant":
                if pending is not None and (pending["content"] or "tool_calls" in pending):
                    flush()
                pending = pending or {"role": "assistant", "content": ""}
                pending["content"] = text
                continue
            if role not in ("user", "system", "developer"):
                raise GatewayError(f"{path}.role {role!r} is not supported", param=f"{path}.role")
            flush()
            out.append({"role": "user" if role == "user" else "system", "content": text})
        elif kind == "reasoning":
            flush()
            parts = item.get("content") or item.get("summary") or []
            texts = [p.get("text", "") for p in parts if isinstance(p, dict)]
            pending = {"role": "assistant", "content": ""}
            if "".join(texts):
                pending["reasoning_content"] = "\n".join(texts)
        elif kind == "function_call":
            pending = pending or {"role": "assistant", "content": ""}
            pending.setdefault("tool_calls", []).append(
                {
                    "id": need(item, "call_id", str, path),
                    "type": "function",
                    "function": {
                        "name": need(item, "name", str, path),
                        "arguments": arguments_object(item.get("arguments"), f"{path}.arguments"),
                    },
                }
            )
        elif kind == "function_call_output":
            flush()
            output = item.get("output")
            text = text_parts(output if output is not None else "", f"{path}.output", _TEXT)
            out.append(
                {"role": "tool", "tool_call_id": need(item, "call_id", str, path), "content": text}
            )
        else:
            raise GatewayError(
                f"{path}.type {kind!r} is not supported by the gateway", param=f"{path}.type"
            )
    flush()
    return out


def _output(c: Completion) -> list[Json]:
    items: list[Json] = []
    if c.reasoning:
        items.append(
            {
                "id": new_id("rs_"),
                "type": "reasoning",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": c.reasoning}],
            }
        )
    if c.content or not c.tool_calls:
        items.append(
            {
                "id": new_id("msg_"),
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [
                    {"type": "output_text", "text": c.content, "annotations": [], "logprobs": []}
                ],
            }
        )
    for call in c.tool_calls:
        items.append(
            {
                "id": new_id("fc_"),
                "type": "function_call",
                "call_id": call["id"],
                "name": call["name"],
                "arguments": dumps(call["arguments"]),
                "status": "completed",
            }
        )
    return items


def response(
    c: Completion, model: str, rid: str | None = None, output: list[Json] | None = None
) -> Json:
    """The ``response`` object."""
    done = c.finish_reason != "length"
    return {
        "id": rid or new_id("resp_"),
        "object": "response",
        "created_at": now(),
        "model": model,
        "status": "completed" if done else "incomplete",
        "incomplete_details": None if done else {"reason": "max_output_tokens"},
        "output": _output(c) if output is None else output,
        "error": None,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "metadata": {},
        "usage": {
            "input_tokens": c.prompt_tokens,
            "output_tokens": c.completion_tokens,
            "total_tokens": c.prompt_tokens + c.completion_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0},
        },
    }


def stream(c: Completion, model: str, body: Json) -> Iterator[Json]:
    """SSE events ``response.created`` ... ``response.completed``, each with its type."""
    rid = new_id("resp_")
    seq = 0

    def event(kind: str, **data: Any) -> Json:
        nonlocal seq
        seq += 1
        return {"event": kind, "data": dumps({"type": kind, "sequence_number": seq - 1, **data})}

    start = {**response(c, model, rid, []), "status": "in_progress", "usage": None}
    yield event("response.created", response=start)
    yield event("response.in_progress", response=start)
    items = _output(c)
    for index, item in enumerate(items):
        iid = item["id"]
        if item["type"] == "reasoning":
            yield event(
                "response.output_item.added", output_index=index, item={**item, "content": []}
            )
            text = item["content"][0]["text"]
            for piece in chunks(text):
                yield event(
                    "response.reasoning_text.delta",
                    item_id=iid,
                    output_index=index,
                    content_index=0,
                    delta=piece,
                )
            yield event(
                "response.reasoning_text.done",
                item_id=iid,
                output_index=index,
                content_index=0,
                text=text,
            )
        elif item["type"] == "message":
            yield event(
                "response.output_item.added",
                output_index=index,
                item={**item, "status": "in_progress", "content": []},
            )
            part = item["content"][0]
            yield event(
                "response.content_part.added",
                item_id=iid,
                output_index=index,
                content_index=0,
                part={**part, "text": ""},
            )
            for piece in chunks(part["text"]):
                yield event(
                    "response.output_text.delta",
                    item_id=iid,
                    output_index=index,
                    content_index=0,
                    delta=piece,
                    logprobs=[],
                )
            yield event(
                "response.output_text.done",
                item_id=iid,
                output_index=index,
                content_index=0,
                text=part["text"],
                logprobs=[],
            )
            yield event(
                "response.content_part.done",
                item_id=iid,
                output_index=index,
                content_index=0,
                part=part,
            )
        else:
            yield event(
                "response.output_item.added",
                output_index=index,
                item={**item, "arguments": "", "status": "in_progress"},
            )
            for piece in chunks(item["arguments"]):
                yield event(
                    "response.function_call_arguments.delta",
                    item_id=iid,
                    output_index=index,
                    delta=piece,
                )
            yield event(
                "response.function_call_arguments.done",
                item_id=iid,
                output_index=index,
                name=item["name"],
                arguments=item["arguments"],
            )
        yield event("response.output_item.done", output_index=index, item=item)
    final = response(c, model, rid, items)
    kind = "response.completed" if final["status"] == "completed" else "response.incomplete"
    yield event(kind, response=final)


def error(exc: GatewayError) -> Json:
    """OpenAI's error object."""
    return {"error": {"message": str(exc), "type": exc.kind, "param": exc.param, "code": exc.kind}}
