"""Rollout: one episode's record, of one of two kinds (token ids, or messages only).

- :class:`~uniagent.rollout.tokens.TokenRollout` (``mode == "tokens"``, built by
  :meth:`Rollout.start`): the token-exact record a trainer needs, for a token
  server that returns ids and log-probs.
- :class:`~uniagent.rollout.messages.MessageRollout` (``mode == "messages"``, built by
  :meth:`Rollout.messages_only`): the chat messages only, for a chat API that
  returns text.

What a caller needs whatever the kind is :class:`Rollout`'s small protocol: the
conversation (:attr:`~Rollout.messages`), the environment's turns
(:meth:`~Rollout.append_messages`), the answer to a tool call the model wrote as
text (:meth:`~Rollout.answer_text_call`) and a snapshot (``to_dict``/``from_dict``).
The ids and what reads them are the token rollout's; any other rollout raises
:class:`RolloutError` for them.
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from uniagent.errors import UniAgentError
from uniagent.rollout.exactness import ExactnessReport
from uniagent.rollout.template import (
    Message,
    TemplateAnalysis,
    ToolSchema,
    assistant_text,
    encode,
)

Mode = Literal["tokens", "messages"]
PromptTruncation = Literal["left", "error"]

FORMAT = "uniagent.rollout"
FORMAT_VERSION = 1
CHECK_ENV = "UNIAGENT_CHECK_EXACTNESS"
_ENV_ROLES = frozenset({"tool", "user", "system"})


class RolloutError(UniAgentError, ValueError):
    """The rollout was used out of order or with inconsistent data."""


class PromptTooLongError(RolloutError):
    """The prompt exceeds ``prompt_length`` and truncation was set to ``"error"``."""


@dataclass(frozen=True)
class TruncatedRollout:
    """Ids, mask and log-probs cut to the trainer's lengths, still aligned one to one."""

    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_logprobs: list[float] | None
    prompt_truncated: bool
    response_truncated: bool

    @property
    def truncated(self) -> bool:
        """True when anything was cut."""
        return self.prompt_truncated or self.response_truncated


def tool_message(content: str, name: str | None, call_id: str | None) -> Message:
    """A ``role: tool`` message answering the call ``name`` (with id ``call_id``, if any)."""
    message: Message = {"role": "tool", "content": content}
    if name is not None:
        message["name"] = name
    if call_id is not None:
        message["tool_call_id"] = call_id
    return message


class Rollout(ABC):
    """The record of one episode: its conversation, and for a token rollout its exact ids.

    Build one with :meth:`start` (a :class:`~uniagent.rollout.tokens.TokenRollout`)
    or :meth:`messages_only` (a :class:`~uniagent.rollout.messages.MessageRollout`);
    :meth:`from_dict` rebuilds either kind from its snapshot.
    """

    #: ``"tokens"`` (ids from a token server) or ``"messages"`` (chat API, text only).
    mode: ClassVar[Mode]
    _kinds: ClassVar[dict[str, type[Rollout]]] = {}

    def __init_subclass__(cls, mode: Mode | None = None, **kwargs: Any) -> None:
        """A subclass given ``mode=`` is the kind :meth:`from_dict` builds for that mode."""
        super().__init_subclass__(**kwargs)
        if mode is not None:
            cls.mode = mode
            Rollout._kinds[mode] = cls

    def __init__(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[ToolSchema] | None,
        chat_template_kwargs: Mapping[str, Any],
    ) -> None:
        """Low-level constructor; use :meth:`start` or :meth:`messages_only`."""
        self._tools: list[ToolSchema] | None = [dict(t) for t in tools] if tools else None
        self._kwargs: dict[str, Any] = dict(chat_template_kwargs)
        self._messages: list[Message] = [dict(m) for m in messages]
        self._num_prompt_messages = len(self._messages)
        self._num_turns = 0
        # "messages": the conversation ends with the environment's turn (after start or
        # append_messages); "generated": it ends with model output.
        self._last: Literal["messages", "generated"] = "messages"
        self.debug = False
        self.last_exactness_report: ExactnessReport | None = None

    # ----------------------------------------------------------------- construction

    @classmethod
    def start(
        cls,
        tokenizer: Any,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[ToolSchema] | None = None,
        *,
        debug: bool | None = None,
        **chat_template_kwargs: Any,
    ) -> Rollout:
        """A token rollout: the initial prompt rendered with the tokenizer's chat template.

        ``tools`` are OpenAI-style ``{"type": "function", "function": {...}}`` schemas;
        ``chat_template_kwargs`` (e.g. ``enable_thinking=False``) go to every render.
        ``debug`` (default: ``$UNIAGENT_CHECK_EXACTNESS``) re-checks exactness after
        every environment turn and logs a warning on drift.
        """
        kind = Rollout._kinds["tokens"]
        return kind.start(tokenizer, messages, tools, debug=debug, **chat_template_kwargs)

    @classmethod
    def messages_only(
        cls,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[ToolSchema] | None = None,
        **chat_template_kwargs: Any,
    ) -> Rollout:
        """A rollout for chat APIs that return no token ids: messages are recorded only."""
        kind = Rollout._kinds["messages"]
        return kind.messages_only(messages, tools, **chat_template_kwargs)

    # ----------------------------------------------------------------- the conversation

    @property
    def tools(self) -> list[ToolSchema] | None:
        """The tool schemas rendered into the prompt (a copy)."""
        return copy.deepcopy(self._tools)

    def tools_to_send(self) -> Sequence[ToolSchema] | None:
        """The tool schemas themselves, not a copy, for a request body that only serializes
        them (a copy per model turn cost more than the rest of building the request)."""
        return self._tools

    @property
    def chat_template_kwargs(self) -> dict[str, Any]:
        """Extra chat-template arguments used for every render."""
        return dict(self._kwargs)

    @property
    def messages(self) -> list[Message]:
        """The conversation so far as chat messages (assistant turns included)."""
        return list(self._messages)

    @property
    def num_turns(self) -> int:
        """Number of assistant turns recorded."""
        return self._num_turns

    @abstractmethod
    def append_messages(self, messages: Sequence[Mapping[str, Any]]) -> None:
        """Append environment messages (tool results, user turns)."""

    @abstractmethod
    def append_assistant_message(self, message: Mapping[str, Any]) -> None:
        """Record an assistant message returned by a chat API (message mode only)."""

    @abstractmethod
    def answer_text_call(
        self, content: str, name: str | None, call_id: str | None, wrap: Callable[[str], str]
    ) -> Message:
        """The message that answers a tool call the model wrote as text (not structured).

        ``wrap`` puts ``content`` in the call format's response markup, for a
        rollout whose messages cannot carry a ``role: tool`` answer to such a call.
        """

    def update_last_assistant_message(self, message: Mapping[str, Any]) -> None:
        """Replace the record of the last assistant turn (e.g. once its tool calls are parsed).

        Only the record changes, never the ids; :meth:`check_exactness` shows whether the
        new record still renders to what the model generated.
        """
        if not self._num_turns or self._messages[-1].get("role") != "assistant":
            raise RolloutError("there is no assistant turn at the end of the conversation")
        if message.get("role", "assistant") != "assistant":
            raise RolloutError(f"message must be an assistant message, got {message!r}")
        self._messages[-1] = {**message, "role": "assistant"}

    def _environment(self, messages: Sequence[Mapping[str, Any]]) -> list[Message]:
        """``messages`` copied, once each is checked to be the environment's."""
        new = [dict(m) for m in messages]
        for m in new:
            if m.get("role") not in _ENV_ROLES:
                raise RolloutError(
                    f"append_messages takes environment messages (roles {sorted(_ENV_ROLES)}), "
                    f"got role {m.get('role')!r}; model output goes through append_generation"
                )
        return new

    # ----------------------------------------------------------------- ids (token rollouts)

    def _no_ids(self, what: str) -> RolloutError:
        return RolloutError(
            f"{what} is not available: this rollout holds messages only (mode={self.mode!r}); "
            "call render_tokens(tokenizer) to render ids for the record"
        )

    @property
    def tokenizer(self) -> Any:
        """The tokenizer in use (``None`` in message mode or after ``from_dict`` without one)."""
        return None

    @property
    def template(self) -> TemplateAnalysis | None:
        """The chat-template analysis (end-of-turn token, boundary text) in use."""
        return None

    @property
    def prompt_ids(self) -> list[int]:
        """Ids of the initial prompt (the part of the context that is not response)."""
        raise self._no_ids("prompt_ids")

    @property
    def context_ids(self) -> list[int]:
        """Everything so far: the ids the model is given next (a copy)."""
        raise self._no_ids("context_ids")

    @property
    def context_length(self) -> int:
        """``len(context_ids)`` without copying."""
        raise self._no_ids("context_length")

    @property
    def response_ids(self) -> list[int]:
        """Ids after the prompt: model tokens and environment tokens interleaved."""
        raise self._no_ids("response_ids")

    @property
    def open_turn_ids(self) -> list[int]:
        """The ids generated so far of an assistant turn left open (cut before its end), else []."""
        raise self._no_ids("open_turn_ids")

    @property
    def response_mask(self) -> list[int]:
        """1 for tokens the model generated, 0 for template and environment tokens."""
        raise self._no_ids("response_mask")

    @property
    def response_logprobs(self) -> list[float]:
        """Log-prob per response token (0.0 where mask is 0 or the server gave none)."""
        raise self._no_ids("response_logprobs")

    @property
    def has_logprobs(self) -> bool:
        """True when every generation came with log-probs."""
        return True

    @property
    def turn_context_lengths(self) -> list[int]:
        """Length of the context given to the model at each model call."""
        return []

    def append_generation(
        self,
        token_ids: Iterable[int],
        logprobs: Iterable[float] | None = None,
        message: Mapping[str, Any] | None = None,
    ) -> None:
        """Append model output as returned by the server (mask 1); token rollouts only."""
        raise self._no_ids("append_generation")

    def check_exactness(self) -> ExactnessReport:
        """Compare the ids with a full re-render of ``messages``; token rollouts only."""
        raise self._no_ids("check_exactness")

    def truncated(
        self,
        prompt_length: int,
        response_length: int,
        *,
        prompt_truncation: PromptTruncation = "left",
    ) -> TruncatedRollout:
        """Cut to the trainer's lengths, keeping ids, mask and log-probs aligned; token only."""
        raise self._no_ids("truncated")

    def render_tokens(self, tokenizer: Any) -> Rollout:
        """A token-mode copy of this rollout, ids rendered from the messages (for the record).

        Assistant turns are tokenized the way the template renders them (mask 1, no
        log-probs: they were not sampled from these ids); the rest as in token mode.
        """
        cache = Rollout.start(
            tokenizer,
            self._messages[: self._num_prompt_messages],
            self._tools,
            debug=False,
            **self._kwargs,
        )
        analysis = cache.template
        assert analysis is not None
        pending: list[Message] = []
        for message in self._messages[self._num_prompt_messages :]:
            if message.get("role") != "assistant":
                pending.append(message)
                continue
            if pending:
                cache.append_messages(pending)
                pending = []
            text = assistant_text(tokenizer, analysis, message, chat_template_kwargs=self._kwargs)
            cache.append_generation(encode(tokenizer, text), message=message)
        if pending:
            cache.append_messages(pending)
        return cache

    def branch(self) -> Rollout:
        """An independent copy to continue another way (a tree rollout's branch): the same
        conversation, ids, mask and log-probs so far; what is appended to one is not in the
        other. The tokenizer and the template analysis are shared (they are read-only)."""
        twin = copy.copy(self)
        for name, value in vars(self).items():
            if isinstance(value, list | dict):
                setattr(twin, name, copy.deepcopy(value))
        return twin

    # ----------------------------------------------------------------- serialization

    @abstractmethod
    def to_dict(self) -> dict[str, Any]:
        """A JSON-serializable snapshot (the tokenizer is not included)."""

    def _snapshot(self, tokenizer: str | None, eot_id: int | None) -> dict[str, Any]:
        """The fields every kind's snapshot starts with (its ids follow)."""
        return {
            "format": FORMAT,
            "version": FORMAT_VERSION,
            "mode": self.mode,
            "tokenizer": tokenizer,
            "eot_id": eot_id,
            "tools": copy.deepcopy(self._tools),
            "chat_template_kwargs": copy.deepcopy(self._kwargs),
            "messages": copy.deepcopy(self._messages),
            "num_prompt_messages": self._num_prompt_messages,
            "num_turns": self._num_turns,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], tokenizer: Any = None) -> Rollout:
        """Rebuild a rollout from :meth:`to_dict`; pass ``tokenizer`` to keep appending."""
        if data.get("format") != FORMAT or data.get("version") != FORMAT_VERSION:
            raise RolloutError(
                f"not a {FORMAT} v{FORMAT_VERSION} snapshot: format={data.get('format')!r} "
                f"version={data.get('version')!r}"
            )
        mode = data.get("mode")
        if mode not in ("tokens", "messages"):
            raise RolloutError(f"snapshot has an unknown mode {mode!r}")
        return Rollout._kinds[mode]._from_snapshot(data, tokenizer)

    @classmethod
    @abstractmethod
    def _from_snapshot(cls, data: Mapping[str, Any], tokenizer: Any) -> Rollout:
        """This kind rebuilt from a checked snapshot of it."""

    def _restore(self, data: Mapping[str, Any]) -> None:
        """The conversation's counters and state from a snapshot."""
        self._num_prompt_messages = int(data["num_prompt_messages"])
        self._num_turns = int(data["num_turns"])
        self._last = data["state"]["last"]


def __getattr__(name: str) -> Any:
    """``RolloutCache``: the old name of :class:`Rollout` (deprecated in 0.3, gone in 0.4)."""
    if name == "RolloutCache":
        return deprecated_rollout_cache(__name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def deprecated_rollout_cache(module: str) -> type[Rollout]:
    """:class:`Rollout`, with the warning its old name gives."""
    import warnings

    warnings.warn(
        f"{module}.RolloutCache is deprecated since uniagent 0.3 and goes in 0.4: it is "
        "the episode's record, not a cache; use uniagent.rollout.Rollout",
        DeprecationWarning,
        stacklevel=3,
    )
    return Rollout
