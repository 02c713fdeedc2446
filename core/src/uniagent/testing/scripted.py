"""A scripted token model: the test double for a model server.

It replays assistant texts (or asks a policy function for the next one) and
returns them as token ids with deterministic log-probs, through the same
:class:`~uniagent.models.base.TokenChatModel` path as the real verl and HF
backends — so the rollout sees exactly what a real server would send.
"""

from __future__ import annotations

import contextvars
import json
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from uniagent.models.base import Generation, ModelError, TokenChatModel
from uniagent.rollout import Rollout

#: A script item: assistant text, an exception to raise, or a policy called with the cache.
Step = str | BaseException | Callable[[Rollout], "str | BaseException"]


def hermes_call(name: str, arguments: Mapping[str, Any] | None = None, thought: str = "") -> str:
    """Assistant text with one hermes-format tool call, as a Qwen model writes it."""
    call = json.dumps({"name": name, "arguments": dict(arguments or {})}, ensure_ascii=False)
    prefix = f"{thought}\n" if thought else ""
    return f"{prefix}<tool_call>\n{call}\n</tool_call>"


def logprob_for(position: int) -> float:
    """The deterministic log-prob of the ``position``-th generated token (never 0.0)."""
    return -0.01 * (1 + position % 97)


class ScriptedTokenModel(TokenChatModel):
    """Replays ``script`` as token ids ending with the end-of-turn token.

    When the script runs out, ``policy`` (if given) answers every further turn.
    ``calls`` records the context length each generation was asked to continue.
    """

    def __init__(
        self,
        tokenizer: Any,
        script: Iterable[Step] = (),
        *,
        policy: Callable[[Rollout], str | BaseException] | None = None,
        end_of_turn: str = "<|im_end|>",
        **kwargs: Any,
    ) -> None:
        super().__init__(tokenizer, **kwargs)
        self.script: deque[Step] = deque(script)
        self.policy = policy
        self.eot_id = tokenizer.convert_tokens_to_ids(end_of_turn)
        self.calls: list[int] = []
        # Per asyncio task, so one model can serve concurrent episodes.
        self._cache: contextvars.ContextVar[Rollout] = contextvars.ContextVar("cache")
        self._generated = 0

    async def generate(self, cache: Rollout, **kwargs: Any) -> Any:
        """Remember the cache being continued (for policies), then generate."""
        self._cache.set(cache)
        return await super().generate(cache, **kwargs)

    async def _generate(self, prompt_ids: list[int], max_tokens: int | None) -> Generation:
        self.calls.append(len(prompt_ids))
        step: Step
        if self.script:
            step = self.script.popleft()
        elif self.policy is not None:
            step = self.policy
        else:
            raise ModelError("the scripted model has no more turns")
        if callable(step) and not isinstance(step, BaseException):
            step = step(self._cache.get())
        if isinstance(step, BaseException):
            raise step
        ids = self.tokenizer.encode(step, add_special_tokens=False) + [self.eot_id]
        if max_tokens is not None:
            ids = ids[:max_tokens]
        logprobs = [logprob_for(self._generated + i) for i in range(len(ids))]
        self._generated += len(ids)
        return Generation(token_ids=ids, logprobs=logprobs)
