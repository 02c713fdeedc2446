"""Model specs (``--model``): checked as text by :func:`check_spec`, built by :func:`from_spec`.

One parser per kind serves both, so a spec that passes the check builds the same way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from uniagent.errors import ConfigError
from uniagent.models import hf
from uniagent.models.base import ChatModel
from uniagent.models.openai_chat import OpenAIChatModel
from uniagent.parsers import ToolCallParser

if TYPE_CHECKING:  # pragma: no cover - for type checkers only
    from _typeshed import SupportsKeysAndGetItem  # a mapping, or the config's SamplingConfig

SPEC_FORMS = (
    "hf:PATH (a model folder, hub id or .gguf file; hf:smollm2 for the bundled test model; add "
    "?guided=tool_call to make every turn a valid tool call), "
    "openai:BASE_URL#MODEL (e.g. openai:http://127.0.0.1:8000/v1#Qwen/Qwen3-8B; add "
    "?tokenizer=PATH to record token ids and log-probs from a vLLM server)"
)
OPENAI_OPTIONS = ("tokenizer",)


def _split(spec: str) -> tuple[str, str]:
    kind, sep, rest = spec.partition(":")
    if not sep or not rest:
        raise ConfigError(f"model spec {spec!r} is not of the form {SPEC_FORMS}")
    if kind not in ("hf", "openai"):
        raise ConfigError(f"unknown model kind {kind!r} in {spec!r}; use {SPEC_FORMS}")
    return kind, rest


def parse_openai_spec(spec: str, rest: str) -> tuple[str, str, dict[str, str]]:
    """``BASE_URL#MODEL[?tokenizer=PATH]`` as (base URL, model name, options); text only."""
    base_url, sep, model = rest.rpartition("#")
    model, _, query = model.partition("?")
    options = dict(part.partition("=")[::2] for part in query.split("&") if part)
    unknown = sorted(set(options) - set(OPENAI_OPTIONS))
    if unknown:
        raise ConfigError(
            f"model spec {spec!r}: unknown option {unknown[0]!r} "
            f"(known: {', '.join(OPENAI_OPTIONS)})"
        )
    if not sep or not base_url or not model:
        raise ConfigError(
            f"model spec {spec!r}: name the model after '#', as in "
            "openai:http://127.0.0.1:8000/v1#Qwen/Qwen3-8B"
        )
    if not base_url.startswith(("http://", "https://")):
        raise ConfigError(f"model spec {spec!r}: the base URL must start with http(s)://")
    return base_url, model, options


def check_spec(
    spec: str,
    parser: ToolCallParser | None,
    *,
    sampling: SupportsKeysAndGetItem[str, Any] | None = None,
) -> None:
    """Reject a model spec that cannot work, with one line, before anything is loaded.

    Checks the kind, every ``?KEY=VALUE`` option (unknown keys, ``guided=`` modes,
    the ``thought=`` range), that an ``hf:`` path exists, and that the options fit
    the tool-call ``parser`` and the config's ``sampling`` (guided decoding writes
    hermes calls, one sequence at a time). ``parser=None`` skips the parser check.
    """
    kind, rest = _split(spec)
    if kind == "openai":
        parse_openai_spec(spec, rest)
    else:
        hf.check_spec(rest, parser, sampling)


def from_spec(spec: str, **kwargs: Any) -> ChatModel:
    """Build a backend from ``hf:PATH`` or ``openai:BASE_URL#MODEL``; kwargs go to it."""
    kind, rest = _split(spec)
    if kind == "hf":
        return hf.HFLocalModel.from_spec(rest, **kwargs)
    base_url, model, options = parse_openai_spec(spec, rest)
    if options.get("tokenizer"):
        kwargs = {**kwargs, "tokenizer": _load_tokenizer(options["tokenizer"], spec)}
    return OpenAIChatModel(base_url, model, **kwargs)


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
