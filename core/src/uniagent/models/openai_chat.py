"""Any OpenAI-compatible chat-completions endpoint (OpenAI, vLLM, SGLang, llama.cpp, ...).

Two modes, chosen by whether a ``tokenizer`` is given:

- **messages** (no tokenizer): the rollout records chat messages only; what
  the server returns is recorded as the assistant message.
- **tokens** (tokenizer given; vLLM): the cache is rendered locally with the same
  chat template, and every request asks for the generated token ids the vLLM way:
  ``return_token_ids`` (vLLM >= 0.10.2: ``choices[0].token_ids`` and
  ``prompt_token_ids``) and ``logprobs`` with ``return_tokens_as_token_ids``
  (tokens arrive as ``"token_id:123"``). The ids and log-probs are appended to
  the cache as returned. The server renders the prompt itself from the messages,
  so when it reports ``prompt_token_ids`` they are compared with the cache's
  context: a mismatch is logged and recorded (``ModelTurn.prompt_exact``), because
  then the trajectory is not token-exact (masked by default).

Structured ``tool_calls`` the server returns are handed to the loop as they
came (``ModelTurn.raw_tool_calls``); the loop validates them, or parses the
text when there are none. Messages go out the way strict chat APIs accept: a
tool message answers a call of the assistant message before it (the loop
answers text-parsed calls with user messages in message mode).

429, 5xx, 408/409 and connection errors are retried with exponential backoff (a
``Retry-After`` header in seconds is honoured, capped at ``max_backoff``), then
:class:`ModelError`; a context-length 400 becomes :class:`ContextLimitError`.

The API key is ``api_key``, else the environment variable named by ``api_key_env``,
else ``OPENAI_API_KEY``, else ``"EMPTY"`` (for servers without authentication).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast
from urllib.parse import urlsplit, urlunsplit

from uniagent.errors import ConfigError
from uniagent.models import http
from uniagent.models.base import (
    ContextLimitError,
    FinishReason,
    ModelError,
    ModelTurn,
    Usage,
)
from uniagent.parsers import ToolCallParser
from uniagent.rollout import Rollout

log = logging.getLogger(__name__)

_RETRY_STATUS = frozenset({408, 409, 429})
_CONTEXT_MARKERS = (
    "context_length_exceeded",
    "maximum context length",
    "context length",
    "too many tokens",
    "prompt is too long",
    "exceeds the available context size",  # llama.cpp's server
    "`max_new_tokens` must be <=",  # TGI (422): `inputs` tokens + `max_new_tokens` must be <= N
)
#: Statuses a context overflow comes back with (vLLM/OpenAI 400, TGI 422, some proxies 413).
_CONTEXT_STATUS = frozenset({400, 413, 422})
_SEND_KEYS = frozenset({"role", "content", "tool_calls", "tool_call_id", "name"})
#: OpenAI's chat-completions parameters (its SDK's ``create`` arguments): a sampling
#: parameter not among them (vLLM's ``top_k``, ``min_p``, ...) goes with the extra body.
_CHAT_PARAMS = frozenset(
    {
        "audio", "frequency_penalty", "function_call", "functions", "logit_bias", "logprobs",
        "max_completion_tokens", "max_tokens", "metadata", "modalities", "n",
        "parallel_tool_calls", "prediction", "presence_penalty", "prompt_cache_key",
        "reasoning_effort", "response_format", "safety_identifier", "seed", "service_tier",
        "stop", "store", "stream", "stream_options", "temperature", "tool_choice", "tools",
        "top_logprobs", "top_p", "user", "verbosity", "web_search_options",
    }
)  # fmt: skip


class OpenAIChatModel:
    """A chat-completions backend with retries; token-exact when the server is vLLM."""

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        *,
        api_key_env: str | None = None,
        sampling_params: Mapping[str, Any] | None = None,
        max_retries: int = 4,
        backoff: float = 1.0,
        max_backoff: float = 60.0,
        timeout: float = 600.0,
        tokenizer: Any = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        max_model_len: int | None = None,
        send_tools: bool = True,
        extra_body: Mapping[str, Any] | None = None,
        client: Any = None,
    ) -> None:
        self.base_url = base_url
        self.where = public_url(base_url)  # for messages and logs: no credentials
        self.model = model
        self.sampling_params = dict(sampling_params or {})
        self.max_retries = max_retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.tokenizer = tokenizer
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.max_model_len = max_model_len
        self.send_tools = send_tools
        self.extra_body = dict(extra_body or {})
        #: Tokens generated through this object (the server's usage; a pool's per-episode
        #: copy counts its own).
        self.generated_tokens = 0
        #: Awaited between retries (tests replace it to record the delays).
        self.sleep: Callable[[float], Any] = asyncio.sleep
        #: The HTTP client (shared by this model's copies); retries are ours.
        self.client: http.JSONClient = client or http.JSONClient(
            base_url, api_key or _key_from_env(api_key_env) or "EMPTY", timeout=timeout
        )

    @property
    def token_mode(self) -> bool:
        """True when the cache holds token ids (a tokenizer was given)."""
        return self.tokenizer is not None

    def renders_tools(self) -> bool:
        """Tools go to the server as schemas, unless ``send_tools`` is off."""
        return self.send_tools

    def start_cache(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> Rollout:
        """A token-mode cache with a tokenizer, else a message-mode one."""
        schemas = [dict(t) for t in tools or ()]
        if self.token_mode:
            return Rollout.start(self.tokenizer, messages, schemas, **self.chat_template_kwargs)
        return Rollout.messages_only(messages, schemas, **self.chat_template_kwargs)

    async def aclose(self) -> None:
        """Close the HTTP client."""
        await self.client.close()

    async def list_models(self) -> list[dict[str, Any]]:
        """The server's ``GET /models`` entries (raises the client's errors)."""
        return await self.client.models()

    # -- the call -----------------------------------------------------------------------
    async def generate(
        self,
        cache: Rollout,
        *,
        stop: Sequence[str] = (),
        call_format: ToolCallParser | None = None,
    ) -> ModelTurn:
        """Send the conversation, append the reply to ``cache`` and return it."""
        token_mode = cache.mode == "tokens"
        request = self._request(cache, stop, token_mode)
        data = await self._create(request)
        try:
            choice = data["choices"][0]
            message = choice.get("message") or {}
        except (KeyError, IndexError, TypeError) as exc:
            raise ModelError(f"malformed chat completion from {self.where}: {data!r:.500}") from exc
        content = message.get("content") or ""
        raw_calls = [_plain(c) for c in message.get("tool_calls") or ()] or None
        reasoning = message.get("reasoning_content") or message.get("reasoning")
        record: dict[str, Any] = {"role": "assistant", "content": content}
        if raw_calls:
            record["tool_calls"] = raw_calls
        if reasoning:
            record["reasoning_content"] = reasoning
        turn = ModelTurn(
            text=content,
            finish_reason=_finish_reason(choice.get("finish_reason"), raw_calls),
            raw_tool_calls=raw_calls,
            reasoning=reasoning,
            usage=_usage(data.get("usage")),
        )
        token_ids, logprobs = _generated_tokens(choice)
        self.generated_tokens += turn.usage.completion_tokens or len(token_ids or ())
        if token_mode:
            if not token_ids:
                raise ModelError(
                    f"{self.where} returned no token ids, but a tokenizer was given (token "
                    "mode); use vLLM (return_token_ids / return_tokens_as_token_ids) or drop "
                    "the tokenizer to record messages only"
                )
            prompt_ids = data.get("prompt_token_ids")
            if prompt_ids is not None:
                match = list(prompt_ids) == cache.context_ids
                turn.prompt_exact = match
                if not match:
                    log.warning(
                        "server-rendered prompt (%d ids) differs from the rollout context "
                        "(%d ids): this trajectory is not token-exact",
                        len(prompt_ids),
                        cache.context_length,
                    )
            cache.append_generation(token_ids, logprobs, message=record)
        else:
            cache.append_assistant_message(record)
        return turn

    def _request(self, cache: Rollout, stop: Sequence[str], tokens: bool) -> dict[str, Any]:
        keep = (_SEND_KEYS | {"reasoning_content"}) if tokens else _SEND_KEYS
        params = dict(self.sampling_params)
        extra = dict(self.extra_body)
        extra.update(params.pop("extra_body", None) or {})  # the config's sampling.extra_body
        for key in list(params):
            if key not in _CHAT_PARAMS:
                extra[key] = params.pop(key)  # e.g. top_k, min_p, repetition_penalty (vLLM)
        request: dict[str, Any] = {
            "model": self.model,
            "messages": [_outgoing(m, keep, tokens) for m in cache.messages],
            **params,
        }
        tools = cache.tools_to_send()
        if self.send_tools and tools:
            request["tools"] = tools
        if stop and "stop" not in request:
            request["stop"] = list(stop)
        if self.chat_template_kwargs:
            extra.setdefault("chat_template_kwargs", dict(self.chat_template_kwargs))
        if tokens:
            request["logprobs"] = True
            request.setdefault("top_logprobs", 0)
            extra.setdefault("return_tokens_as_token_ids", True)
            extra.setdefault("return_token_ids", True)
            if self.max_model_len is not None:
                room = self.max_model_len - cache.context_length
                if room <= 0:
                    raise ContextLimitError(
                        f"the context has {cache.context_length} tokens; "
                        f"max_model_len={self.max_model_len}"
                    )
                request["max_tokens"] = min(int(request.get("max_tokens") or room), room)
        if extra:
            request["extra_body"] = extra
        return request

    async def _create(
        self, request: dict[str, Any], path: str = "/chat/completions"
    ) -> dict[str, Any]:
        # The request is plain JSON already, posted as it is (the extra body flat in it, as
        # OpenAI's SDK sends its extra_body) and read back as plain JSON.
        body = {k: v for k, v in request.items() if k != "extra_body"}
        body.update(request.get("extra_body") or {})
        attempt = 0
        while True:
            try:
                raw = await self.client.post(path, body)
                try:
                    return cast(dict[str, Any], json.loads(raw))
                except ValueError:
                    text = f"{raw!r:.300}"
                    raise ModelError(f"{self.where} answered with no JSON: {text}") from None
            except http.APIStatusError as exc:
                # A prompt past the context is the policy's doing (token_limit), whatever
                # the server's status for it; anything else rejected is infrastructure.
                if exc.status_code in _CONTEXT_STATUS and _is_context_error(exc):
                    raise ContextLimitError(f"{self.where}: {_api_error_text(exc)}") from exc
                if isinstance(exc, http.BadRequestError):
                    problem = _api_error_text(exc)
                    raise ModelError(f"{self.where} rejected the request: {problem}") from exc
                attempt = await self._retry_or_raise(exc, attempt)
            except http.APIConnectionError as exc:
                attempt = await self._retry_or_raise(exc, attempt)

    async def _retry_or_raise(self, exc: Exception, attempt: int) -> int:
        """Wait before the next try of a retryable failure (the next attempt's number), or raise."""
        status = getattr(exc, "status_code", None)
        retryable = status is None or status in _RETRY_STATUS or status >= 500
        if not retryable or attempt >= self.max_retries:
            tries = f" after {attempt + 1} attempts" if retryable else ""
            raise ModelError(f"{self.where} failed{tries}: {_api_error_text(exc)}") from exc
        delay = self._delay(exc, attempt)
        log.warning(
            "%s: %s; retry %d/%d in %.1f s",
            self.where,
            _api_error_text(exc),
            attempt + 1,
            self.max_retries,
            delay,
        )
        await self.sleep(delay)
        return attempt + 1

    def _delay(self, exc: Exception, attempt: int) -> float:
        headers = getattr(exc, "headers", None) or {}
        header = next((v for k, v in headers.items() if k.lower() == "retry-after"), None)
        if header is not None:
            try:
                return min(max(float(header), 0.0), self.max_backoff)
            except ValueError:
                pass  # an HTTP date: not worth parsing, fall back to backoff
        return min(self.backoff * (2**attempt), self.max_backoff)


def public_url(url: str) -> str:
    """``url`` without credentials: its user, password, query and fragment dropped."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def _outgoing(message: Mapping[str, Any], keep: frozenset[str], tokens: bool) -> dict[str, Any]:
    """A message as sent: OpenAI's keys only (tool results lose ``name`` in message mode)."""
    out = {k: v for k, v in message.items() if k in keep}
    if not tokens and out.get("role") == "tool":
        out.pop("name", None)
    return out


def _key_from_env(name: str | None) -> str | None:
    """The key in variable ``name`` (which must be set), else in ``OPENAI_API_KEY``."""
    if name is None:
        return os.environ.get("OPENAI_API_KEY") or None
    value = os.environ.get(name)
    if not value:
        raise ConfigError(f"api_key_env: the environment variable {name} is not set")
    return value


def _plain(call: Any) -> dict[str, Any]:
    data = call.model_dump() if hasattr(call, "model_dump") else dict(call)
    function = dict(data.get("function") or {})
    out: dict[str, Any] = {"id": data.get("id"), "type": data.get("type") or "function"}
    out["function"] = {"name": function.get("name"), "arguments": function.get("arguments")}
    return out


def _finish_reason(value: Any, calls: Any) -> FinishReason:
    if value == "length":
        return "length"
    if value in ("tool_calls", "function_call") or (calls and value in (None, "stop")):
        return "tool_calls"
    return "stop"


def _usage(data: Any) -> Usage:
    if not isinstance(data, Mapping):
        return Usage()
    return Usage(
        prompt_tokens=int(data.get("prompt_tokens") or 0),
        completion_tokens=int(data.get("completion_tokens") or 0),
    )


def _generated_tokens(choice: Mapping[str, Any]) -> tuple[list[int] | None, list[float] | None]:
    """Token ids and log-probs from a vLLM-style choice (None when the server gave none)."""
    entries = ((choice.get("logprobs") or {}).get("content")) or []
    logprobs = [float(e.get("logprob", 0.0)) for e in entries] or None
    ids = choice.get("token_ids")
    if ids is None and entries:
        parsed = [_token_id(e.get("token")) for e in entries]
        ids = parsed if all(i is not None for i in parsed) else None
    if ids is None:
        return None, None
    ids = [int(i) for i in ids]
    if logprobs is not None and len(logprobs) != len(ids):
        log.warning("server gave %d log-probs for %d tokens; dropped", len(logprobs), len(ids))
        logprobs = None
    return ids, logprobs


def _token_id(token: Any) -> int | None:
    if isinstance(token, str) and token.startswith("token_id:"):
        try:
            return int(token[len("token_id:") :])
        except ValueError:
            return None
    return None


def _is_context_error(exc: Exception) -> bool:
    text = f"{getattr(exc, 'code', '')} {getattr(exc, 'message', '')} {exc}".lower()
    return any(marker in text for marker in _CONTEXT_MARKERS)


def _api_error_text(exc: Exception) -> str:
    status = getattr(exc, "status_code", None)
    body = getattr(exc, "body", None)
    message = body.get("message") if isinstance(body, Mapping) else None
    if not isinstance(message, str) or not message:
        message = getattr(exc, "message", None) or str(exc)
    return f"{type(exc).__name__}" + (f" {status}" if status else "") + f": {message}"
