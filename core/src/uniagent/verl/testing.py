"""A scripted token server: a stand-in for verl's LLM server in tests and dry runs.

It duck-types ``generate(request_id, *, prompt_ids, sampling_params, ...)`` of verl's
server client and returns verl's ``TokenOutput``. The reply depends on the conversation:
the first script whose marker occurs in the decoded prompt is used, and the number of
assistant turns already in the prompt picks the reply (the last one repeats). Replies are
text, tokenized without special tokens, followed by the end-of-turn token; they are cut
to ``sampling_params["max_tokens"]`` like a real server. Log-probs are deterministic
(:meth:`ScriptedTokenServer.logprob`), so tests can check their alignment.

Everything it holds is picklable (a tokenizer path, not a tokenizer), so it also works
as the ``llm_client`` of verl's Ray ``AgentLoopManager``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass
class Call:
    """One recorded ``generate`` call."""

    request_id: str
    prompt_ids: list[int]
    token_ids: list[int]
    log_probs: list[float]
    sampling_params: dict[str, Any]


class ScriptedTokenServer:
    """Replies chosen by a marker in the prompt and the turn number; calls are recorded.

    ``scripts`` maps a marker (any text of the prompt, e.g. a phrase of the task) to the
    replies of turns 0, 1, ...; ``default`` is used when no marker matches. (Not a
    dataclass on purpose: ``hydra.utils.instantiate`` would turn one into a config.)
    """

    def __init__(
        self,
        tokenizer_path: str,
        scripts: Mapping[str, Sequence[str]],
        default: Sequence[str] = ("I have nothing to add.",),
        *,
        assistant_marker: str = "<|im_start|>assistant",
        end_token: str = "<|im_end|>",
        global_steps: int | None = None,
    ) -> None:
        self.tokenizer_path = str(tokenizer_path)
        self.scripts = {k: list(v) for k, v in scripts.items()}
        self.default = list(default)
        self.assistant_marker = assistant_marker
        self.end_token = end_token
        #: The weight version reported with each output, as verl's server client does
        #: (``extra_fields`` ``global_steps``/``min_global_steps``/``max_global_steps``).
        self.global_steps = global_steps
        self.calls: list[Call] = []
        self._tokenizer: Any = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_tokenizer"] = None
        state["calls"] = []
        return state

    @property
    def tokenizer(self) -> Any:
        """The tokenizer, loaded on first use (in whichever process the server runs)."""
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self.tokenizer_path)
        return self._tokenizer

    @staticmethod
    def logprob(turn: int, position: int) -> float:
        """The log-prob reported for token ``position`` of the reply of ``turn``."""
        return -round(0.001 * (1000 * (turn + 1) + position + 1), 6)

    def reply(self, prompt_text: str) -> tuple[int, str]:
        """The turn number and the reply text for a decoded prompt."""
        turn = max(0, prompt_text.count(self.assistant_marker) - 1)
        replies = next(
            (r for marker, r in self.scripts.items() if marker in prompt_text), self.default
        )
        return turn, replies[min(turn, len(replies) - 1)]

    async def generate(
        self,
        request_id: str,
        *,
        prompt_ids: Sequence[int],
        sampling_params: Mapping[str, Any],
        **kwargs: Any,
    ) -> Any:
        """verl's ``generate``: token ids and log-probs of the scripted reply."""
        from verl.workers.rollout.replica import TokenOutput

        await asyncio.sleep(0)  # let other episodes run, as a real server would
        tokenizer = self.tokenizer
        prompt = [int(t) for t in prompt_ids]
        turn, text = self.reply(tokenizer.decode(prompt, skip_special_tokens=False))
        ids = tokenizer.encode(text, add_special_tokens=False)
        ids.append(int(tokenizer.convert_tokens_to_ids(self.end_token)))
        stop = "completed"
        limit = sampling_params.get("max_tokens")
        if limit is not None and len(ids) > int(limit):
            ids, stop = ids[: int(limit)], "length"
        log_probs = [self.logprob(turn, j) for j in range(len(ids))]
        self.calls.append(Call(request_id, prompt, ids, log_probs, dict(sampling_params)))
        want = sampling_params.get("logprobs", True)
        extra: dict[str, Any] = {}
        if self.global_steps is not None:
            extra = dict.fromkeys(
                ("global_steps", "min_global_steps", "max_global_steps"), self.global_steps
            )
        return TokenOutput(
            token_ids=ids,
            log_probs=log_probs if want else None,
            stop_reason=stop,
            num_preempted=0,
            extra_fields=extra,
        )
