"""The official openai and anthropic clients, streaming and not, in all three wire formats,
with tool calls, through a real server on 127.0.0.1: every combination reaches the same tree."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import anthropic
import openai
import pytest
from conftest import TOOLS, check_tree

from uniagent.gateway import ScriptedBackend
from uniagent.gateway.server import RunningGateway
from uniagent.testing.scripted import hermes_call

SYSTEM, TASK = "You are a careful agent.", "List the files, then say what is there."
SCRIPT = [
    "<think>\nI should look first.\n</think>\n\n" + hermes_call("bash", {"cmd": "ls"}, "Listing."),
    "<think>\nOne file.\n</think>\n\nThere is a.txt.",
]
OUTPUT = "a.txt"


def chat(base: str, stream: bool) -> str:
    client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": TASK},
    ]
    for _ in range(2):
        if stream:
            content, reasoning, calls = "", "", {}
            for chunk in client.chat.completions.create(
                model="m",
                messages=messages,
                tools=TOOLS,
                stream=True,  # type: ignore[arg-type]
            ):
                if not chunk.choices:
                    continue
                delta = chunk.choices[0].delta
                content += delta.content or ""
                reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
                for call in delta.tool_calls or ():
                    slot = calls.setdefault(call.index, {"id": "", "name": "", "arguments": ""})
                    slot["id"] += call.id or ""
                    slot["name"] += (call.function and call.function.name) or ""
                    slot["arguments"] += (call.function and call.function.arguments) or ""
            tool_calls = [
                {
                    "id": c["id"],
                    "type": "function",
                    "function": {"name": c["name"], "arguments": c["arguments"]},
                }
                for c in calls.values()
            ]
        else:
            r = client.chat.completions.create(model="m", messages=messages, tools=TOOLS)  # type: ignore[arg-type]
            msg = r.choices[0].message
            content, reasoning = msg.content or "", (msg.model_extra or {}).get("reasoning_content")
            tool_calls = [c.model_dump() for c in msg.tool_calls or ()]
        reply: dict[str, Any] = {
            "role": "assistant",
            "content": content,
            "reasoning_content": reasoning,
        }
        if tool_calls:
            reply["tool_calls"] = tool_calls
        messages.append(reply)
        if not tool_calls:
            return content
        assert json.loads(tool_calls[0]["function"]["arguments"]) == {"cmd": "ls"}
        messages.append({"role": "tool", "tool_call_id": tool_calls[0]["id"], "content": OUTPUT})
    raise AssertionError("no final answer")


def messages(base: str, stream: bool) -> str:
    client = anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0)
    tools = [
        {
            "name": t["function"]["name"],
            "description": t["function"]["description"],
            "input_schema": t["function"]["parameters"],
        }
        for t in TOOLS
    ]
    history: list[dict[str, Any]] = [{"role": "user", "content": TASK}]
    for _ in range(2):
        kwargs: dict[str, Any] = dict(
            model="m", max_tokens=512, system=SYSTEM, messages=history, tools=tools
        )
        if stream:
            with client.messages.stream(**kwargs) as events:
                msg = events.get_final_message()
        else:
            msg = client.messages.create(**kwargs)
        history.append({"role": "assistant", "content": [b.model_dump() for b in msg.content]})
        uses = [b for b in msg.content if b.type == "tool_use"]
        if not uses:
            assert msg.stop_reason == "end_turn" and msg.content[0].type == "thinking"
            return "".join(b.text for b in msg.content if b.type == "text")
        assert msg.stop_reason == "tool_use" and uses[0].input == {"cmd": "ls"}
        history.append(
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": uses[0].id, "content": OUTPUT}],
            }
        )
    raise AssertionError("no final answer")


def responses(base: str, stream: bool) -> str:
    client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
    tools = [{"type": "function", **t["function"]} for t in TOOLS]
    items: list[dict[str, Any]] = [{"role": "user", "content": TASK}]
    for _ in range(2):
        kwargs: dict[str, Any] = dict(
            model="m", instructions=SYSTEM, input=items, tools=tools, store=False
        )
        if stream:
            done = [
                e
                for e in client.responses.create(stream=True, **kwargs)
                if e.type == "response.completed"
            ]
            assert len(done) == 1
            r = done[0].response
        else:
            r = client.responses.create(**kwargs)
        items += [o.model_dump(exclude_none=True) for o in r.output]
        calls = [o for o in r.output if o.type == "function_call"]
        if not calls:
            assert [o.type for o in r.output] == ["reasoning", "message"]
            return r.output_text
        assert json.loads(calls[0].arguments) == {"cmd": "ls"}
        items.append(
            {"type": "function_call_output", "call_id": calls[0].call_id, "output": OUTPUT}
        )
    raise AssertionError("no final answer")


HARNESSES = {"chat": chat, "messages": messages, "responses": responses}


def tree_of(served: RunningGateway, backend: ScriptedBackend, wire: str, stream: bool) -> Any:
    backend.script.extend(SCRIPT)
    session = served.gateway.open_session()
    answer = HARNESSES[wire](served.base_url(session), stream)
    assert answer == "There is a.txt."
    check_tree(session.tree, backend)
    closed = served.gateway.close(session.id)
    backend.calls.clear()
    return session, closed


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("wire", list(HARNESSES))
def test_each_client_reaches_one_exact_branch(served, backend, wire, stream) -> None:
    _, closed = tree_of(served, backend, wire, stream)
    turns = closed["tree"]["turns"]
    assert [t["source"] for t in turns] == ["render", "extension"]
    assert [t["wire"] for t in turns] == [wire, wire]
    assert [t["exact"] for t in turns] == [True, True], [t["drift"] for t in turns]
    assert closed["tree"]["branches"] == 1 and closed["session"]["undelivered"] == []
    assert bool(turns[0]["request"].get("stream")) is stream  # the wire request, as sent


def test_all_six_ways_reach_the_same_tree(served, backend) -> None:
    trees = []
    for wire in HARNESSES:
        for stream in (False, True):
            session, _ = tree_of(served, backend, wire, stream)
            trees.append([(n.ids, n.mask, n.logprobs) for n in session.tree.nodes()])
            backend._generated = 0  # the same log-probs each time
    assert all(t == trees[0] for t in trees), "a wire format renders differently"
    assert len(trees[0]) == 2


def test_unknown_session_and_bad_requests_get_the_apis_error_and_record_nothing(served) -> None:
    url = served.url
    with pytest.raises(openai.NotFoundError, match="unknown session 'nope'"):
        openai.OpenAI(
            base_url=url + "/s/nope/v1", api_key="x", max_retries=0
        ).chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(anthropic.NotFoundError, match="unknown session 'nope'") as info:
        anthropic.Anthropic(base_url=url + "/s/nope", api_key="x", max_retries=0).messages.create(
            model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}]
        )
    assert info.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    with pytest.raises(openai.AuthenticationError, match="no session"):
        openai.OpenAI(base_url=url + "/v1", api_key="wrong", max_retries=0).responses.create(
            model="m", input="hi"
        )
    session = served.gateway.open_session()
    by_key = openai.OpenAI(base_url=url + "/v1", api_key=session.key, max_retries=0)
    with pytest.raises(
        openai.BadRequestError, match=r"messages\[1\]\.tool_calls\[0\]\.function\.arguments"
    ):
        by_key.chat.completions.create(
            model="m",
            messages=[  # type: ignore[list-item]
                {"role": "user", "content": "hi"},
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {
                            "id": "c",
                            "type": "function",
                            "function": {"name": "bash", "arguments": "{nope"},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "c", "content": "x"},
            ],
        )
    with pytest.raises(
        anthropic.BadRequestError, match=r"messages\[0\]\.content\[0\]\.type 'image'"
    ):
        anthropic.Anthropic(
            base_url=served.base_url(session), api_key="x", max_retries=0
        ).messages.create(
            model="m",
            max_tokens=5,
            messages=[
                {
                    "role": "user",
                    "content": [{"type": "image", "source": {"type": "url", "url": "http://x"}}],
                }
            ],
        )
    assert session.state()["turns"] == 0 and list(session.tree.nodes()) == []


def test_a_session_is_inspected_and_closed_by_its_key_only(served, backend) -> None:
    backend.script.append("Hello.")
    session = served.gateway.open_session()
    client = openai.OpenAI(base_url=served.url + "/v1", api_key=session.key, max_retries=0)
    assert (
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        .choices[0]
        .message.content
        == "Hello."
    )
    where = f"{served.url}/sessions/{session.id}"
    with pytest.raises(urllib.error.HTTPError) as refused:
        call(where, "GET", "wrong")
    assert refused.value.code == 404
    state = call(where, "GET", session.key)
    assert state["turns"] == 1 and state["branches"] == 1
    closed = call(where, "DELETE", session.key)
    assert closed["tree"]["turns"][0]["exact"] is True
    with pytest.raises(openai.AuthenticationError, match="no session"):  # its key is gone
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])


def call(url: str, method: str, key: str) -> Any:
    request = urllib.request.Request(url, method=method, headers={"Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def test_a_gateway_served_to_a_network_refuses_clients_outside_it(served, backend) -> None:
    """The listener harnesses in containers use: same gateway, same sessions, but only for
    clients in the container network (here: one that excludes 127.0.0.1, then one with it)."""
    from uniagent.gateway.server import start

    backend.script.append("Hello.")
    session = served.gateway.open_session()
    with start(served.gateway, host="127.0.0.1", peers=["10.88.0.0/16"]) as elsewhere:
        with pytest.raises(urllib.error.HTTPError) as refused:
            call(f"{elsewhere.url}/sessions/{session.id}", "GET", session.key)
        assert refused.value.code == 403
    with start(served.gateway, host="127.0.0.1", peers=["127.0.0.0/8"]) as here:
        client = openai.OpenAI(base_url=here.base_url(session) + "/v1", api_key=session.key)
        reply = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}]
        )
        assert reply.choices[0].message.content == "Hello."
    assert session.model_seconds > 0 and session.state()["turns"] == 1


#: A reply far longer than the requests below allow.
LONG = "One, two, three, four, five, six, seven, eight, nine, ten, eleven, twelve."


def cut_replies(base: str, stream: bool, limit: int) -> dict[str, Any]:
    """How each wire format ends a reply generated up to ``limit`` tokens."""
    chat = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
    claude = anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0)
    hi: Any = [{"role": "user", "content": "Count."}]
    if stream:
        chunks = chat.chat.completions.create(model="m", messages=hi, max_tokens=limit, stream=True)
        finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
        with claude.messages.stream(model="m", max_tokens=limit, messages=hi) as events:
            stop = events.get_final_message().stop_reason
        sse = chat.responses.create(
            model="m", input=hi, max_output_tokens=limit, store=False, stream=True
        )
        ends = [e for e in sse if e.type in ("response.completed", "response.incomplete")]
        assert len(ends) == 1
        response = ends[0].response
    else:
        reply = chat.chat.completions.create(model="m", messages=hi, max_tokens=limit)
        finish = reply.choices[0].finish_reason
        stop = claude.messages.create(model="m", max_tokens=limit, messages=hi).stop_reason
        response = chat.responses.create(model="m", input=hi, max_output_tokens=limit, store=False)
    details = response.incomplete_details
    return {
        "chat": finish,
        "messages": stop,
        "responses": (response.status, details.reason if details else None),
    }


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_a_reply_cut_at_max_tokens_says_so_in_every_wire_format(tokenizer, stream) -> None:
    """A token model's reply that reached the request's limit without ending its turn is a
    length stop, told as each API tells it, also when the model leaves its finish reason to
    be inferred (as the built-in loop infers it). Before: "stop", "end_turn", "completed"."""
    from uniagent.gateway import Gateway, TokenModelBackend
    from uniagent.gateway.server import start
    from uniagent.testing.scripted import ScriptedTokenModel

    model = ScriptedTokenModel(tokenizer, [LONG] * 3 + ["Done."] * 3)
    with start(Gateway(TokenModelBackend(model))) as served:
        session = served.gateway.open_session()
        cut = cut_replies(served.base_url(session), stream, limit=4)
        assert cut == {
            "chat": "length",
            "messages": "max_tokens",
            "responses": ("incomplete", "max_output_tokens"),
        }
        # A turn that ends (its end-of-turn token) exactly at the limit is not cut.
        ended = cut_replies(
            served.base_url(session), stream, limit=len(model.tokenizer.encode("Done.")) + 1
        )
        assert ended == {"chat": "stop", "messages": "end_turn", "responses": ("completed", None)}
