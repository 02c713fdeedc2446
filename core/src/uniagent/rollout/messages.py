"""MessageRollout: the record of an episode with a chat API that returns text, not ids."""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from uniagent.rollout.cache import Rollout, RolloutError
from uniagent.rollout.template import Message, ToolSchema


class MessageRollout(Rollout, mode="messages"):
    """The conversation of one episode as chat messages, without ids (``mode == "messages"``).

    Built by :meth:`messages_only`; :meth:`render_tokens` renders ids for the record.
    Asking it for ids raises :class:`RolloutError`.
    """

    @classmethod
    def messages_only(
        cls,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[ToolSchema] | None = None,
        **chat_template_kwargs: Any,
    ) -> MessageRollout:
        """A rollout for chat APIs that return no token ids: messages are recorded only."""
        return cls(messages, tools, chat_template_kwargs)

    def append_assistant_message(self, message: Mapping[str, Any]) -> None:
        """Record an assistant message returned by a chat API."""
        if message.get("role", "assistant") != "assistant":
            raise RolloutError(f"message must be an assistant message, got {message!r}")
        self._messages.append({**message, "role": "assistant"})
        self._num_turns += 1
        self._last = "generated"

    def append_messages(self, messages: Sequence[Mapping[str, Any]]) -> None:
        """Append environment messages (tool results, user turns) to the conversation."""
        new = self._environment(messages)
        if not new:
            return
        self._messages.extend(new)
        self._last = "messages"

    def answer_text_call(
        self, content: str, name: str | None, call_id: str | None, wrap: Callable[[str], str]
    ) -> Message:
        """A user message in the call format's markup.

        A strict chat API accepts a ``role: tool`` message only as the answer of a
        structured call; a call the model wrote as text is answered as the user.
        """
        return {"role": "user", "content": wrap(content)}

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serializable snapshot (its id fields empty)."""
        return {**self._snapshot(None, None), **_no_ids(self._last)}

    @classmethod
    def _from_snapshot(cls, data: Mapping[str, Any], tokenizer: Any) -> MessageRollout:
        cache = cls(
            copy.deepcopy(data["messages"]),
            copy.deepcopy(data["tools"]),
            copy.deepcopy(data["chat_template_kwargs"]),
        )
        cache._restore(data)
        expected = {"tokenizer": None, "eot_id": None, **_no_ids(cache._last)}
        for key, value in expected.items():
            if data.get(key) != value:
                raise RolloutError(
                    f"a messages-mode snapshot holds no ids, but its {key!r} is "
                    f"{data.get(key)!r} (expected {value!r})"
                )
        return cache

    def __repr__(self) -> str:
        return f"Rollout(mode='messages', messages={len(self._messages)})"


def _no_ids(last: str) -> dict[str, Any]:
    """The id fields of a messages-mode snapshot (what a token rollout fills in)."""
    return {
        "prompt_ids": [],
        "response_ids": [],
        "response_mask": [],
        "response_logprobs": [],
        "has_logprobs": True,
        "turn_marks": [],
        "state": {
            "last": last,
            "open_turn": False,
            "segment_start": 0,
            "segment_msg_start": 0,
            "turn_start": 0,
        },
    }
