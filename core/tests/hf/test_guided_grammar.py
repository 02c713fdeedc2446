"""The guided tool-call grammar compiled by the real llguidance, on real tokenizers (no model).

SmolLM2's (spells ``<tool_call>`` in text) and Qwen3's (``<tool_call>`` is one added
token). Run by the ``hf`` nox session (llguidance comes with the ``hf`` extra).
"""

from __future__ import annotations

import copy
import functools
import json
import logging
from typing import Any

import numpy as np
import pytest

from uniagent.models.base import ModelError
from uniagent.models.gguf import converted_gguf
from uniagent.models.guided import (
    GrammarCacheInfo,
    GuidedDecoding,
    ToolCallGuide,
    mask_scores,
    tool_call_grammar,
    unpack_bitmask,
)
from uniagent.models.hf import smollm2_gguf_path
from uniagent.parsers import HermesParser
from uniagent.rollout import analyse_chat_template
from uniagent.rollout.template import encode
from uniagent.testing.rollout import EXECUTE_BASH_SCHEMA

PARSER = HermesParser()
SUBMIT = {
    "type": "function",
    "function": {"name": "submit", "description": "Finish.", "parameters": {}},
}
SCHEMAS = [EXECUTE_BASH_SCHEMA, SUBMIT]
CALL = '<tool_call>\n{"name": "execute_bash", "arguments": {"command": "ls"}}\n</tool_call>'


@pytest.fixture(scope="module")
def smollm2_tokenizer() -> Any:
    from transformers import AutoTokenizer

    # As HFLocalModel loads it: from the file's converted folder (made once per machine; the
    # same tokenizer as the file's, test_hf_model.py checks), not the GGUF file itself (about
    # 8 s of CPU per load).
    return AutoTokenizer.from_pretrained(str(converted_gguf(smollm2_gguf_path())))


@pytest.fixture(params=["smollm2", "qwen3"])
def tokenizer(request: pytest.FixtureRequest, smollm2_tokenizer: Any) -> Any:
    if request.param == "smollm2":
        return smollm2_tokenizer
    return request.getfixturevalue("qwen3_tokenizer")


def guide_for(tokenizer: Any, thought_chars: int = 200) -> ToolCallGuide:
    eot = analyse_chat_template(tokenizer).eot_id
    return ToolCallGuide(tokenizer, eot, GuidedDecoding(thought_chars=thought_chars))


def writes(guide: ToolCallGuide, text: str, schemas: list[Any] = SCHEMAS) -> bool:
    """Whether the grammar lets the model write ``text`` (as the tokenizer tokenizes it)
    and then end the turn with the end-of-turn token."""
    turn = guide.matcher(schemas, PARSER)
    ids = [*encode(guide.tokenizer, text), guide.end_of_turn]
    return bool(turn.matcher.consume_tokens(ids)) and turn.matcher.is_stopped()


# -- the thought --------------------------------------------------------------------------
def test_a_thought_ends_with_one_newline_then_the_call(tokenizer: Any) -> None:
    guide = guide_for(tokenizer)
    assert writes(guide, CALL)  # no thought
    assert writes(guide, f"I will list the files.\n{CALL}")  # one newline: not swallowed
    assert writes(guide, f"\n{CALL}")  # an empty thought
    assert writes(guide, f"First look.\nThen decide.\n{CALL}")  # lines of thought
    assert not writes(guide, f"I will list the files.{CALL}")  # the newline is required
    assert not writes(guide, f"a <b> c\n{CALL}")  # no '<' in a thought


def test_the_thought_limit_counts_its_newline(tokenizer: Any) -> None:
    guide = guide_for(tokenizer, thought_chars=12)
    assert writes(guide, "x" * 11 + "\n" + CALL)  # 12 characters with the newline
    assert not writes(guide, "x" * 12 + "\n" + CALL)
    none = guide_for(tokenizer, thought_chars=0)
    assert writes(none, CALL)
    assert not writes(none, f"\n{CALL}") and not writes(none, f"Hm.\n{CALL}")


def test_the_grammar_text_has_one_thought_lexeme() -> None:
    grammar = tool_call_grammar(SCHEMAS, PARSER, thought_chars=200)
    assert "thought: /[^<]{0,199}\\n/" in grammar.splitlines()
    assert not tool_call_grammar(SCHEMAS, PARSER, thought_chars=0).count("thought")


# -- the end of the turn ------------------------------------------------------------------
def test_only_the_templates_end_of_turn_ends_a_turn(smollm2_tokenizer: Any) -> None:
    # A tokenizer whose eos is not the template's end of turn (as base-model tokenizers
    # ship): ending on that eos would leave the turn unclosed for the next render.
    tokenizer = copy.deepcopy(smollm2_tokenizer)
    tokenizer.eos_token = "<|endoftext|>"
    eos, im_end = tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert eos != im_end and analyse_chat_template(tokenizer).eot_id == im_end
    guide = guide_for(tokenizer)
    turn = guide.matcher(SCHEMAS, PARSER)
    assert turn.matcher.consume_tokens(encode(tokenizer, CALL))
    allowed = turn.allowed()
    assert np.flatnonzero(allowed).tolist() == [im_end]
    assert not turn.matcher.consume_token(eos)


# -- the mask -----------------------------------------------------------------------------
def test_the_packed_mask_is_unpacked_as_llguidance_applies_it(tokenizer: Any) -> None:
    from llguidance.numpy import (
        allocate_token_bitmask,
        apply_token_bitmask_inplace,
        fill_next_token_bitmask,
    )

    guide = guide_for(tokenizer)
    turn = guide.matcher(SCHEMAS, PARSER)
    vocab = turn.vocab_size
    assert vocab == len(tokenizer)
    width = vocab + 45  # models pad their embeddings (Qwen3: 151936 logits, 151669 tokens)
    rng = np.random.default_rng(0)
    import torch

    for token in encode(tokenizer, f"Ok.\n{CALL}") + [guide.end_of_turn]:
        packed = allocate_token_bitmask(1, vocab)
        fill_next_token_bitmask(turn.matcher, packed)
        logits = rng.standard_normal((1, width)).astype(np.float32)
        expected = logits.copy()
        apply_token_bitmask_inplace(expected, packed)  # llguidance's own reference
        allowed = turn.allowed()
        assert allowed.shape == (vocab,)
        assert np.array_equal(allowed, unpack_bitmask(packed[0], vocab))
        got = mask_scores(torch.from_numpy(logits), allowed).numpy()
        assert np.array_equal(np.isinf(got), np.isinf(expected))
        assert np.array_equal(got[~np.isinf(got)], expected[~np.isinf(expected)])
        assert np.isinf(got[0, vocab:]).all()  # padded rows: never sampled
        turn.advance(token)
    assert turn.matcher.is_stopped()


def test_the_mask_across_word_boundaries() -> None:
    # Token i is bit i % 32 of word i // 32: ids 0, 31, 32, 33, 63, 64 and the last one.
    vocab = 70
    ids = [0, 31, 32, 33, 63, 64, 69]
    words = np.zeros(3, dtype=np.int32)
    for i in ids:
        words[i // 32] |= np.int32(1 << (i % 32)) if i % 32 != 31 else np.int32(-(2**31))
    assert np.flatnonzero(unpack_bitmask(words, vocab)).tolist() == ids
    big_endian = words.astype(">i4")  # the same numbers stored the other way round
    assert np.flatnonzero(unpack_bitmask(big_endian, vocab)).tolist() == ids


def test_logits_narrower_than_an_allowed_id_are_an_error_not_a_silent_cut() -> None:
    import torch

    allowed = np.zeros(100, dtype=bool)
    allowed[[3, 97]] = True
    with pytest.raises(ModelError, match="the model has 90 logits but the grammar allows"):
        mask_scores(torch.zeros(1, 90), allowed)
    allowed[97] = False
    out = mask_scores(torch.zeros(1, 90), allowed)  # only disallowed ids cut: fine
    assert torch.isfinite(out[0]).nonzero().flatten().tolist() == [3]
    with pytest.raises(ModelError, match="allows no token"):
        mask_scores(torch.zeros(1, 100), np.zeros(100, dtype=bool))


# -- tool schemas llguidance cannot compile, and the compile cache -------------------------
def tool(name: str, parameters: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {"name": name, "description": "", "parameters": parameters},
    }


def call(name: str, arguments: dict[str, Any]) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def test_unsupported_schema_features_fall_back_per_tool_with_a_warning(
    smollm2_tokenizer: Any, caplog: pytest.LogCaptureFixture
) -> None:
    unique = tool(  # uniqueItems: not implemented by llguidance, ignored leniently
        "tag",
        {
            "type": "object",
            "properties": {
                "tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}
            },
            "required": ["tags"],
        },
    )
    lookahead = tool(  # a look-ahead pattern: not compilable at all, any object then
        "grep",
        {"type": "object", "properties": {"pattern": {"type": "string", "pattern": "^(?=a).*$"}}},
    )
    refs = tool(  # $defs/$ref (as pydantic writes them): compiled exactly
        "edit",
        {
            "$defs": {
                "Span": {
                    "type": "object",
                    "properties": {"line": {"type": "integer"}},
                    "required": ["line"],
                }
            },
            "type": "object",
            "properties": {"span": {"$ref": "#/$defs/Span"}},
            "required": ["span"],
        },
    )
    schemas = [EXECUTE_BASH_SCHEMA, unique, lookahead, refs]
    guide = guide_for(smollm2_tokenizer, thought_chars=0)
    with caplog.at_level(logging.WARNING, logger="uniagent.models.guided"):
        assert writes(guide, CALL, schemas)  # the other tools are unaffected
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2, warnings
    assert "'tag'" in warnings[0] and "uniqueItems" in warnings[0]
    assert "'grep'" in warnings[1] and "look-around" in warnings[1]
    assert "any JSON object" in warnings[1]
    assert writes(guide, call("tag", {"tags": ["a", "a"]}), schemas)  # loosened there only
    assert not writes(guide, call("tag", {"tags": [1]}), schemas)  # the rest still holds
    assert writes(guide, call("grep", {"anything": [1, 2]}), schemas)
    assert writes(guide, call("edit", {"span": {"line": 3}}), schemas)
    assert not writes(guide, call("edit", {"span": {"line": "3"}}), schemas)  # the $ref holds


def test_a_grammar_is_compiled_once_per_tools_and_parser(smollm2_tokenizer: Any) -> None:
    guide = guide_for(smollm2_tokenizer)
    assert guide.compilations == 0
    first = guide.matcher(SCHEMAS, PARSER)
    second = guide.matcher([dict(s) for s in SCHEMAS], PARSER)  # equal tools: cached
    assert guide.compilations == 1
    assert first.matcher is not second.matcher  # each turn has its own state
    assert first.matcher.consume_tokens(encode(smollm2_tokenizer, "Hm.\n"))
    assert second.matcher.consume_tokens(encode(smollm2_tokenizer, CALL))  # not advanced by first
    guide.matcher([SUBMIT], PARSER)
    assert guide.compilations == 2
    third = guide.matcher(SCHEMAS, PARSER, encode(smollm2_tokenizer, "Hm.\n<tool_call>"))
    assert guide.compilations == 2 and not third.matcher.is_error()


def test_the_grammar_cache_is_a_bounded_lru_and_counts_its_hits(smollm2_tokenizer: Any) -> None:
    # Tools set per task: each task's settings give another tool set, so another grammar.
    eot = analyse_chat_template(smollm2_tokenizer).eot_id
    guide = ToolCallGuide(smollm2_tokenizer, eot, GuidedDecoding(), max_grammars=2)

    def tools(n: int) -> list[Any]:
        return [{**SUBMIT, "function": {**SUBMIT["function"], "description": f"Finish {n}."}}]

    guide.matcher(tools(1), PARSER)
    guide.matcher(tools(2), PARSER)
    guide.matcher(tools(1), PARSER)  # a hit, and now the most recently used
    guide.matcher(tools(3), PARSER)  # over the bound: evicts tools(2), not tools(1)
    assert guide.cache_info() == GrammarCacheInfo(hits=1, misses=3, evictions=1, size=2, max_size=2)
    guide.matcher(tools(1), PARSER)  # still cached
    assert guide.compilations == 3
    turn = guide.matcher(tools(2), PARSER)  # evicted: compiled again, and works
    assert guide.compilations == 4 and not turn.matcher.is_error()
    info = guide.cache_info()
    assert (info.hits, info.misses, info.evictions, info.size) == (2, 4, 2, 2)
    assert info.hit_rate == 2 / 6
    for n in range(4, 40):  # many tasks' tool sets: the cache stays at its bound
        guide.matcher(tools(n), PARSER)
    assert guide.cache_info().size == 2
    with pytest.raises(ValueError, match="at least 1"):
        ToolCallGuide(smollm2_tokenizer, eot, GuidedDecoding(), max_grammars=0)


def test_guides_of_one_tokenizer_share_llguidances_view_of_it(smollm2_tokenizer: Any) -> None:
    """Building llguidance's tokenizer costs seconds: a second guide of the same tokenizer (a
    task with other guided settings) reuses it; another end-of-turn token gets its own."""
    first, second = guide_for(smollm2_tokenizer), guide_for(smollm2_tokenizer, thought_chars=10)
    assert writes(first, CALL) and writes(second, CALL)
    assert first._ll_tokenizer is not None and first._ll_tokenizer is second._ll_tokenizer
    eot = first.end_of_turn
    other_end = next(i for i in smollm2_tokenizer.all_special_ids if i != eot)
    other = ToolCallGuide(smollm2_tokenizer, other_end, GuidedDecoding())
    other.matcher(SCHEMAS, PARSER)
    assert other._ll_tokenizer is not first._ll_tokenizer


# -- closing the call within the turn's token budget ---------------------------------------
EDITOR = tool(
    "edit",
    {
        "type": "object",
        "properties": {
            "command": {"type": "string", "enum": ["view", "create", "undo_edit"]},
            "path": {"type": "string"},
            "view_range": {
                "type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 2
            },
            "line": {"type": "integer", "minimum": 1},
        },
        "required": ["command", "path"],
        "additionalProperties": False,
    },
)  # fmt: skip
BUDGET_SCHEMAS = [EXECUTE_BASH_SCHEMA, SUBMIT, EDITOR]
BASH = '<tool_call>\n{"name": "execute_bash", "arguments": {"command": '
EDIT = '<tool_call>\n{"name": "edit", "arguments": {"command": "view", "path": "/a"'


def finished_call(tokenizer: Any, guide: ToolCallGuide, ids: list[int]) -> dict[str, Any]:
    """The call ``ids`` write: they end with the end of turn and the grammar accepts them."""
    assert ids[-1] == guide.end_of_turn
    turn = guide.matcher(BUDGET_SCHEMAS, PARSER)
    assert turn.matcher.consume_tokens(ids) and turn.matcher.is_stopped()
    text = tokenizer.decode(ids[:-1])
    body = text[text.index(PARSER.open_tag) + len(PARSER.open_tag) :]
    return json.loads(body[: body.index(PARSER.close_tag)])


@pytest.mark.parametrize(
    "prefix",
    [
        "",  # nothing yet: straight to the open tag
        "Let me look",  # inside the thought: a newline, then the tag
        "Let me look.\n",
        "<tool",  # inside the open tag
        '<tool_call>\n{"name": "ex',  # inside the tool's name
        BASH + '"ls -la /tmp',  # inside a JSON string
        BASH + '"echo \\',  # an escape begun
        BASH + '"echo \\u00',  # a unicode escape begun
        EDIT[: EDIT.index("view") + 2],  # inside an enum value
        EDIT + ', "view_range": [',  # an array that needs two items
        EDIT + ', "view_range": [12',
        EDIT + ', "line": ',  # a number with a minimum
        EDIT,  # after a value: close the object
    ],
)
def test_the_closing_path_finishes_a_call_from_anywhere(tokenizer: Any, prefix: str) -> None:
    guide = guide_for(tokenizer)
    ids = encode(tokenizer, prefix)
    if prefix == "<tool" and PARSER.open_tag in tokenizer.get_added_vocab():
        with pytest.raises(ModelError, match="not a valid start"):  # the tag is one token
            guide.matcher(BUDGET_SCHEMAS, PARSER, ids)
        return
    turn = guide.matcher(BUDGET_SCHEMAS, PARSER, ids)
    path = turn.closing_path()
    assert path is not None
    call = finished_call(tokenizer, guide, [*ids, *path])
    assert call["name"] in {"execute_bash", "submit", "edit"}


@functools.cache
def _closers(tokenizer: Any) -> Any:
    """Token ids whose text would close something (a string, an object, an array, a line)."""
    texts = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    decoded = [tokenizer.convert_tokens_to_string([t]) if t is not None else "" for t in texts]
    return np.array([any(c in text for c in '"}]\n') for text in decoded])


def stubborn_turn(tokenizer: Any, budget: int | None, seed: int, steps: int) -> list[int]:
    """A turn generated by a stand-in model that never wants to close anything: random
    scores, far lower for every token that would close a string, an object, an array, a
    line or the turn. The processor is called as ``generate()`` calls it, and the argmax
    of what it leaves is taken at each step."""
    import torch

    from uniagent.models.guided import GuidedLogitsProcessor

    guide = guide_for(tokenizer)
    prompt = encode(tokenizer, "<|im_start|>assistant\n")
    turn = guide.matcher(BUDGET_SCHEMAS, PARSER)
    processor = GuidedLogitsProcessor(turn, len(prompt), budget)
    penalty = np.where(_closers(tokenizer), -100.0, 0.0).astype(np.float32)
    penalty[guide.end_of_turn] = -100.0
    rng = np.random.default_rng(seed)
    ids = list(prompt)
    for _ in range(steps):
        noise = rng.standard_normal(len(tokenizer)).astype(np.float32)
        scores = torch.from_numpy((noise + penalty)[None, :])
        token = int(processor(torch.tensor([ids]), scores).argmax())
        ids.append(token)
        if token == guide.end_of_turn:
            break
    return ids[len(prompt) :]


@pytest.mark.parametrize("budget", [40, 64, 100])
def test_a_turn_closes_its_call_within_its_budget(tokenizer: Any, budget: int) -> None:
    guide = guide_for(tokenizer)
    for seed in range(2):
        ids = stubborn_turn(tokenizer, budget, seed, steps=budget)
        assert len(ids) <= budget
        finished_call(tokenizer, guide, ids)  # a complete, valid call


def test_without_a_budget_the_stubborn_model_never_closes(tokenizer: Any) -> None:
    # What the budget changes: unbounded, the same stand-in model writes on and on.
    ids = stubborn_turn(tokenizer, None, 0, steps=150)
    assert len(ids) == 150 and guide_for(tokenizer).end_of_turn not in ids
