"""Model specs (``--model``): checked as text by :func:`check_spec`, built by :func:`from_spec`.

One parser per kind serves both, so a spec that passes the check builds the same way.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from uniagent.errors import ConfigError
from uniagent.models import hf
from uniagent.models.base import ChatModel
from uniagent.models.openai_chat import OpenAIChatModel
from uniagent.parsers import ToolCallParser

if TYPE_CHECKING:  # pragma: no cover - for type checkers only
    from _typeshed import SupportsKeysAndGetItem  # a mapping, or the config's SamplingConfig

    from uniagent.models.pool import ModelPool

SPEC_FORMS = (
    "hf:PATH (a model folder, hub id or .gguf file; hf:smollm2 for the bundled test model; add "
    "?guided=tool_call to make every turn a valid tool call), "
    "openai:BASE_URL#MODEL (e.g. openai:http://127.0.0.1:8000/v1#Qwen/Qwen3-8B; add "
    "?tokenizer=PATH to record token ids and log-probs from a vLLM server; a harness agent "
    "sends it token ids)"
)
OPENAI_OPTIONS = ("tokenizer",)
#: Why a guided ``hf:`` model cannot sit behind the gateway (a harness's model).
GUIDED_REASON = (
    "the gateway hands a harness's requests to the model as they come and cannot apply guided "
    "decoding (?guided=tool_call constrains the turns of uniagent's own loop), so every "
    "request would fail; drop ?guided=... from the model spec"
)


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


def is_guided(spec: str) -> bool:
    """Whether ``spec`` asks for guided decoding (``hf:...?guided=...``); text only."""
    kind, rest = _split(spec)
    return kind == "hf" and "guided" in hf.parse_spec(rest)[1]


def from_spec(spec: str, *, token_backend: bool = False, **kwargs: Any) -> ChatModel:
    """Build a backend from ``hf:PATH`` or ``openai:BASE_URL#MODEL``; kwargs go to it.

    ``token_backend``: the model is to continue prompt ids (behind the gateway, for a
    harness agent): an ``openai:`` server is then a
    :class:`~uniagent.models.served.ServedTokenModel` (its ``/completions`` with token
    ids; ``?tokenizer=``, by default the model's name, renders the prompts).
    """
    kind, rest = _split(spec)
    if kind == "hf":
        return hf.HFLocalModel.from_spec(rest, **kwargs)
    base_url, model, options = parse_openai_spec(spec, rest)
    if token_backend:
        from uniagent.models.served import ServedTokenModel

        tokenizer = _load_tokenizer(options.get("tokenizer") or model, spec)
        return ServedTokenModel(base_url, model, tokenizer, **kwargs)
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
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        raise ConfigError(
            f"model spec {spec!r}: cannot load tokenizer {name!r} ({type(exc).__name__}: "
            f"{first}); name the model's tokenizer folder or hub id with ?tokenizer=PATH"
        ) from None


def read_model_specs(values: Sequence[str]) -> list[str]:
    """``--model`` values as specs: each a spec, or ``@FILE`` with one spec a line (blank
    lines and comments skipped: a line starting with ``#``, or `` #`` to the line's end)."""
    specs: list[str] = []
    for value in [values] if isinstance(values, str) else values:
        if not value.startswith("@"):
            specs.append(value)
            continue
        try:
            text = Path(value[1:]).read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"--model {value}: cannot read it: {exc}") from None
        # A comment is a line starting with #, or # after a blank (a spec has #MODEL).
        lines = [re.sub(r"\s#.*", "", line).strip() for line in text.splitlines()]
        found = [line for line in lines if line and not line.startswith("#")]
        if not found:
            raise ConfigError(f"--model {value}: the file names no model")
        specs += found
    if len(specs) > 1:
        kinds = {spec.partition(":")[0] for spec in specs}
        if kinds != {"openai"}:
            raise ConfigError(
                "several --model servers must all be openai: endpoints of one model "
                f"(got {', '.join(sorted(kinds))}); an hf: model runs in this process"
            )
        if len(set(specs)) != len(specs):
            raise ConfigError("--model names the same server twice")
    return specs


def pool_from_specs(
    specs: Sequence[str], *, token_backend: bool = False, **kwargs: Any
) -> ModelPool:
    """A :class:`~uniagent.models.pool.ModelPool` of ``openai:`` servers of one model: one
    tokenizer for all (``?tokenizer=`` must name the same one, or none), kwargs to each."""
    from uniagent.models.pool import ModelPool
    from uniagent.models.served import ServedTokenModel

    parsed = [parse_openai_spec(spec, _split(spec)[1]) for spec in specs]
    names = {options.get("tokenizer") or (model if token_backend else None)
             for _, model, options in parsed}  # fmt: skip
    if len(names) != 1:
        raise ConfigError(
            "the --model servers of one run serve one model: their ?tokenizer= differ "
            f"({', '.join(sorted(str(n) for n in names))})"
        )
    name = names.pop()
    tokenizer = _load_tokenizer(name, specs[0]) if name else None
    # One retry on the same server: past it the pool takes the server out and the run
    # retries the episode on another (the client's four retries would wait 15 s on a
    # server that is gone).
    kwargs.setdefault("max_retries", 1)
    models: list[Any] = []
    for base_url, model, _ in parsed:
        if token_backend:
            models.append(ServedTokenModel(base_url, model, tokenizer, **kwargs))
        else:
            models.append(OpenAIChatModel(base_url, model, tokenizer=tokenizer, **kwargs))
    return ModelPool(models)
