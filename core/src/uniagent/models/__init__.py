"""Chat-model backends: a verl token server, OpenAI-compatible chat APIs, local HF models.

Every backend implements :class:`ChatModel`: it builds the episode's rollout
cache and appends each model turn to it itself, so the interaction loop never
touches token ids. :func:`from_spec` builds one from a ``--model`` string.
"""

from __future__ import annotations

from typing import Any

from uniagent.errors import ConfigError
from uniagent.models.base import (
    ChatModel,
    ContextLimitError,
    FinishReason,
    Generation,
    ModelError,
    ModelTurn,
    TokenChatModel,
    Usage,
)
from uniagent.models.hf import HFLocalModel, smollm2_gguf_path
from uniagent.models.openai_chat import OpenAIChatModel
from uniagent.models.verl_server import VerlServerModel

SPEC_FORMS = (
    "hf:PATH (a model folder, hub id or .gguf file; hf:smollm2 for the bundled test model; add "
    "?guided=tool_call to make every turn a valid tool call), "
    "openai:BASE_URL#MODEL (e.g. openai:http://127.0.0.1:8000/v1#Qwen/Qwen3-8B; add "
    "?tokenizer=PATH to record token ids and log-probs from a vLLM server)"
)


def from_spec(spec: str, **kwargs: Any) -> ChatModel:
    """Build a backend from ``hf:PATH`` or ``openai:BASE_URL#MODEL``; kwargs go to it."""
    kind, sep, rest = spec.partition(":")
    if not sep or not rest:
        raise ConfigError(f"model spec {spec!r} is not of the form {SPEC_FORMS}")
    if kind == "openai":
        base_url, sep, model = rest.rpartition("#")
        model, _, query = model.partition("?")
        options = dict(part.partition("=")[::2] for part in query.split("&") if part)
        unknown = sorted(set(options) - {"tokenizer"})
        if unknown:
            raise ConfigError(
                f"model spec {spec!r}: unknown option {unknown[0]!r} (known: tokenizer)"
            )
        if options.get("tokenizer"):
            kwargs = {**kwargs, "tokenizer": _load_tokenizer(options["tokenizer"], spec)}
        if not sep or not base_url or not model:
            raise ConfigError(
                f"model spec {spec!r}: name the model after '#', as in "
                "openai:http://127.0.0.1:8000/v1#Qwen/Qwen3-8B"
            )
        if not base_url.startswith(("http://", "https://")):
            raise ConfigError(f"model spec {spec!r}: the base URL must start with http(s)://")
        return OpenAIChatModel(base_url, model, **kwargs)
    if kind == "hf":
        return HFLocalModel.from_spec(rest, **kwargs)
    raise ConfigError(f"unknown model kind {kind!r} in {spec!r}; use {SPEC_FORMS}")


def _load_tokenizer(name: str, spec: str) -> Any:
    """The tokenizer (and chat template) the server's model uses: a folder or a hub id."""
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise ConfigError(
            f"model spec {spec!r}: a tokenizer needs transformers: "
            "pip install 'uniagent[tokenizers]'"
        ) from None
    try:
        return AutoTokenizer.from_pretrained(name)
    except Exception as exc:
        raise ConfigError(f"model spec {spec!r}: cannot load tokenizer {name!r}: {exc}") from None


__all__ = [
    "ChatModel",
    "ContextLimitError",
    "FinishReason",
    "Generation",
    "HFLocalModel",
    "ModelError",
    "ModelTurn",
    "OpenAIChatModel",
    "TokenChatModel",
    "Usage",
    "VerlServerModel",
    "from_spec",
    "smollm2_gguf_path",
]
