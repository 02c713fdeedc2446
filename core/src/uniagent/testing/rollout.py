"""Replay a conversation through a Rollout with the chat template as the model.

A test double for a token server: each assistant message of the conversation is
"generated" as the ids the template renders for it (what a model trained on that
template emits). Use it to check the rollout on your own tokenizer::

    result = replay(tokenizer, messages, tools)
    assert_rollout_invariants(result)
    print(result.cache.check_exactness().summary())
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from uniagent.rollout import Rollout
from uniagent.testing.tokenizers import template_generation_ids

#: An OpenAI tool schema for a bash tool, for test conversations.
EXECUTE_BASH_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "execute_bash",
        "description": "Run a bash command.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        },
    },
}


@dataclass
class ReplayedCall:
    """One model call as the double made it: where it starts in the context, ids, log-probs."""

    start: int
    ids: list[int]
    logprobs: list[float]
    cut: bool


@dataclass
class ReplayResult:
    """The cache after the replay, plus what the double saw and produced (full copies)."""

    cache: Rollout
    contexts: list[list[int]] = field(default_factory=list)
    generations: list[ReplayedCall] = field(default_factory=list)


def replay(
    tokenizer: Any,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
    *,
    cut: Mapping[int, int] | None = None,
    with_logprobs: bool = True,
    pass_messages: bool = True,
    **chat_template_kwargs: Any,
) -> ReplayResult:
    """Build a Rollout for ``messages``, generating assistant turns with the template.

    ``cut`` maps an assistant-turn index to a number of tokens to drop from the end of
    that generation (``1`` drops just the end-of-turn token: a stop-string cut; more is a
    length cut); a cut turn is recorded from the decoded ids, not from the message.
    Log-probs are distinct per token (``-(turn + 1) - position / 1e4``) so misalignment
    shows. ``pass_messages=False`` lets the cache decode every turn for the record.
    """
    msgs = [dict(m) for m in messages]
    first = next((i for i, m in enumerate(msgs) if m.get("role") == "assistant"), len(msgs))
    tool_list = [dict(t) for t in tools] if tools else None
    cache = Rollout.start(tokenizer, msgs[:first], tool_list, **chat_template_kwargs)
    result = ReplayResult(cache=cache)
    cuts = dict(cut or {})
    history = msgs[:first]
    pending: list[dict[str, Any]] = []
    turn = 0
    for message in msgs[first:]:
        if message.get("role") != "assistant":
            pending.append(message)
            continue
        if pending:
            cache.append_messages(pending)
            history.extend(pending)
            pending = []
        ids = template_generation_ids(
            tokenizer, history, message, tool_list, **chat_template_kwargs
        )
        drop = cuts.get(turn, 0)
        if drop:
            ids = ids[: max(0, len(ids) - drop)]
        logprobs = [-(turn + 1) - pos / 1e4 for pos in range(len(ids))]
        result.contexts.append(cache.context_ids)
        result.generations.append(ReplayedCall(cache.context_length, ids, logprobs, bool(drop)))
        cache.append_generation(
            ids,
            logprobs if with_logprobs else None,
            message=message if pass_messages and not drop else None,
        )
        history.append(cache.messages[-1])
        turn += 1
    if pending:
        cache.append_messages(pending)
    return result


def assert_rollout_invariants(result: ReplayResult) -> None:
    """Assert the prefix invariant and that mask and log-probs mark exactly the generations."""
    cache = result.cache
    final = cache.context_ids
    for turn, context in enumerate(result.contexts):
        assert final[: len(context)] == context, f"context of model call {turn} is not a prefix"
    prompt_len = len(cache.prompt_ids)
    mask = cache.response_mask
    logprobs = cache.response_logprobs
    response = cache.response_ids
    assert len(mask) == len(response) == len(logprobs), "response arrays are misaligned"
    expected_mask = [0] * len(response)
    expected_lp = [0.0] * len(response)
    for gen in result.generations:
        start = gen.start - prompt_len
        assert final[gen.start : gen.start + len(gen.ids)] == gen.ids, "generated ids changed"
        for k in range(len(gen.ids)):
            expected_mask[start + k] = 1
            expected_lp[start + k] = gen.logprobs[k] if cache.has_logprobs else 0.0
    assert mask == expected_mask, "mask does not mark exactly the generated tokens"
    assert logprobs == expected_lp, "log-probs do not align one to one with generated tokens"
    report = cache.check_exactness()
    assert report.prefix_ok, report.summary()
