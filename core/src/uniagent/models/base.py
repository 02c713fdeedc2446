"""The chat-model protocol used by the interaction loop, its turn record and its errors.

A backend owns the rollout's contents: :meth:`ChatModel.start_cache` builds
the cache (token mode for token servers, message mode for plain chat APIs) and
:meth:`ChatModel.generate` appends the model's turn to it before returning one
:class:`ModelTurn`, so token exactness is enforced in one place. Backends do not
parse tool calls: the loop does, once::

    cache = model.start_cache(messages, [t.openai_schema() for t in tools])
    while ...:
        turn = await model.generate(cache, stop=parser.stop_sequences)  # ContextLimitError
        calls = parse_turn(turn, parser, tools)  # ToolCallFormatError
        ...
        cache.append_messages(observations)
"""

from __future__ import annotations

import contextvars
import uuid
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from uniagent.errors import UniAgentError
from uniagent.parsers import ToolCallParser
from uniagent.rollout import Rollout
from uniagent.rollout.template import decode

FinishReason = Literal["stop", "length", "tool_calls"]


class ModelError(UniAgentError):
    """The model backend failed (after its retries): exit reason ``model_error``."""


class ContextLimitError(UniAgentError):
    """The context window or the response budget is spent: exit reason ``token_limit``."""


@dataclass
class Usage:
    """Token counts of one model call."""

    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        """Prompt plus completion tokens."""
        return self.prompt_tokens + self.completion_tokens


@dataclass
class ModelTurn:
    """One model turn, already appended to the rollout by the backend.

    ``text`` is what the model wrote (a chat API's message content; a token
    backend's decoded ids without the end-of-turn token); ``raw_tool_calls`` the
    structured calls a chat API returned, as it returned them (``None`` when the
    model wrote its calls as text); ``prompt_exact`` whether the prompt the
    server generated from was exactly the cache's context ids (``None``: not
    known, as with a plain chat API in message mode; ``False`` makes the
    trajectory inexact, recorded and masked by default).
    """

    text: str
    finish_reason: FinishReason
    raw_tool_calls: list[dict[str, Any]] | None = None
    reasoning: str | None = None
    usage: Usage = field(default_factory=Usage)
    prompt_exact: bool | None = None


@runtime_checkable
class ChatModel(Protocol):
    """A model backend as the interaction loop sees it."""

    def start_cache(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> Rollout:
        """A rollout for a new episode (``tools`` as OpenAI schemas)."""
        ...

    def renders_tools(self) -> bool:
        """Whether the model is shown the tool schemas (else the caller describes them)."""
        ...

    async def generate(
        self,
        cache: Rollout,
        *,
        stop: Sequence[str] = (),
        call_format: ToolCallParser | None = None,
    ) -> ModelTurn:
        """Generate the next assistant turn from ``cache``, append it, and return it.

        Generation ends at any of ``stop`` (the text up to and including it is
        kept). ``call_format`` is the tool-call format the loop will parse, for
        backends that constrain decoding to it; the tools are ``cache.tools``.
        Raises :class:`ContextLimitError` when there is no room left and
        :class:`ModelError` when the backend fails after its retries.
        """
        ...


@dataclass
class Generation:
    """A token backend's raw output: ids (end-of-turn included when produced) and log-probs."""

    token_ids: list[int]
    logprobs: list[float] | None
    finish_reason: FinishReason | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class TokenChatModel(ABC):
    """Base of backends that continue the cache's context ids (verl server, local HF).

    Budgets: ``max_model_len`` bounds prompt + response (the context window),
    ``response_length`` bounds everything after the prompt over the whole episode
    (model and environment tokens, verl's ``response_length``), and
    ``sampling_params["max_tokens"]`` bounds one turn. Each call asks for at most
    what remains; when nothing remains, :class:`ContextLimitError` is raised.
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        sampling_params: Mapping[str, Any] | None = None,
        max_model_len: int | None = None,
        response_length: int | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.sampling_params = dict(sampling_params or {})
        self.max_model_len = max_model_len
        self.response_length = response_length
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self._renders_tools: bool | None = None

    @abstractmethod
    async def _generate(self, prompt_ids: list[int], max_tokens: int | None) -> Generation:
        """Generate from ``prompt_ids``; raise :class:`ModelError` on failure."""

    #: The tool-call format of the episode being generated, for backends that constrain
    #: decoding (set by :meth:`generate` for the duration of one call, per asyncio task).
    call_format: contextvars.ContextVar[ToolCallParser | None] = contextvars.ContextVar(
        "call_format", default=None
    )

    def start_cache(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> Rollout:
        """A token-mode cache rendered with this model's tokenizer and chat template."""
        return Rollout.start(
            self.tokenizer, messages, [dict(t) for t in tools or ()], **self.chat_template_kwargs
        )

    def renders_tools(self) -> bool:
        """Whether the chat template shows tool schemas to the model (checked once)."""
        if self._renders_tools is None:
            probe = [{"role": "user", "content": "x"}]
            tool = {
                "type": "function",
                "function": {"name": "probe_tool_7f3a", "description": "d", "parameters": {}},
            }

            def render(tools: list[dict[str, Any]] | None) -> str:
                return str(
                    self.tokenizer.apply_chat_template(
                        probe,
                        tools=tools,
                        tokenize=False,
                        add_generation_prompt=True,
                        **self.chat_template_kwargs,
                    )
                )

            self._renders_tools = render([tool]) != render(None)
        return self._renders_tools

    def remaining_tokens(self, cache: Rollout) -> int | None:
        """Tokens the next call may generate (None: unbounded)."""
        limits = []
        if self.max_model_len is not None:
            limits.append(self.max_model_len - cache.context_length)
        if self.response_length is not None:
            limits.append(self.response_length - (cache.context_length - len(cache.prompt_ids)))
        per_turn = self.sampling_params.get("max_tokens")
        if per_turn is not None:
            limits.append(int(per_turn))
        return min(limits) if limits else None

    async def generate(
        self,
        cache: Rollout,
        *,
        stop: Sequence[str] = (),
        call_format: ToolCallParser | None = None,
    ) -> ModelTurn:
        """Generate from ``cache.context_ids``, append the ids and log-probs as returned."""
        if cache.mode != "tokens":
            raise ModelError(f"{type(self).__name__} needs a token-mode cache (use start_cache)")
        budget = self.remaining_tokens(cache)
        if budget is not None and budget <= 0:
            raise ContextLimitError(self._limit_message(cache))
        prompt_len = cache.context_length
        reset = TokenChatModel.call_format.set(call_format)
        try:
            out = await self._generate(cache.context_ids, budget)
        finally:
            TokenChatModel.call_format.reset(reset)
        if stop:
            out = cut_at_stop(self.tokenizer, out, stop)
        if not out.token_ids:
            raise ModelError(f"{type(self).__name__} returned no tokens ({out.extra or 'no info'})")
        if out.logprobs is not None and len(out.logprobs) != len(out.token_ids):
            raise ModelError(
                f"{type(self).__name__} returned {len(out.logprobs)} log-probs for "
                f"{len(out.token_ids)} tokens"
            )
        analysis = cache.template
        eot = analysis.eot_id if analysis is not None else None
        ended = out.token_ids[-1] == eot or out.token_ids[-1] in self._stop_ids()
        finish: FinishReason = out.finish_reason or (
            "stop" if ended or budget is None or len(out.token_ids) < budget else "length"
        )
        body = out.token_ids[:-1] if out.token_ids[-1] == eot else out.token_ids
        text = decode(self.tokenizer, body)
        # Hand the decoded text to the cache so it is decoded once; a generation that
        # continues an open (length-cut) turn lets the cache decode the whole turn.
        continuing = bool(cache.messages) and cache.messages[-1].get("role") == "assistant"
        message = None if continuing else {"role": "assistant", "content": text}
        cache.append_generation(out.token_ids, out.logprobs, message=message)
        turn = ModelTurn(
            text=text,
            finish_reason=finish,
            usage=Usage(prompt_tokens=prompt_len, completion_tokens=len(out.token_ids)),
            prompt_exact=True,  # the cache's own context ids are what was sent
        )
        remaining = self.remaining_tokens(cache)
        if finish == "length" and remaining is not None and remaining <= 0:
            raise ContextLimitError(self._limit_message(cache))
        return turn

    def _stop_ids(self) -> set[int]:
        eos = getattr(self.tokenizer, "eos_token_id", None)
        return {eos} if isinstance(eos, int) else set()

    def _limit_message(self, cache: Rollout) -> str:
        return (
            f"no room to generate: context {cache.context_length} tokens "
            f"(max_model_len={self.max_model_len}), response "
            f"{cache.context_length - len(cache.prompt_ids)} tokens "
            f"(response_length={self.response_length})"
        )


def cut_at_stop(tokenizer: Any, out: Generation, stop: Sequence[str]) -> Generation:
    """``out`` up to the token that completes the first of ``stop`` (ids as generated).

    For backends without native stop strings: the ids kept are a prefix of
    what the model produced, never re-tokenized.
    """
    text = ""
    for i, token in enumerate(out.token_ids):
        text += decode(tokenizer, [token])
        if any(s in text for s in stop):
            if i + 1 == len(out.token_ids):
                return out
            logprobs = out.logprobs[: i + 1] if out.logprobs is not None else None
            return Generation(out.token_ids[: i + 1], logprobs, "stop", dict(out.extra))
    return out


def new_request_id() -> str:
    """A fresh request id (one per episode: a sticky session on the server)."""
    return uuid.uuid4().hex
