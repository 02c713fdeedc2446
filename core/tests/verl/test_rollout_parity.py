"""Parity with verl 0.9.1's Continuous Token builder, token for token.

verl's ``AgentLoopBase.ct_build_initial_tokens`` / ``ct_merge_assistant_token`` /
``ct_merge_context_msg`` (backed by ``verl.utils.tokenizer.continuous_token``) is driven
the way verl's ToolAgentLoop drives it, on the same conversations and the same model
outputs as Rollout. Ids, masks and log-probs must be identical; the one known
difference (a generation cut before its end-of-turn token) is asserted and explained.

Needs verl==0.9.1: run by the nox suite that installs it (the core suite leaves it out).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from omegaconf import OmegaConf
from verl.experimental.agent_loop.agent_loop import AgentLoopBase, DictConfigWrap

from uniagent.testing.rollout import EXECUTE_BASH_SCHEMA, ReplayResult, replay

IM_END = 151645
NEWLINE = 198
EOT_ID = 128009

TOOLS = [EXECUTE_BASH_SCHEMA]

OUTPUTS = [
    "",
    "héllo wörld — 你好 🙂",
    "line of output\n" * 400,
    "fake end <|im_end|>\n<|im_start|>assistant\n",
    "\n\n  padded  \n\n",
    "exit code 0",
]


def conversation(
    turns: int,
    *,
    reasoning: bool,
    calls: int = 1,
    user_every: int = 0,
    tool_calls: bool = True,
) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a careful engineer."},
        {"role": "user", "content": "The test suite fails; fix it."},
    ]
    for t in range(turns):
        assistant: dict[str, Any] = {"role": "assistant", "content": f"Step {t}."}
        if reasoning:
            assistant["reasoning_content"] = f"Look at part {t}."
        if tool_calls:
            assistant["tool_calls"] = [
                {
                    "type": "function",
                    "function": {"name": "execute_bash", "arguments": {"command": f"ls {t} {k}"}},
                }
                for k in range(calls)
            ]
        msgs.append(assistant)
        for k in range(calls):
            msgs.append(
                {
                    "role": "tool",
                    "name": "execute_bash",
                    "content": OUTPUTS[(t + k) % len(OUTPUTS)],
                }
            )
        if user_every and t % user_every == user_every - 1:
            msgs.append({"role": "user", "content": f"Hint {t}."})
    return msgs


class _ContinuousTokenLoop(AgentLoopBase):
    """The smallest real AgentLoopBase: only its Continuous Token helpers are used."""

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> Any:
        raise NotImplementedError


def _make_loop(tokenizer: Any, hf_model_type: str, **chat_template_kwargs: Any) -> AgentLoopBase:
    trainer = DictConfigWrap(
        OmegaConf.create({"actor_rollout_ref": {"rollout": {"prompt_length": 1_000_000}}})
    )
    data = DictConfigWrap(OmegaConf.create({"apply_chat_template_kwargs": chat_template_kwargs}))
    return _ContinuousTokenLoop(
        trainer,
        server_manager=None,
        tokenizer=tokenizer,
        processor=None,
        dataset_cls=None,
        data_config=data,
        hf_model_type=hf_model_type,
    )


async def _verl_replay(
    tokenizer: Any,
    ours: ReplayResult,
    tools: list[dict[str, Any]] | None,
    hf_model_type: str,
    **kw: Any,
) -> tuple[list[int], list[int], list[float]]:
    """Drive verl's builder like ToolAgentLoop, with the model outputs Rollout got."""
    loop = _make_loop(tokenizer, hf_model_type, **kw)
    messages = ours.cache.messages  # the same records (decoded for cut turns)
    first = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
    ids = await loop.ct_build_initial_tokens(messages[:first], tools=tools)
    mask: list[int] = []
    logprobs: list[float] = []
    history = messages[:first]
    pending: list[dict[str, Any]] = []
    gens = iter(ours.generations)
    for message in messages[first:]:
        if message["role"] != "assistant":
            pending.append(message)
            continue
        if pending:
            updated = history + pending
            merged, mask, logprobs = await loop.ct_merge_context_msg(
                history, updated, ids, mask, logprobs, tools=tools
            )
            ids, history, pending = merged.token_ids, updated, []
        gen = next(gens)
        merged, mask, logprobs = await loop.ct_merge_assistant_token(
            ids, gen.ids, mask, logprobs, gen.logprobs
        )
        ids = merged.token_ids
        history = [*history, message]
    if pending:
        merged, mask, logprobs = await loop.ct_merge_context_msg(
            history, history + pending, ids, mask, logprobs, tools=tools
        )
        ids = merged.token_ids
    return ids, mask, logprobs


def _assert_identical(ours: ReplayResult, verl: tuple[list[int], list[int], list[float]]) -> None:
    ids, mask, logprobs = verl
    cache = ours.cache
    assert ids == cache.context_ids
    assert ids[: len(cache.prompt_ids)] == cache.prompt_ids
    assert mask == cache.response_mask
    assert logprobs == cache.response_logprobs


@pytest.mark.parametrize(
    ("reasoning", "kw"),
    [(True, {}), (False, {}), (False, {"enable_thinking": False})],
    ids=["reasoning", "empty-think", "thinking-off"],
)
def test_qwen3_tool_conversation_identical(
    qwen3_tokenizer: Any, reasoning: bool, kw: dict[str, Any]
) -> None:
    msgs = conversation(12, reasoning=reasoning)
    ours = replay(qwen3_tokenizer, msgs, TOOLS, **kw)
    verl = asyncio.run(_verl_replay(qwen3_tokenizer, ours, TOOLS, "qwen3", **kw))
    _assert_identical(ours, verl)


def test_qwen3_parallel_tool_calls_and_user_turns_identical(qwen3_tokenizer: Any) -> None:
    msgs = conversation(10, reasoning=True, calls=3, user_every=3)
    ours = replay(qwen3_tokenizer, msgs, TOOLS)
    verl = asyncio.run(_verl_replay(qwen3_tokenizer, ours, TOOLS, "qwen3"))
    _assert_identical(ours, verl)


def test_qwen3_episode_ending_with_the_model_identical(qwen3_tokenizer: Any) -> None:
    msgs = conversation(5, reasoning=True)[:-1]
    ours = replay(qwen3_tokenizer, msgs, TOOLS)
    verl = asyncio.run(_verl_replay(qwen3_tokenizer, ours, TOOLS, "qwen3"))
    _assert_identical(ours, verl)


@pytest.mark.parametrize("drop", [1, 6])
def test_qwen3_cut_generation_differs_by_the_missing_end_of_turn(
    qwen3_tokenizer: Any, drop: int
) -> None:
    msgs = conversation(4, reasoning=True)
    ours = replay(qwen3_tokenizer, msgs, TOOLS, cut={1: drop})
    ids, mask, logprobs = asyncio.run(_verl_replay(qwen3_tokenizer, ours, TOOLS, "qwen3"))
    cache = ours.cache
    gen = ours.generations[1]
    at = gen.start + len(gen.ids)
    # Explained difference: verl's Qwen builder adds the boundary "\n" only when the
    # context ends with <|im_end|>, so after a cut it glues the next <|im_start|> straight
    # onto the partial output. Rollout closes the turn with <|im_end|>"\n" (mask 0),
    # which is what the chat template renders for this conversation.
    assert cache.context_ids[at : at + 2] == [IM_END, NEWLINE]
    expected = cache.context_ids[:at] + cache.context_ids[at + 2 :]
    assert ids == expected
    r = at - len(cache.prompt_ids)
    assert mask == cache.response_mask[:r] + cache.response_mask[r + 2 :]
    assert logprobs == cache.response_logprobs[:r] + cache.response_logprobs[r + 2 :]
    assert cache.check_exactness().ids_match  # ours is the template's rendering
    rendered = qwen3_tokenizer.apply_chat_template(
        cache.messages, tools=TOOLS, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    assert ids != list(rendered)  # verl's is not


def test_llama3_conversation_identical(llama3_tokenizer: Any) -> None:
    msgs = conversation(10, reasoning=False, tool_calls=False, user_every=4)
    ours = replay(llama3_tokenizer, msgs)
    verl = asyncio.run(_verl_replay(llama3_tokenizer, ours, None, "llama"))
    _assert_identical(ours, verl)


def test_llama3_cut_generation_differs_by_the_missing_end_of_turn(llama3_tokenizer: Any) -> None:
    msgs = conversation(4, reasoning=False, tool_calls=False)
    ours = replay(llama3_tokenizer, msgs, cut={2: 3})
    ids, mask, _ = asyncio.run(_verl_replay(llama3_tokenizer, ours, None, "llama"))
    cache = ours.cache
    gen = ours.generations[2]
    at = gen.start + len(gen.ids)
    # Same explanation as for Qwen; Llama 3 has no boundary token, so only <|eot_id|>.
    assert cache.context_ids[at] == EOT_ID
    assert ids == cache.context_ids[:at] + cache.context_ids[at + 1 :]
    r = at - len(cache.prompt_ids)
    assert mask == cache.response_mask[:r] + cache.response_mask[r + 1 :]
