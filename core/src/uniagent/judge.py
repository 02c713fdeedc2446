"""Asking an LLM judge: an OpenAI-compatible chat endpoint, retried on infrastructure
errors, its verdicts cached in-process by request (:func:`ask_judge`). The ``llm_judge``
reward (:mod:`uniagent.builtin.judge`) and the judges of plugins ask through it.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import urllib.error
import urllib.request
from collections import OrderedDict

from pydantic import BaseModel, ConfigDict, Field, field_validator

from uniagent.reward import RewardInfraError

_CACHE_SIZE = 4096


class JudgeError(RewardInfraError):
    """The judge could not be asked (no key, unreachable, an HTTP error): infrastructure."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        #: The HTTP status the judge answered with, when it answered.
        self.status = status


class JudgeEndpoint(BaseModel):
    """Where the judge is and how its verdict reads (shared by the judges of plugins)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    base_url: str = Field(description="OpenAI-compatible API base, e.g. http://localhost:8000/v1")
    model: str = Field(description="the judge model's name at that endpoint")
    api_key_env: str | None = Field(
        "OPENAI_API_KEY", description="variable of the run's environment holding the key"
    )
    correct_pattern: str = Field(
        r"^\W*(correct|yes)\b",
        description="regex (case-insensitive) that a correct verdict's reply matches",
    )
    max_tokens: int = Field(16, ge=1, description="tokens the judge may reply with")
    timeout: float = Field(60.0, gt=0, description="seconds for each of the judge's replies")
    retries: int = Field(2, ge=0, description="retries on infrastructure errors only")
    retry_delay: float = Field(
        1.0, ge=0, description="seconds before the first retry (doubled each time, at most 30)"
    )
    cache: bool = Field(True, description="reuse the verdict of an identical request")

    @field_validator("correct_pattern")
    @classmethod
    def _compiles(cls, value: str) -> str:
        re.compile(value)
        return value

    def correct(self, reply: str) -> bool:
        """Whether ``reply`` is a correct verdict."""
        return re.search(self.correct_pattern, reply.strip(), re.IGNORECASE) is not None


_cache: OrderedDict[str, str] = OrderedDict()


def _post(settings: JudgeEndpoint, body: bytes, headers: dict[str, str]) -> str:
    url = settings.base_url.rstrip("/") + "/chat/completions"
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=settings.timeout) as response:
            text: str = response.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode("utf-8", "replace")[:300]
        raise JudgeError(f"the judge answered HTTP {exc.code}: {detail}", exc.code) from None
    except (urllib.error.URLError, OSError) as exc:
        failure = f"{type(exc).__name__}: {exc}"
        raise JudgeError(f"the judge at {url} is unreachable: {failure}") from None
    try:
        return str(json.loads(text)["choices"][0]["message"]["content"] or "")
    except (ValueError, KeyError, IndexError, TypeError):
        raise JudgeError(f"the judge's answer is not a chat completion: {text[:300]}") from None


async def ask_judge(settings: JudgeEndpoint, prompt: str) -> tuple[str, int, bool]:
    """The judge's reply, the attempts it took and whether it came from the cache."""
    headers = {"Content-Type": "application/json"}
    key = os.environ.get(settings.api_key_env) if settings.api_key_env else None
    if settings.api_key_env and not key:
        raise JudgeError(f"the judge needs its API key in ${settings.api_key_env}")
    if key:
        headers["Authorization"] = f"Bearer {key}"
    body = {
        "model": settings.model,
        "messages": [{"role": "user", "content": prompt}],
        "temperature": 0.0,
        "max_tokens": settings.max_tokens,
    }
    cache_key = json.dumps([settings.base_url, body], sort_keys=True)
    if settings.cache and cache_key in _cache:
        _cache.move_to_end(cache_key)
        return _cache[cache_key], 0, True
    data = json.dumps(body).encode()
    for attempt in range(1, settings.retries + 2):
        try:
            reply = await asyncio.to_thread(_post, settings, data, headers)
        except JudgeError:
            if attempt > settings.retries:
                raise
            await asyncio.sleep(min(settings.retry_delay * 2.0 ** (attempt - 1), 30.0))
            continue
        if settings.cache:
            _cache[cache_key] = reply
            while len(_cache) > _CACHE_SIZE:
                _cache.popitem(last=False)
        return reply, attempt, False
    raise AssertionError("unreachable")  # pragma: no cover
