"""Prefix exactness per turn, the token-model adapter and the qwen3_coder parser."""

from __future__ import annotations

import pytest
from conftest import TOOLS, check_tree

from uniagent.gateway import Gateway, ScriptedBackend, TokenModelBackend
from uniagent.gateway.wire import openai_chat
from uniagent.testing.scripted import ScriptedTokenModel

TASK = [{"role": "user", "content": "list"}]
# Not how the template writes a call (no spaces after the separators): the exact ids of
# the reply differ from a fresh render of the conversation that echoes it back.
ODD = '<tool_call>\n{"name":"bash","arguments":{"cmd":"ls"}}\n</tool_call>'


async def two_turns(session, first: str) -> None:
    c = await session.complete(openai_chat.parse({"messages": TASK, "tools": TOOLS}))
    c.commit()
    reply = openai_chat.response(c, "m")["choices"][0]["message"]
    tool = {"role": "tool", "tool_call_id": reply["tool_calls"][0]["id"], "content": "a.txt"}
    c2 = await session.complete(
        openai_chat.parse({"messages": [*TASK, reply, tool], "tools": TOOLS})
    )
    c2.commit()


async def test_drift_from_a_fresh_render_is_recorded_per_turn(tokenizer) -> None:
    backend = ScriptedBackend(tokenizer, [ODD, "Done."])
    session = Gateway(backend).open_session()
    await two_turns(session, ODD)
    tree = session.close()["tree"]
    first, second = tree["turns"]
    assert first["exact"] is True and first["drift"] is None
    assert second["exact"] is False and second["source"] == "extension"
    assert second["drift"]["first_difference"] < first["prompt_len"] + first["generated"]
    assert '"bash","arguments"' in second["drift"]["prompt_text"]  # the model's own ids
    assert session.tree.samples()[0].exact is False


async def test_eager_exactness_checks_each_turn_when_it_is_recorded(tokenizer) -> None:
    backend = ScriptedBackend(tokenizer, [ODD, "Done."])
    session = Gateway(backend, exactness="eager").open_session()
    await two_turns(session, ODD)
    assert [t.exact for t in session.tree.turns] == [True, False]


async def test_a_token_chat_model_serves_as_the_backend(tokenizer) -> None:
    from uniagent.testing.scripted import hermes_call

    model = ScriptedTokenModel(tokenizer, [hermes_call("bash", {"cmd": "ls"}), "Done."])
    backend = TokenModelBackend(model)
    session = Gateway(backend).open_session()
    await two_turns(session, "")
    assert [t.exact for t in (session.close(), session.tree.turns)[1]] == [True, True]
    assert len(model.calls) == 2 and model.calls[1] == session.tree.turns[1].prompt_len
    with pytest.raises(TypeError, match="not a token model"):
        TokenModelBackend(object())  # type: ignore[arg-type]


async def test_qwen3_coder_calls_are_read_with_the_schema_types(tokenizer) -> None:
    tools = [
        {
            "type": "function",
            "function": {
                "name": "wait",
                "parameters": {
                    "type": "object",
                    "properties": {"seconds": {"type": "integer"}, "why": {"type": "string"}},
                },
            },
        }
    ]
    text = (
        "<tool_call>\n<function=wait>\n<parameter=seconds>\n5\n</parameter>\n"
        "<parameter=why>\n12\n</parameter>\n</function>\n</tool_call>"
    )
    backend = ScriptedBackend(tokenizer, [text])
    session = Gateway(backend, parser="qwen3_coder").open_session()
    c = await session.complete(openai_chat.parse({"messages": TASK, "tools": tools}))
    c.commit()
    assert [(t["name"], t["arguments"]) for t in c.tool_calls] == [
        ("wait", {"seconds": 5, "why": "12"})
    ]
    assert c.finish_reason == "tool_calls"
    check_tree(session.tree, backend)


async def test_a_malformed_call_is_returned_as_text_and_the_problem_recorded(tokenizer) -> None:
    backend = ScriptedBackend(tokenizer, ["<tool_call>\n{not json\n</tool_call>"])
    session = Gateway(backend).open_session()
    c = await session.complete(openai_chat.parse({"messages": TASK, "tools": TOOLS}))
    c.commit()
    assert c.tool_calls == [] and c.finish_reason == "stop" and "{not json" in c.content
    assert c.turn.parse_error is not None and c.turn.parse_error.startswith("invalid_json")
