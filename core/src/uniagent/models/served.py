"""A served model as a token backend: prompt ids in, generated ids and log-probs out.

``openai:BASE_URL#MODEL?tokenizer=PATH`` in front of the gateway (harness agents,
``uniagent gateway --model``) is this model. Every turn is one ``POST /completions`` with
the prompt as token ids (the completions API takes a list of ids as ``prompt``), asking
for the generated ids the vLLM way (``return_token_ids``, vLLM >= 0.10.2; else
``logprobs`` with ``return_tokens_as_token_ids``, tokens as ``"token_id:N"``) and one
log-prob per id. Nothing is re-tokenized: the ids the server generated are the ids
recorded, and the prompt the model saw is the ids the gateway sent.

What the server says back about the ids is checked against ours and recorded in the
generation's ``extra["server"]`` (the gateway keeps it on the turn): the prompt ids it
reports when they differ from the ids sent (the server did not take them as given), and
its text of the reply when it differs from our tokenizer's decoding of the same ids (the
server's tokenizer is not ``?tokenizer=``'s: replies would be parsed with the wrong
vocabulary). Retries, the API key and context-overflow errors are
:class:`~uniagent.models.openai_chat.OpenAIChatModel`'s.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from uniagent.models.base import ContextLimitError, Generation, ModelError, TokenChatModel
from uniagent.models.openai_chat import OpenAIChatModel

log = logging.getLogger(__name__)

#: Sampling keys the completions request takes as they are (the rest are dropped or passed
#: as vLLM's extra sampling parameters, below).
_COMPLETIONS_KEYS = frozenset(
    {"temperature", "top_p", "seed", "presence_penalty", "frequency_penalty", "n"}
)
#: Keys of ``sampling`` that make no sense per request here (the gateway sets the budget;
#: the stop strings are cut by the gateway from the generated ids).
_NOT_SENT = frozenset({"max_tokens", "stop", "logprobs", "top_logprobs", "extra_body"})


class ServedTokenModel(TokenChatModel):
    """An OpenAI-compatible server's ``/completions`` continuing prompt ids (vLLM)."""

    def __init__(
        self,
        base_url: str,
        model: str,
        tokenizer: Any,
        *,
        api_key: str | None = None,
        api_key_env: str | None = None,
        sampling_params: Mapping[str, Any] | None = None,
        max_model_len: int | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        max_retries: int = 4,
        timeout: float = 600.0,
        client: Any = None,
    ) -> None:
        super().__init__(
            tokenizer,
            sampling_params=sampling_params,
            max_model_len=max_model_len,
            chat_template_kwargs=chat_template_kwargs,
        )
        #: The HTTP client, its retries and errors (and ``uniagent run``'s preflight).
        self.chat = OpenAIChatModel(
            base_url,
            model,
            api_key,
            api_key_env=api_key_env,
            max_retries=max_retries,
            timeout=timeout,
            tokenizer=tokenizer,
            client=client,
        )
        self.model, self.where = model, self.chat.where
        #: Tokens generated through this object (a pool's per-episode copy counts its own).
        self.generated_tokens = 0
        #: Shared with this model's copies (a pool's episodes): the server's context length.
        self._shared: dict[str, Any] = {"asked": False, "warned": False, "length": None}

    async def aclose(self) -> None:
        """Close the HTTP client."""
        await self.chat.aclose()

    def request(self, prompt_ids: list[int], max_tokens: int | None) -> dict[str, Any]:
        """The ``/completions`` body for one turn."""
        params = dict(self.sampling_params)
        extra = dict(params.pop("extra_body", None) or {})
        body: dict[str, Any] = {"model": self.model, "prompt": list(prompt_ids)}
        for key, value in params.items():
            if key in _COMPLETIONS_KEYS:
                body[key] = value
            elif key not in _NOT_SENT:
                extra[key] = value  # vLLM's sampling extras: top_k, min_p, repetition_penalty
        if max_tokens is not None:
            body["max_tokens"] = int(max_tokens)
        body.update(extra)
        # One log-prob per generated id, the ids themselves, and the end-of-turn token
        # kept in the ids (vLLM keeps the stop token id; the text drops special tokens).
        body.update(logprobs=1, return_token_ids=True, return_tokens_as_token_ids=True)
        return body

    async def context_length(self) -> int | None:
        """The server's context length for this model (``max_model_len`` unless given:
        vLLM lists it with its models), asked once for this model and its copies (a pool's
        episodes share the answer); None when the server does not say."""
        if self.max_model_len is None:
            shared = self._shared
            if not shared["asked"]:
                shared["asked"] = True
                try:
                    listed = await self.chat.list_models()
                except Exception as exc:  # the turn itself reports a server that is down
                    log.debug("%s: no model list: %s", self.where, exc)
                    shared["asked"] = False  # asked again next turn
                    return None
                for entry in listed:
                    if entry.get("id") == self.model and entry.get("max_model_len"):
                        shared["length"] = int(entry["max_model_len"])
            self.max_model_len = shared.get("length")
        return self.max_model_len

    async def _generate(self, prompt_ids: list[int], max_tokens: int | None) -> Generation:
        # Every request fits the server's context: a harness's max_tokens (Claude Code asks
        # for 32,000) is cut to the room left, and a prompt with no room left is the
        # policy's (token_limit) here, never a 400 from the server counted as its failure.
        context = await self.context_length()
        if context is not None:
            room = context - len(prompt_ids)
            if room <= 0:
                raise ContextLimitError(
                    f"the prompt is {len(prompt_ids)} tokens: no room to generate in the "
                    f"server's context of {context} ({self.where})"
                )
            max_tokens = room if max_tokens is None else min(max_tokens, room)
        elif max_tokens is None and not self._shared["warned"]:
            self._shared["warned"] = True
            log.warning(
                "%s does not list its context length: turns without max_tokens get the "
                "server's default (16 tokens for the completions API); set sampling.max_tokens",
                self.where,
            )
        data = await self.chat._create(self.request(prompt_ids, max_tokens), "/completions")
        try:
            choice = data["choices"][0]
        except (KeyError, IndexError, TypeError):
            raise ModelError(f"malformed completion from {self.where}: {data!r:.500}") from None
        ids, logprobs = completion_tokens(choice)
        if ids is None:
            raise ModelError(
                f"{self.where} returned no token ids for a token prompt; a harness's model "
                "must be a server that returns them (vLLM >= 0.10.2: return_token_ids, or "
                "logprobs with return_tokens_as_token_ids)"
            )
        self.generated_tokens += len(ids)
        finish = "length" if choice.get("finish_reason") == "length" else None
        out = Generation(ids, logprobs, finish)  # type: ignore[arg-type]
        server = self._compare(choice, data, prompt_ids, ids)
        if server:
            out.extra["server"] = server
        return out

    def _compare(
        self,
        choice: Mapping[str, Any],
        data: Mapping[str, Any],
        prompt_ids: list[int],
        ids: list[int],
    ) -> dict[str, Any]:
        """What the server reports that disagrees with our ids or our tokenizer."""
        found: dict[str, Any] = {}
        echoed = choice.get("prompt_token_ids", data.get("prompt_token_ids"))
        if echoed is not None and [int(i) for i in echoed] != prompt_ids:
            at = next(
                (i for i, (a, b) in enumerate(zip(echoed, prompt_ids, strict=False)) if a != b),
                min(len(echoed), len(prompt_ids)),
            )
            found["prompt_ids_differ"] = {
                "first_difference": at,
                "sent": len(prompt_ids),
                "server": len(echoed),
            }
        text = choice.get("text")
        if isinstance(text, str):
            ours = self.tokenizer.decode(ids, skip_special_tokens=True)
            if text.strip() != ours.strip():
                found["text_differs"] = {"server": text[:200], "ours": ours[:200]}
        return found


def completion_tokens(choice: Mapping[str, Any]) -> tuple[list[int] | None, list[float] | None]:
    """Generated ids and log-probs of a vLLM-style ``/completions`` choice (None, None when
    the server gave no ids); log-probs are None when their count differs from the ids'."""
    lp_data = choice.get("logprobs") or {}
    tokens = lp_data.get("tokens") or []
    raw = lp_data.get("token_logprobs")
    ids: list[int] | None = None
    if choice.get("token_ids") is not None:
        ids = [int(i) for i in choice["token_ids"]]
    elif tokens and all(isinstance(t, str) and t.startswith("token_id:") for t in tokens):
        try:
            ids = [int(t[len("token_id:") :]) for t in tokens]
        except ValueError:
            ids = None
    if ids is None:
        return None, None
    if raw is not None and any(x is None for x in raw):
        raise ModelError("the server returned no log-prob for a generated token")
    logprobs = [float(x) for x in raw] if raw is not None else None
    if logprobs is not None and len(logprobs) != len(ids):
        raise ModelError(
            f"the server returned {len(logprobs)} log-probs for {len(ids)} generated ids"
        )
    return ids, logprobs
