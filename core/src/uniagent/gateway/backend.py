"""Token backends: prompt ids in, generated ids and log-probs out.

The gateway talks to a model only through :class:`TokenBackend`. :class:`TokenModelBackend`
wraps the token models ``uniagent run`` builds (``hf:`` in process, verl's server); the
``openai:`` backend sends chat messages, not ids, so it does not fit (see docs/gateway.md).
:class:`ScriptedBackend` replays scripted texts as token ids for tests and benches.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from uniagent.models.base import (
    ContextLimitError,
    Generation,
    ModelError,
    TokenChatModel,
    cut_at_stop,
)
from uniagent.rollout.template import analyse_chat_template, decode

__all__ = ["Generation", "ScriptedBackend", "TokenBackend", "TokenModelBackend"]


@runtime_checkable
class TokenBackend(Protocol):
    """Anything that continues prompt ids: the gateway's only view of a model."""

    #: The tokenizer whose chat template renders requests (``apply_chat_template``).
    tokenizer: Any

    async def generate(
        self, prompt_ids: list[int], *, max_tokens: int | None, stop: Sequence[str] = ()
    ) -> Generation:
        """Generated ids (end-of-turn included when produced) and one log-prob per id."""
        ...


class TokenModelBackend:
    """A :class:`~uniagent.models.base.TokenChatModel` (``hf:``, verl's server) as a backend.

    Made on a running event loop (an episode's), it calls the model on that loop even when
    the gateway serves from another thread's: a model's client (verl's server manager in a
    worker) may hold state bound to the loop it was made on. That loop must then not be
    blocked while the gateway serves the session (a harness runs as an async subprocess).
    """

    def __init__(self, model: TokenChatModel) -> None:
        if not isinstance(model, TokenChatModel):
            raise TypeError(
                f"{type(model).__name__} is not a token model (it does not continue prompt "
                "ids); the gateway needs hf: or verl's server, not a chat API"
            )
        self.model = model
        self.tokenizer = model.tokenizer
        self._ends: set[int] | None = None
        try:
            self.loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self.loop = None

    async def generate(
        self, prompt_ids: list[int], *, max_tokens: int | None, stop: Sequence[str] = ()
    ) -> Generation:
        """Call the model's ``_generate`` (on the loop this backend was made on, if that is
        another one and still running) and cut at ``stop`` (ids kept as generated)."""
        per_turn = self.model.sampling_params.get("max_tokens")
        limits = [x for x in (max_tokens, per_turn) if x is not None]
        context = self.model.max_model_len
        if context is not None:  # the harness's history outgrew the model: the policy's end
            if len(prompt_ids) >= context:
                raise ContextLimitError(
                    f"the prompt is {len(prompt_ids)} tokens: no room to generate in the "
                    f"model's context of {context} (max_model_len)"
                )
            limits.append(context - len(prompt_ids))
        limit = min(limits) if limits else None
        call = self.model._generate(list(prompt_ids), limit)
        home = self.loop
        if home is not None and home is not asyncio.get_running_loop() and home.is_running():
            out = await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(call, home))
        else:
            out = await call
        # Left to be inferred (as TokenChatModel.generate does): the limit cut the reply
        # unless its last token ends the turn.
        if (
            out.finish_reason is None
            and limit is not None
            and len(out.token_ids) >= limit
            and out.token_ids[-1] not in self._turn_ends()
        ):
            out = dataclasses.replace(out, finish_reason="length")
        return cut_at_stop(self.tokenizer, out, stop) if stop else out

    def _turn_ends(self) -> set[int]:
        """Ids that end a turn: the model's stop ids and the chat template's end of turn."""
        if self._ends is None:
            analysis = analyse_chat_template(self.tokenizer, **self.model.chat_template_kwargs)
            self._ends = {*self.model._stop_ids(), analysis.eot_id}
        return self._ends


#: A script step: the reply text, an exception to raise, or a function of the decoded prompt.
Step = str | BaseException | Callable[[str], "str | BaseException"]


@dataclass
class BackendCall:
    """One recorded call of :class:`ScriptedBackend`."""

    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]


class ScriptedBackend:
    """Replays scripted replies as token ids ending with the end-of-turn token.

    Each reply is tokenized once, here, as a model server would produce it; log-probs
    are deterministic (:meth:`logprob`) so tests can check where every id went.
    ``default`` answers once the script is spent (``None``: a :class:`ModelError`).
    """

    def __init__(
        self,
        tokenizer: Any,
        script: Iterable[Step] = (),
        *,
        default: Step | None = None,
        end_of_turn: str = "<|im_end|>",
    ) -> None:
        self.tokenizer = tokenizer
        self.script: deque[Step] = deque(script)
        self.default = default
        self.eot_id = int(tokenizer.convert_tokens_to_ids(end_of_turn))
        self.calls: list[BackendCall] = []
        self._generated = 0

    @staticmethod
    def logprob(position: int) -> float:
        """The log-prob of the ``position``-th token this backend generated (never 0.0)."""
        return -0.001 * (1 + position)

    def reply_ids(self, text: str) -> list[int]:
        """The ids a reply text is generated as (text ids, then the end-of-turn token)."""
        return [*self.tokenizer.encode(text, add_special_tokens=False), self.eot_id]

    async def generate(
        self, prompt_ids: list[int], *, max_tokens: int | None, stop: Sequence[str] = ()
    ) -> Generation:
        """The next scripted reply as ids and log-probs."""
        step: Step | None = self.script.popleft() if self.script else self.default
        if step is None:
            raise ModelError("the scripted backend has no more replies")
        if callable(step) and not isinstance(step, BaseException):
            step = step(decode(self.tokenizer, prompt_ids))
        if isinstance(step, BaseException):
            raise step
        ids = self.reply_ids(step)
        finish = None
        if max_tokens is not None and len(ids) > max_tokens:
            ids, finish = ids[:max_tokens], "length"
        logprobs = [self.logprob(self._generated + i) for i in range(len(ids))]
        self._generated += len(ids)
        self.calls.append(BackendCall(list(prompt_ids), ids, logprobs))
        out = Generation(ids, logprobs, finish)  # type: ignore[arg-type]
        return cut_at_stop(self.tokenizer, out, stop) if stop else out
