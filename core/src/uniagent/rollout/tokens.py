"""TokenRollout: the token-exact record of one multi-turn episode (``mode == "tokens"``)."""

from __future__ import annotations

import copy
import logging
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from uniagent.rollout.cache import (
    CHECK_ENV,
    PromptTooLongError,
    PromptTruncation,
    Rollout,
    RolloutError,
    TruncatedRollout,
    tool_message,
)
from uniagent.rollout.exactness import (
    ExactnessReport,
    classify_differences,
    ids_checksum,
    prefix_violations,
)
from uniagent.rollout.template import (
    Message,
    TemplateAnalysis,
    ToolSchema,
    analyse_chat_template,
    decode,
    encode,
    render_text,
    suffix_text,
)

logger = logging.getLogger(__name__)


class TokenRollout(Rollout, mode="tokens"):
    """Token-exact trajectory of one episode: prompt, model tokens, environment tokens.

    Built by :meth:`start` for a token server that returns ids and log-probs. The
    context is append-only: what the model was given at turn *t* is a prefix of the
    final ids.
    """

    def __init__(
        self,
        *,
        tokenizer: Any,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[ToolSchema] | None,
        chat_template_kwargs: Mapping[str, Any],
        debug: bool | None = None,
    ) -> None:
        """Low-level constructor; use :meth:`start`."""
        super().__init__(messages, tools, chat_template_kwargs)
        self._tokenizer = tokenizer
        self._analysis: TemplateAnalysis | None = None
        # Whole context (prompt + response) in one list; mask and log-probs cover the
        # response part only, so response index i is context index prompt_len + i.
        self._ids: list[int] = []
        self._prompt_len = 0
        self._mask: list[int] = []
        self._logprobs: list[float] = []
        self._has_logprobs = True
        # (context length, running CRC-32) when each model call was made: the prefix
        # invariant is checkable later without storing every context.
        self._marks: list[tuple[int, int]] = []
        # self._last == "messages": the context ends with a generation prompt.
        self._open_turn = False  # last generation did not end with the end-of-turn token
        self._segment_start = 0  # where the pending environment segment begins (ids)
        self._segment_msg_start = 0  # ... and in messages
        self._turn_start = 0  # where the current assistant turn's generated ids begin
        if debug is None:
            debug = os.environ.get(CHECK_ENV, "") not in ("", "0", "false", "False")
        self.debug = debug
        # Kept from a snapshot loaded without a tokenizer, so to_dict() round-trips.
        self._record: dict[str, Any] = {"tokenizer": None, "eot_id": None}

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
    ) -> TokenRollout:
        """Render the initial prompt (tools + generation prompt) with the tokenizer's template.

        ``tools`` are OpenAI-style ``{"type": "function", "function": {...}}`` schemas;
        ``chat_template_kwargs`` (e.g. ``enable_thinking=False``) go to every render.
        ``debug`` (default: ``$UNIAGENT_CHECK_EXACTNESS``) re-checks exactness after
        every environment turn and logs a warning on drift.
        """
        if not messages:
            raise RolloutError("start() needs at least one message (the task prompt)")
        cache = cls(
            tokenizer=tokenizer,
            messages=messages,
            tools=tools,
            chat_template_kwargs=chat_template_kwargs,
            debug=debug,
        )
        cache._analysis = analyse_chat_template(tokenizer, **chat_template_kwargs)
        cache._render_prompt(cache._messages)
        return cache

    # ----------------------------------------------------------------- properties

    @property
    def tokenizer(self) -> Any:
        """The tokenizer in use (``None`` after ``from_dict`` without one)."""
        return self._tokenizer

    @property
    def prompt_ids(self) -> list[int]:
        """Ids of the initial prompt (the part of the context that is not response)."""
        return self._ids[: self._prompt_len]

    @property
    def context_ids(self) -> list[int]:
        """Everything so far: the ids the model is given next (a copy)."""
        return list(self._ids)

    @property
    def context_length(self) -> int:
        """``len(context_ids)`` without copying."""
        return len(self._ids)

    @property
    def response_ids(self) -> list[int]:
        """Ids after the prompt: model tokens and environment tokens interleaved."""
        return self._ids[self._prompt_len :]

    @property
    def open_turn_ids(self) -> list[int]:
        """The ids generated so far of an assistant turn left open (cut before its end), else [].

        A following :meth:`append_generation` continues that turn; a backend that
        constrains decoding resumes its state from exactly these ids.
        """
        if self._last != "generated" or not self._open_turn:
            return []
        return self._ids[self._turn_start :]

    @property
    def response_mask(self) -> list[int]:
        """1 for tokens the model generated, 0 for template and environment tokens."""
        return list(self._mask)

    @property
    def response_logprobs(self) -> list[float]:
        """Log-prob per response token (0.0 where mask is 0 or the server gave none)."""
        return list(self._logprobs)

    @property
    def has_logprobs(self) -> bool:
        """True when every generation came with log-probs."""
        return self._has_logprobs

    @property
    def turn_context_lengths(self) -> list[int]:
        """Length of the context given to the model at each model call."""
        return [length for length, _ in self._marks]

    @property
    def template(self) -> TemplateAnalysis | None:
        """The chat-template analysis (end-of-turn token, boundary text) in use."""
        return self._analysis

    def _need_tokenizer(self, what: str) -> tuple[Any, TemplateAnalysis]:
        if self._tokenizer is None or self._analysis is None:
            raise RolloutError(
                f"{what} needs a tokenizer: this rollout was loaded with from_dict() without "
                "one; pass tokenizer= to from_dict()"
            )
        return self._tokenizer, self._analysis

    # ----------------------------------------------------------------- appending

    def append_generation(
        self,
        token_ids: Iterable[int],
        logprobs: Iterable[float] | None = None,
        message: Mapping[str, Any] | None = None,
    ) -> None:
        """Append model output as returned by the server (mask 1); it is never re-tokenized.

        The output may or may not end with the end-of-turn token (a length or stop-string
        cut does not). If it does not, the turn stays open: a following
        :meth:`append_generation` continues it, and :meth:`append_messages` first adds the
        end-of-turn token with mask 0 (the model did not produce it) so that the context
        stays what the template would render. ``message`` is the assistant message for
        the record (content + parsed ``tool_calls``); without it the ids are decoded.
        """
        tokenizer, analysis = self._need_tokenizer("append_generation")
        if self._last == "generated" and not self._open_turn:
            raise RolloutError(
                "the previous generation ended with the end-of-turn token; append the "
                "environment's messages (append_messages) before the next generation"
            )
        if message is not None and message.get("role", "assistant") != "assistant":
            raise RolloutError(f"message must be an assistant message, got {message!r}")
        ids = [int(t) for t in token_ids]
        if logprobs is None:
            lps = [0.0] * len(ids)
            if ids:
                self._has_logprobs = False
        else:
            lps = [float(x) for x in logprobs]
            if len(lps) != len(ids):
                raise RolloutError(
                    f"got {len(lps)} log-probs for {len(ids)} generated tokens; they must align"
                )
        # Record what the model was given, cheaply: its length and a running checksum.
        prev_len, prev_crc = self._marks[-1] if self._marks else (0, 0)
        here = len(self._ids)
        self._marks.append((here, ids_checksum(self._ids, prev_len, here, prev_crc)))

        continuing = self._last == "generated"
        if not continuing:
            self._turn_start = here
        self._ids.extend(ids)
        self._mask.extend([1] * len(ids))
        self._logprobs.extend(lps)
        self._open_turn = not ids or ids[-1] != analysis.eot_id
        self._last = "generated"

        if message is not None:
            record = {**message, "role": "assistant"}
        else:
            turn = self._ids[self._turn_start :]
            if turn and turn[-1] == analysis.eot_id:
                turn = turn[:-1]
            record = {"role": "assistant", "content": decode(tokenizer, turn)}
        if continuing:
            self._messages[-1] = record
        else:
            self._messages.append(record)
            self._num_turns += 1

    def append_assistant_message(self, message: Mapping[str, Any]) -> None:
        """Refused: a token rollout records assistant turns as ids (append_generation)."""
        raise RolloutError(
            "append_assistant_message is for message-mode rollouts; in token mode use "
            "append_generation(token_ids, logprobs, message)"
        )

    def append_messages(self, messages: Sequence[Mapping[str, Any]]) -> None:
        """Append environment messages (tool results, user turns): mask 0, log-prob 0.0.

        Tokenized incrementally: only the new messages are rendered, against a fixed
        dummy prefix, so the cost is proportional to them, never to the history. The ids
        end with the next generation prompt. Consecutive calls with no generation in
        between are merged into one render (the template may group them, e.g. Qwen puts
        consecutive tool results into one user turn).
        """
        new = self._environment(messages)
        if not new:
            return
        tokenizer, analysis = self._need_tokenizer("append_messages")
        # Render first, change state after: a template error leaves the cache as it was.
        if self._last == "messages" and not self._marks:
            # No model call yet: the new messages extend the initial prompt.
            self._render_prompt([*self._messages, *new])
            self._messages.extend(new)
            self._num_prompt_messages = len(self._messages)
            return
        merging = self._last == "messages"
        # The model stopped without the end-of-turn token (length or stop string); the
        # template closes every turn with it, so add it: mask 0, the model did not emit it.
        close_turn = not merging and self._open_turn
        if merging:
            segment_start, segment_msg_start = self._segment_start, self._segment_msg_start
        else:
            segment_start = len(self._ids) + (1 if close_turn else 0)
            segment_msg_start = len(self._messages)
        pending = [*self._messages[segment_msg_start:], *new]
        text = suffix_text(
            tokenizer, analysis, pending, tools=self._tools, chat_template_kwargs=self._kwargs
        )
        new_ids = encode(tokenizer, text)
        if merging:
            # Merge with the pending segment: drop its ids, the render above covers it.
            del self._ids[segment_start:]
            cut = segment_start - self._prompt_len
            del self._mask[cut:]
            del self._logprobs[cut:]
        elif close_turn:
            self._push_env([analysis.eot_id])
            self._open_turn = False
        self._segment_start, self._segment_msg_start = segment_start, segment_msg_start
        self._messages.extend(new)
        self._push_env(new_ids)
        self._last = "messages"
        if self.debug:
            self._debug_check()

    def _push_env(self, ids: list[int]) -> None:
        self._ids.extend(ids)
        self._mask.extend([0] * len(ids))
        self._logprobs.extend([0.0] * len(ids))

    def _render_prompt(self, messages: list[Message]) -> None:
        tokenizer, _ = self._need_tokenizer("start")
        text = render_text(
            tokenizer,
            messages,
            tools=self._tools,
            add_generation_prompt=True,
            chat_template_kwargs=self._kwargs,
        )
        self._ids = encode(tokenizer, text)
        self._prompt_len = len(self._ids)

    def _debug_check(self) -> None:
        report = self.check_exactness()
        self.last_exactness_report = report
        if not report.ok:
            logger.warning("rollout drifted from the chat template:\n%s", report.summary())

    def answer_text_call(
        self, content: str, name: str | None, call_id: str | None, wrap: Callable[[str], str]
    ) -> Message:
        """A ``role: tool`` message: the chat template renders it whatever the call's form."""
        return tool_message(content, name, call_id)

    # ----------------------------------------------------------------- checks

    def check_exactness(self) -> ExactnessReport:
        """Check the prefix invariant and compare the ids with a full re-render of ``messages``.

        Costs a full render and tokenization: meant for tests and debugging, not per turn.
        """
        tokenizer, analysis = self._need_tokenizer("check_exactness")
        ending_prompt = self._last == "messages"
        text = render_text(
            tokenizer,
            self._messages,
            tools=self._tools,
            add_generation_prompt=ending_prompt,
            chat_template_kwargs=self._kwargs,
        )
        if not ending_prompt:
            # The cache stops where the model stopped; the template also renders the
            # end-of-turn token (if the model did not emit it) and the closing tail.
            tail = (analysis.eot_text if self._open_turn else "") + analysis.final_tail_text
            if tail and text.endswith(tail):
                text = text[: len(text) - len(tail)]
        render_ids = encode(tokenizer, text)
        ids_match = render_ids == self._ids
        # Compare decoded texts on both sides: the tokenizer may normalize (e.g. NFC), so
        # the raw template text is not what its ids decode to.
        text_match = ids_match or decode(tokenizer, self._ids) == decode(tokenizer, render_ids)
        differences = (
            ()
            if ids_match
            else classify_differences(
                self._ids, render_ids, lambda ids: decode(tokenizer, ids), analysis.eot_id
            )
        )
        bad = prefix_violations(self._ids, self._marks)
        return ExactnessReport(
            num_model_calls=len(self._marks),
            turn_context_lengths=tuple(length for length, _ in self._marks),
            prefix_ok=not bad,
            prefix_violations=bad,
            ids_match=ids_match,
            text_match=text_match,
            cache_length=len(self._ids),
            render_length=len(render_ids),
            differences=differences,
        )

    # ----------------------------------------------------------------- truncation

    def truncated(
        self,
        prompt_length: int,
        response_length: int,
        *,
        prompt_truncation: PromptTruncation = "left",
    ) -> TruncatedRollout:
        """Cut to the trainer's lengths, keeping ids, mask and log-probs aligned.

        The response keeps its head (the tail is cut). An over-long prompt keeps its
        most recent ``prompt_length`` ids (``"left"``, what verl 0.9.1's agent loop does
        for text prompts) or raises :class:`PromptTooLongError` (``"error"``).
        """
        if prompt_length < 0 or response_length < 0:
            raise ValueError("prompt_length and response_length must be >= 0")
        prompt = self._ids[: self._prompt_len]
        prompt_cut = len(prompt) > prompt_length
        if prompt_cut:
            if prompt_truncation == "error":
                raise PromptTooLongError(
                    f"the prompt has {len(prompt)} tokens, more than prompt_length="
                    f"{prompt_length}; raise prompt_length or shorten the task prompt"
                )
            if prompt_truncation != "left":
                raise ValueError(
                    f"prompt_truncation must be 'left' or 'error', not {prompt_truncation!r}"
                )
            prompt = prompt[len(prompt) - prompt_length :]
        response = self._ids[self._prompt_len :]
        response_cut = len(response) > response_length
        return TruncatedRollout(
            prompt_ids=prompt,
            response_ids=response[:response_length],
            response_mask=self._mask[:response_length],
            response_logprobs=self._logprobs[:response_length] if self._has_logprobs else None,
            prompt_truncated=prompt_cut,
            response_truncated=response_cut,
        )

    # ----------------------------------------------------------------- serialization

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serializable snapshot (the tokenizer is not included)."""
        return {
            **self._snapshot(
                (
                    str(getattr(self._tokenizer, "name_or_path", "")) or None
                    if self._tokenizer is not None
                    else self._record["tokenizer"]
                ),
                self._analysis.eot_id if self._analysis else self._record["eot_id"],
            ),
            "prompt_ids": self._ids[: self._prompt_len],
            "response_ids": self._ids[self._prompt_len :],
            "response_mask": list(self._mask),
            "response_logprobs": list(self._logprobs),
            "has_logprobs": self._has_logprobs,
            "turn_marks": [[length, crc] for length, crc in self._marks],
            "state": {
                "last": self._last,
                "open_turn": self._open_turn,
                "segment_start": self._segment_start,
                "segment_msg_start": self._segment_msg_start,
                "turn_start": self._turn_start,
            },
        }

    @classmethod
    def _from_snapshot(cls, data: Mapping[str, Any], tokenizer: Any) -> TokenRollout:
        cache = cls(
            tokenizer=tokenizer,
            messages=copy.deepcopy(data["messages"]),
            tools=copy.deepcopy(data["tools"]),
            chat_template_kwargs=copy.deepcopy(data["chat_template_kwargs"]),
            debug=False,
        )
        if tokenizer is not None:
            analysis = analyse_chat_template(tokenizer, **cache._kwargs)
            if analysis.eot_id != data["eot_id"]:
                raise RolloutError(
                    f"this rollout was built with end-of-turn id {data['eot_id']}, but the given "
                    f"tokenizer's template ends turns with {analysis.eot_id}: wrong tokenizer"
                )
            cache._analysis = analysis
        cache._record = {"tokenizer": data.get("tokenizer"), "eot_id": data.get("eot_id")}
        prompt = [int(i) for i in data["prompt_ids"]]
        response = [int(i) for i in data["response_ids"]]
        mask = [int(i) for i in data["response_mask"]]
        logprobs = [float(x) for x in data["response_logprobs"]]
        if not len(response) == len(mask) == len(logprobs):
            raise RolloutError(
                f"misaligned snapshot: {len(response)} response ids, {len(mask)} mask entries, "
                f"{len(logprobs)} log-probs"
            )
        cache._ids = prompt + response
        cache._prompt_len = len(prompt)
        cache._mask = mask
        cache._logprobs = logprobs
        cache._has_logprobs = bool(data["has_logprobs"])
        cache._marks = [(int(length), int(crc)) for length, crc in data["turn_marks"]]
        cache._restore(data)
        state = data["state"]
        cache._open_turn = bool(state["open_turn"])
        cache._segment_start = int(state["segment_start"])
        cache._segment_msg_start = int(state["segment_msg_start"])
        cache._turn_start = int(state["turn_start"])
        return cache

    def __repr__(self) -> str:
        return (
            f"Rollout(mode='tokens', prompt={self._prompt_len}, "
            f"response={len(self._ids) - self._prompt_len}, turns={self._num_turns})"
        )
