"""Guided decoding for in-process models: every turn is a valid tool call (``llguidance``).

With ``guided="tool_call"`` (model spec ``hf:PATH?guided=tool_call``) the tokens a
local model may sample are restricted, step by step, to those that keep the turn
inside this grammar (``hermes`` parser)::

    [thought "\\n"] "<tool_call>\\n" {"name": NAME, "arguments": ARGS} "\\n</tool_call>" EOT

``NAME`` is one of the episode's tools and ``ARGS`` matches that tool's
``parameters_schema()`` (the JSON is written as ``json.dumps`` writes it: ``", "``
and ``": "`` separators, properties in schema order, no newlines). The optional
thought is free text of at most ``thought_chars`` characters without ``<`` (so it
can neither open a tag nor spell one), at least one character, then a newline.
One call per turn. The parser still parses and validates the text as usual.

Token exactness: the masks only select among the model's own tokens, the ids
generated are the ids recorded, nothing is re-tokenized. Tags that are single
added tokens of the tokenizer (Qwen's ``<tool_call>``) must be that token.

Log-probs: the sampled distribution is the model's, restricted to the allowed
tokens and renormalised over them; that is what is recorded (before temperature
and top-p/top-k, as for unguided generation). A token the grammar forces (the
only one allowed) gets 0.0. The loop hands the format to the backend
(``generate(cache, call_format=parser)``); the tools are the cache's
(``cache.tools``, the OpenAI schemas rendered into the prompt).

Why ``llguidance``: measured by ``bench/guided.py`` against ``xgrammar``,
``outlines``, ``lm-format-enforcer`` and ``transformers-cfg`` (see there).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from uniagent.errors import ConfigError
from uniagent.models.base import ModelError
from uniagent.parsers import HermesParser, ToolCallParser

GUIDED_MODES = ("tool_call",)
DEFAULT_THOUGHT_CHARS = 200
_JSON_STYLE = {"item_separator": ", ", "key_separator": ": ", "whitespace_flexible": False}


@dataclass(frozen=True)
class GuidedDecoding:
    """What a guided model must write: ``mode`` and the longest thought before the call."""

    mode: str = "tool_call"
    thought_chars: int = DEFAULT_THOUGHT_CHARS

    def __post_init__(self) -> None:
        if self.mode not in GUIDED_MODES:
            raise ConfigError(
                f"guided: unknown mode {self.mode!r}; available: {', '.join(GUIDED_MODES)}"
            )
        if not isinstance(self.thought_chars, int) or self.thought_chars < 0:
            raise ConfigError(
                f"guided thought: expected a number of characters >= 0, got {self.thought_chars!r}"
            )

    @classmethod
    def coerce(
        cls, value: GuidedDecoding | str | Mapping[str, Any] | None
    ) -> GuidedDecoding | None:
        """``None``, a mode name, a mapping of the fields, or an instance."""
        if value is None or isinstance(value, GuidedDecoding):
            return value
        if isinstance(value, str):
            return cls(mode=value)
        if isinstance(value, Mapping):
            unknown = sorted(set(value) - {"mode", "thought_chars"})
            if unknown:
                raise ConfigError(
                    f"guided: unknown key {unknown[0]!r}; allowed: mode, thought_chars"
                )
            return cls(**dict(value))
        raise ConfigError(f"guided: expected a mode name or a mapping, got {value!r}")


def tool_call_grammar(
    tools: Sequence[Mapping[str, Any]],
    parser: ToolCallParser,
    *,
    thought_chars: int = DEFAULT_THOUGHT_CHARS,
    special_tokens: Mapping[str, int] | None = None,
) -> str:
    """The Lark grammar (llguidance dialect) of one valid tool-call turn for ``parser``.

    ``tools`` are OpenAI schemas (``{"type": "function", "function": {...}}``, as
    ``ToolSpec.openai_schema()`` writes them); ``special_tokens`` maps tag texts
    that are single added tokens to their ids.
    """
    if not isinstance(parser, HermesParser):
        raise ConfigError(
            f"guided decoding supports the hermes tool parser, not {parser.name!r}; "
            "use tool_parser: hermes or drop guided= from the model spec"
        )
    if not tools:
        raise ConfigError("guided decoding needs at least one tool to call")
    special = dict(special_tokens or {})

    def literal(text: str) -> str:
        # A tag that is one added token is matched as that token, never spelled in text.
        return f"<[{special[text]}]>" if text in special else json.dumps(text)

    calls = []
    for i, tool in enumerate(tools):
        function = tool.get("function") or {}
        if not isinstance(function.get("name"), str):
            raise ConfigError(f"guided decoding: tool {i} has no function name: {tool!r}")
        arguments = function.get("parameters") or {"type": "object", "properties": {}}
        schema = {
            "type": "object",
            "properties": {"name": {"const": function["name"]}, "arguments": arguments},
            "required": ["name", "arguments"],
            "additionalProperties": False,
            "x-guidance": _JSON_STYLE,
        }
        calls.append(f"call_{i}: %json {json.dumps(schema, ensure_ascii=False)}")
    lines = [
        f"start: {'thought? ' if thought_chars else ''}"
        f'{literal(parser.open_tag)} "\\n" call "\\n" {literal(parser.close_tag)}',
        "call: " + " | ".join(f"call_{i}" for i in range(len(tools))),
        *calls,
    ]
    if thought_chars:
        lines.append(f'thought: /[^<]{{1,{thought_chars}}}/ "\\n"')
    return "\n".join(lines) + "\n"


class ToolCallGuide:
    """Compiles tool-call grammars for one tokenizer and hands out per-turn matchers."""

    def __init__(self, tokenizer: Any, stop_token_ids: Sequence[int], settings: GuidedDecoding):
        self.tokenizer = tokenizer
        self.stop_token_ids = list(stop_token_ids)
        self.settings = settings
        self._lock = threading.Lock()
        self._ll_tokenizer: Any = None
        self._grammars: dict[tuple[Any, ...], str] = {}

    def _llguidance(self) -> Any:
        try:
            import llguidance
            import llguidance.hf
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise ModelError(
                "guided decoding needs llguidance: pip install 'uniagent[hf]'"
            ) from exc
        with self._lock:
            if self._ll_tokenizer is None:
                # About a second for a 50k vocabulary: once per model.
                self._ll_tokenizer = llguidance.hf.from_tokenizer(
                    self.tokenizer, eos_token=self.stop_token_ids
                )
        return llguidance

    def grammar(self, tools: Sequence[Mapping[str, Any]], parser: ToolCallParser) -> str:
        """The grammar for these tool schemas and parser (built once per distinct set)."""
        key = (parser.name, getattr(parser, "open_tag", None), json.dumps(list(tools)))
        with self._lock:
            grammar = self._grammars.get(key)
        if grammar is None:
            grammar = tool_call_grammar(
                tools,
                parser,
                thought_chars=self.settings.thought_chars,
                special_tokens=self._special_tags(parser),
            )
            with self._lock:
                self._grammars[key] = grammar
        return grammar

    def matcher(
        self,
        tools: Sequence[Mapping[str, Any]],
        parser: ToolCallParser,
        prefix: Sequence[int] = (),
    ) -> GuidedTurn:
        """A fresh matcher for one turn; ``prefix`` holds ids of the turn already generated."""
        llguidance = self._llguidance()
        grammar = self.grammar(tools, parser)
        matcher = llguidance.LLMatcher(
            self._ll_tokenizer, llguidance.LLMatcher.grammar_from_lark(grammar)
        )
        if matcher.is_error():
            raise ModelError(
                f"guided decoding: the tool-call grammar failed: {matcher.get_error()}"
            )
        turn = GuidedTurn(matcher, self._ll_tokenizer.vocab_size)
        if prefix and not matcher.consume_tokens(list(prefix)):
            raise ModelError(
                "guided decoding cannot continue this turn: what was generated so far is not "
                f"a valid start of a tool call ({matcher.get_error()})"
            )
        return turn

    def _special_tags(self, parser: ToolCallParser) -> dict[str, int]:
        vocab = self.tokenizer.get_vocab()
        added = set(getattr(self.tokenizer, "get_added_vocab", dict)())
        tags = (getattr(parser, "open_tag", ""), getattr(parser, "close_tag", ""))
        return {tag: vocab[tag] for tag in tags if tag and tag in added and tag in vocab}


class GuidedTurn:
    """One turn's grammar state: the allowed-token mask per step, advanced by each token."""

    def __init__(self, matcher: Any, vocab_size: int) -> None:
        self.matcher = matcher
        self.vocab_size = vocab_size
        #: The allowed tokens at each step (numpy bool arrays), for the log-probs afterwards.
        self.masks: list[Any] = []

    def allowed(self) -> Any:
        """A numpy bool array over the vocabulary: the tokens the grammar allows next."""
        import numpy as np
        from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask

        if self.matcher.is_error():
            raise ModelError(f"guided decoding failed: {self.matcher.get_error()}")
        bitmask = allocate_token_bitmask(1, self.vocab_size)
        fill_next_token_bitmask(self.matcher, bitmask)
        bits = np.unpackbits(bitmask[0].view(np.uint8), bitorder="little")
        mask = bits[: self.vocab_size].astype(bool)
        self.masks.append(mask)
        return mask

    def advance(self, token: int) -> None:
        """Feed the token sampled at the last step."""
        if not self.matcher.consume_token(int(token)):
            raise ModelError(
                f"guided decoding: token {token} was sampled outside the grammar "
                f"({self.matcher.get_error()})"
            )


class GuidedLogitsProcessor:
    """A ``transformers`` logits processor that masks what ``turn`` does not allow."""

    def __init__(self, turn: GuidedTurn, prompt_length: int) -> None:
        self.turn = turn
        self.prompt_length = prompt_length

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        """Feed the last sampled token, then set every disallowed logit to -inf."""
        if input_ids.shape[0] != 1:
            raise ModelError("guided decoding generates one sequence at a time")
        if input_ids.shape[1] > self.prompt_length:
            self.turn.advance(int(input_ids[0, -1]))
        return mask_scores(scores, self.turn.allowed())


def mask_scores(scores: Any, allowed: Any) -> Any:
    """``scores`` (a 1 x vocab tensor) with -inf wherever ``allowed`` (numpy bools) is False."""
    import numpy as np
    import torch

    width = scores.shape[-1]
    if width > allowed.shape[0]:  # padded embedding rows are never allowed
        allowed = np.concatenate([allowed, np.zeros(width - allowed.shape[0], dtype=bool)])
    allowed = allowed[:width]
    if scores.device.type != "cpu":
        keep = torch.from_numpy(allowed).to(scores.device)
        return scores.masked_fill(~keep, float("-inf"))
    # numpy, single-threaded: torch's elementwise ops on a 50k vocabulary go parallel,
    # and on a busy machine waiting for the second thread costs milliseconds per token.
    values = scores.detach().float().numpy()
    return torch.from_numpy(np.where(allowed, values, np.float32(-np.inf))).to(scores.dtype)


def guided_logprobs(
    logits: Sequence[Any], tokens: Sequence[int], masks: Sequence[Any]
) -> list[float]:
    """Log-probs of ``tokens`` under the model's distribution restricted to each step's mask."""
    import torch

    out = []
    for step, token, allowed in zip(logits, tokens, masks, strict=False):
        # A forced token (the only one allowed) comes out as exactly 0.0.
        masked = mask_scores(step[:1].float().cpu(), allowed)[0]
        out.append(float(torch.log_softmax(masked, dim=-1)[token]))
    return out
