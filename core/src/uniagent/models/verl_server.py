"""A token server as verl's agent loop sees it (``AsyncLLMServerManager.generate``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from uniagent.models.base import Generation, ModelError, TokenChatModel, new_request_id


class VerlServerModel(TokenChatModel):
    """Generates with verl's server manager: context ids in, token ids and log-probs out.

    ``server_manager`` only needs verl 0.9.1's ``async generate(request_id, *,
    prompt_ids, sampling_params, ...) -> TokenOutput`` (duck-typed; verl is not
    imported). One ``request_id`` per episode keeps the session sticky to one
    server (prefix caching); build one model per episode. ``sampling_params`` are
    verl's (``temperature``, ``top_p``, ``top_k``, ``logprobs``, ...); ``max_tokens``
    is set to what remains of the budgets on every call.
    """

    def __init__(
        self,
        server_manager: Any,
        tokenizer: Any,
        sampling_params: Mapping[str, Any] | None = None,
        request_id: str | None = None,
        *,
        max_model_len: int | None = None,
        response_length: int | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(
            tokenizer,
            sampling_params=sampling_params,
            max_model_len=max_model_len,
            response_length=response_length,
            chat_template_kwargs=chat_template_kwargs,
        )
        self.server_manager = server_manager
        self.request_id = request_id or new_request_id()

    async def _generate(self, prompt_ids: list[int], max_tokens: int | None) -> Generation:
        params = dict(self.sampling_params)
        if max_tokens is not None:
            params["max_tokens"] = max_tokens
        try:
            out = await self.server_manager.generate(
                self.request_id, prompt_ids=prompt_ids, sampling_params=params
            )
        except Exception as exc:
            raise ModelError(f"verl server generate failed: {type(exc).__name__}: {exc}") from exc
        stop_reason = getattr(out, "stop_reason", None)
        if stop_reason in ("aborted", "abort"):
            raise ModelError("verl server aborted the generation (stop_reason='aborted')")
        log_probs = getattr(out, "log_probs", None)
        extra: dict[str, Any] = {"stop_reason": stop_reason}
        if getattr(out, "num_preempted", None) is not None:
            extra["num_preempted"] = out.num_preempted
        if getattr(out, "routed_experts", None) is not None:
            extra["routed_experts"] = out.routed_experts
        extra.update(getattr(out, "extra_fields", None) or {})
        return Generation(
            token_ids=[int(t) for t in out.token_ids],
            logprobs=None if log_probs is None else [float(x) for x in log_probs],
            finish_reason="length" if stop_reason == "length" else None,
            extra=extra,
        )
