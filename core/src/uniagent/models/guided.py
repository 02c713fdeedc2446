"""Guided decoding for in-process models: every turn is a valid tool call (``llguidance``).

With ``guided="tool_call"`` (model spec ``hf:PATH?guided=tool_call``) the tokens a
local model may sample are restricted, step by step, to those that keep the turn
inside this grammar (``hermes`` parser)::

    [THOUGHT] "<tool_call>\\n" {"name": NAME, "arguments": ARGS} "\\n</tool_call>" EOT

``NAME`` is one of the episode's tools and ``ARGS`` matches that tool's
``parameters_schema()`` (the JSON is written as ``json.dumps`` writes it: ``", "``
and ``": "`` separators, properties in schema order, no newlines). The optional
``THOUGHT`` is free text without ``<`` (so it can neither open a tag nor spell one)
ending with a newline, at most ``thought_chars`` characters in all (the newline
included; a bare newline is an empty thought); ``thought_chars=0`` allows none.
``EOT`` is the chat template's end-of-turn token (``<|im_end|>``), the only token
that ends a guided turn. One call per turn. The parser still parses and validates
the text as usual.

The turn's token budget (``max_tokens``, or what is left of the episode's) is part of the
constraint: the call is closed before the budget runs out, so a guided turn that fits
at all is a complete call, never one cut inside a string (see
:mod:`uniagent.models.guided_turn`, which holds the per-turn state and the logits
processor).

Token exactness: the masks only select among the model's own tokens, the ids
generated are the ids recorded, nothing is re-tokenized. Tags that are single
added tokens of the tokenizer (Qwen's ``<tool_call>``) must be that token.

Log-probs: the sampled distribution is the model's, restricted to the allowed
tokens and renormalised over them; that is what is recorded (before temperature
and top-p/top-k, as for unguided generation). A token the grammar forces (the
only one allowed) gets 0.0. The loop hands the format to the backend
(``generate(cache, call_format=parser)``); the tools are the cache's
(``cache.tools``, the OpenAI schemas rendered into the prompt).

Compiled grammars are kept per tool set in an LRU of :data:`GRAMMAR_CACHE_SIZE`, so
tools set per task cannot grow it without bound; ``bench/guided.py`` prints its hit rate.

Why ``llguidance``: measured by ``bench/guided.py`` against ``xgrammar``,
``outlines``, ``lm-format-enforcer`` and ``transformers-cfg`` (see there).
"""

from __future__ import annotations

import json
import logging
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from uniagent.errors import ConfigError
from uniagent.models.base import ModelError
from uniagent.models.guided_turn import (
    ClosingPlanner,
    GuidedLogitsProcessor,
    GuidedTurn,
    guided_logprobs,
    mask_scores,
    unpack_bitmask,
)
from uniagent.parsers import HermesParser, ToolCallParser

log = logging.getLogger(__name__)

__all__ = [
    "GUIDED_MODES",
    "ClosingPlanner",
    "GrammarCacheInfo",
    "GuidedDecoding",
    "GuidedLogitsProcessor",
    "GuidedTurn",
    "ToolCallGuide",
    "call_schema",
    "check_generation_options",
    "guided_logprobs",
    "mask_scores",
    "require_hermes",
    "tool_call_grammar",
    "unpack_bitmask",
]

GUIDED_MODES = ("tool_call",)
DEFAULT_THOUGHT_CHARS = 200
#: The longest thought ``thought=`` may ask for (a turn's token budget is far smaller).
MAX_THOUGHT_CHARS = 4000
_JSON_STYLE = {"item_separator": ", ", "key_separator": ": ", "whitespace_flexible": False}
#: Compiled grammars kept per model, least recently used dropped first: a run with one
#: tool set needs one; with tools set per task, about one per episode running at once.
GRAMMAR_CACHE_SIZE = 64


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
        chars = self.thought_chars
        if (
            isinstance(chars, bool)
            or not isinstance(chars, int)
            or not (0 <= chars <= MAX_THOUGHT_CHARS)
        ):
            raise ConfigError(
                f"guided thought: expected a number of characters from 0 to "
                f"{MAX_THOUGHT_CHARS}, got {chars!r}"
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


def _set(value: Any) -> bool:
    return value is not None


def _more_than_one(value: Any) -> bool:
    return value is not None and not (isinstance(value, int) and value <= 1)


def _nonzero(value: Any) -> bool:
    return value not in (None, 0, 0.0)


_DRAFTS = "draft tokens are accepted without passing the grammar's mask"
_SEQUENCES = "several sequences cannot share one turn's grammar state"
_BANS = "it may ban the one token the grammar allows"
#: ``generate()`` options that bypass or break the per-step mask, and why.
_BREAKS_GUIDANCE: dict[str, tuple[Callable[[Any], bool], str]] = {
    "assistant_model": (_set, f"assisted decoding: {_DRAFTS}"),
    "assistant_tokenizer": (_set, f"assisted decoding: {_DRAFTS}"),
    "prompt_lookup_num_tokens": (_set, f"prompt-lookup decoding: {_DRAFTS}"),
    "num_beams": (_more_than_one, f"beam search: {_SEQUENCES}"),
    "num_beam_groups": (_more_than_one, f"group beam search: {_SEQUENCES}"),
    "num_return_sequences": (_more_than_one, _SEQUENCES),
    "penalty_alpha": (_nonzero, "contrastive search re-ranks candidates after the mask"),
    "eos_token_id": (_set, "a guided turn ends at the chat template's end-of-turn token"),
    "stop_strings": (_set, "a guided turn ends at the chat template's end-of-turn token"),
    "forced_eos_token_id": (_set, "a guided turn ends at the chat template's end-of-turn token"),
    # Logits processors that ban tokens before the grammar's mask: when they ban the
    # only token the grammar allows (its end of turn), the turn cannot go on.
    "min_new_tokens": (_nonzero, _BANS),
    "min_length": (_nonzero, _BANS),
    "bad_words_ids": (_set, _BANS),
    "suppress_tokens": (_set, _BANS),
    "begin_suppress_tokens": (_set, _BANS),
    "sequence_bias": (_set, _BANS),
}


def check_generation_options(options: Mapping[str, Any], where: str) -> None:
    """Reject ``generate()`` options that break guided decoding (``where`` names the key path)."""
    for key, (breaks, why) in _BREAKS_GUIDANCE.items():
        if key in options and breaks(options[key]):
            raise ConfigError(
                f"{where}.{key}={options[key]!r} cannot be used with guided decoding ({why}); "
                "drop it or drop guided= from the model spec"
            )


def require_hermes(parser: ToolCallParser) -> HermesParser:
    """``parser`` if it is the hermes parser (guided decoding writes hermes calls), else refused."""
    if not isinstance(parser, HermesParser):
        raise ConfigError(
            f"guided decoding supports the hermes tool parser, not {parser.name!r}; "
            "use tool_parser: hermes or drop guided= from the model spec"
        )
    return parser


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
    that are single added tokens to their ids. A tool whose schema uses what
    llguidance cannot compile is constrained more loosely (logged, see
    :func:`call_schema`); the parser still validates its arguments.
    """
    hermes = require_hermes(parser)
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
        schema = call_schema(function["name"], function.get("parameters"))
        calls.append(f"call_{i}: %json {json.dumps(schema, ensure_ascii=False)}")
    lines = [
        f"start: {'thought? ' if thought_chars else ''}"
        f'{literal(hermes.open_tag)} "\\n" call "\\n" {literal(hermes.close_tag)}',
        "call: " + " | ".join(f"call_{i}" for i in range(len(tools))),
        *calls,
    ]
    if thought_chars:
        # One lexeme, newline included: a separate "\n" after a regex that may itself
        # match newlines would be swallowed by it (the lexer is greedy), forcing a second
        # one before the tag. An empty thought ("\n" alone) is allowed.
        lines.append(f"thought: /[^<]{{0,{thought_chars - 1}}}\\n/")
    return "\n".join(lines) + "\n"


def call_schema(name: str, parameters: Mapping[str, Any] | None) -> dict[str, Any]:
    """The JSON schema of ``{"name": NAME, "arguments": ARGS}`` that llguidance compiles.

    Tried as given; if llguidance rejects a keyword it does not implement (``if``,
    ``uniqueItems``, ``not``, ...), again with those keywords ignored (``lenient``); if
    it still fails (a look-around in a ``pattern``, a dangling ``$ref``), the arguments
    are any JSON object. Each fallback is logged as a warning: the turn stays a call of
    this tool, and the parser still validates its arguments against the full schema.
    """
    from llguidance import LLMatcher

    arguments = dict(parameters or {"type": "object", "properties": {}})
    # "#/$defs/..." references resolve against the root, which is now the wrapper.
    hoisted: dict[str, Any] = {
        key: arguments.pop(key) for key in ("$defs", "definitions") if key in arguments
    }

    def wrap(args: Mapping[str, Any], style: Mapping[str, Any]) -> dict[str, Any]:
        return {
            "type": "object",
            "properties": {"name": {"const": name}, "arguments": dict(args)},
            "required": ["name", "arguments"],
            "additionalProperties": False,
            **hoisted,
            "x-guidance": dict(style),
        }

    strict = wrap(arguments, _JSON_STYLE)
    failed, messages = LLMatcher.validate_grammar_with_warnings(
        LLMatcher.grammar_from_json_schema(strict)
    )
    if not failed:
        return strict
    lenient = wrap(arguments, {**_JSON_STYLE, "lenient": True})
    failed_lenient, _ = LLMatcher.validate_grammar_with_warnings(
        LLMatcher.grammar_from_json_schema(lenient)
    )
    if not failed_lenient:
        log.warning(
            "guided decoding: tool %r: llguidance ignores parts of its schema (%s); "
            "its arguments are constrained loosely there, the parser still checks them",
            name,
            "; ".join(messages),
        )
        return lenient
    log.warning(
        "guided decoding: tool %r: llguidance cannot compile its schema (%s); "
        "its arguments may be any JSON object, the parser still checks them",
        name,
        "; ".join(messages),
    )
    return wrap({"type": "object"}, _JSON_STYLE)


@dataclass(frozen=True)
class GrammarCacheInfo:
    """How the compiled-grammar cache of a :class:`ToolCallGuide` has served its turns."""

    hits: int
    misses: int
    evictions: int
    size: int
    max_size: int

    @property
    def hit_rate(self) -> float | None:
        """Hits over lookups (None before the first turn)."""
        lookups = self.hits + self.misses
        return self.hits / lookups if lookups else None


#: llguidance's view of each tokenizer (about a second to build for a 50k vocabulary, three
#: for Qwen3's 150k), shared by every guide of that tokenizer for as long as it lives: per
#: end-of-turn token and vocabulary size (tokens added later make another).
_LL_TOKENIZERS: weakref.WeakKeyDictionary[Any, dict[tuple[int, int], Any]] = (
    weakref.WeakKeyDictionary()
)
_LL_LOCK = threading.Lock()


def _ll_tokenizer(llguidance: Any, tokenizer: Any, end_of_turn: int) -> Any:
    """llguidance's tokenizer for ``tokenizer`` ending turns with ``end_of_turn``, built once."""
    key = (end_of_turn, len(tokenizer))
    with _LL_LOCK:
        try:
            known = _LL_TOKENIZERS.setdefault(tokenizer, {})
        except TypeError:  # a tokenizer that cannot be referred to weakly: built every time
            return llguidance.hf.from_tokenizer(tokenizer, eos_token=end_of_turn)
        if key not in known:
            known[key] = llguidance.hf.from_tokenizer(tokenizer, eos_token=end_of_turn)
        return known[key]


class ToolCallGuide:
    """Compiles tool-call grammars for one tokenizer and hands out per-turn matchers.

    ``end_of_turn`` is the chat template's end-of-turn token: the only token that may
    end a guided turn (not any other eos the tokenizer knows). Compiled grammars are
    kept per (tools, parser, settings) in an LRU of ``max_grammars``: a turn gets a
    copy, never a recompile, while its tool set is among the most recently used.
    """

    def __init__(
        self,
        tokenizer: Any,
        end_of_turn: int,
        settings: GuidedDecoding,
        *,
        max_grammars: int = GRAMMAR_CACHE_SIZE,
    ):
        if max_grammars < 1:
            raise ValueError(f"max_grammars must be at least 1, got {max_grammars}")
        self.tokenizer = tokenizer
        self.end_of_turn = int(end_of_turn)
        self.settings = settings
        self.max_grammars = max_grammars
        #: How many grammars were compiled (cache misses: new tool sets, or evicted ones).
        self.compilations = 0
        self._hits = 0
        self._evictions = 0
        self._lock = threading.Lock()
        self._compile_lock = threading.Lock()
        self._ll_tokenizer: Any = None
        self._compiled: OrderedDict[tuple[Any, ...], Any] = OrderedDict()
        self._planners: dict[str, ClosingPlanner] = {}

    def cache_info(self) -> GrammarCacheInfo:
        """Hits, misses (compilations), evictions and size of the compiled-grammar cache."""
        with self._compile_lock:
            return GrammarCacheInfo(
                hits=self._hits,
                misses=self.compilations,
                evictions=self._evictions,
                size=len(self._compiled),
                max_size=self.max_grammars,
            )

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
                self._ll_tokenizer = _ll_tokenizer(llguidance, self.tokenizer, self.end_of_turn)
        return llguidance

    def grammar(self, tools: Sequence[Mapping[str, Any]], parser: ToolCallParser) -> str:
        """The grammar text for these tool schemas and parser."""
        return tool_call_grammar(
            tools,
            parser,
            thought_chars=self.settings.thought_chars,
            special_tokens=self._special_tags(parser),
        )

    def matcher(
        self,
        tools: Sequence[Mapping[str, Any]],
        parser: ToolCallParser,
        prefix: Sequence[int] = (),
    ) -> GuidedTurn:
        """A fresh matcher for one turn; ``prefix`` holds ids of the turn already generated."""
        llguidance = self._llguidance()
        key = (
            type(parser).__qualname__,
            parser.name,
            getattr(parser, "open_tag", None),
            getattr(parser, "close_tag", None),
            # Key order kept: the JSON is written with properties in schema order.
            json.dumps(list(tools), default=repr),
        )
        # Compiled under the lock: concurrent episodes with the same tools wait for the
        # one compile instead of each doing it (tens of milliseconds, once).
        with self._compile_lock:
            compiled = self._compiled.get(key)
            if compiled is not None:
                self._hits += 1
                self._compiled.move_to_end(key)
            else:
                grammar = self.grammar(tools, parser)
                compiled = llguidance.LLMatcher(
                    self._ll_tokenizer, llguidance.LLMatcher.grammar_from_lark(grammar)
                )
                if compiled.is_error():
                    raise ModelError(
                        f"guided decoding: the tool-call grammar failed: {compiled.get_error()}"
                    )
                self._compiled[key] = compiled
                self.compilations += 1
                if len(self._compiled) > self.max_grammars:
                    self._compiled.popitem(last=False)  # the least recently used
                    self._evictions += 1
            matcher = compiled.deep_copy()
        if prefix and not matcher.consume_tokens(list(prefix)):
            raise ModelError(
                "guided decoding cannot continue this turn: what was generated so far is not "
                f"a valid start of a tool call ({matcher.get_error()})"
            )
        planner = self._planner(parser)
        vocab_size = self._ll_tokenizer.vocab_size
        return GuidedTurn(matcher, vocab_size, self.end_of_turn, planner, prefix)

    def _planner(self, parser: ToolCallParser) -> ClosingPlanner:
        """How turns of ``parser``'s format close within their budget (one per open tag)."""
        open_tag = require_hermes(parser).open_tag
        with self._lock:
            planner = self._planners.get(open_tag)
            if planner is None:
                tag_id = self._special_tags(parser).get(open_tag)
                planner = ClosingPlanner(self.tokenizer, self.end_of_turn, open_tag, tag_id)
                self._planners[open_tag] = planner
        return planner

    def _special_tags(self, parser: ToolCallParser) -> dict[str, int]:
        vocab = self.tokenizer.get_vocab()
        added = set(getattr(self.tokenizer, "get_added_vocab", dict)())
        tags = (getattr(parser, "open_tag", ""), getattr(parser, "close_tag", ""))
        return {tag: vocab[tag] for tag in tags if tag and tag in added and tag in vocab}
