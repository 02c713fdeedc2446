"""Chat-template analysis: find the end-of-turn token and what the template renders after it.

Everything here is done with the tokenizer's own chat template and its own tokenizer, by
comparing renderings of small dummy conversations; nothing is hard-coded per model family.
"""

from __future__ import annotations

import contextlib
import json
import threading
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from uniagent.errors import UniAgentError

Message = dict[str, Any]
ToolSchema = dict[str, Any]

# Dummy contents: plain ASCII words that no real conversation contains and that every
# tokenizer renders verbatim, so they can be found again in a rendering with str.find.
DUMMY_USER = "uniagent dummy user 7f3a"
DUMMY_ASSISTANT = "uniagent dummy assistant 9c1e"
_PROBE_USER = "uniagent probe user 2b8d"
_PROBE_TOOL = "uniagent probe tool 5e0c"
_PROBE_TOOLS: list[ToolSchema] = [
    {
        "type": "function",
        "function": {
            "name": "uniagent_probe",
            "description": "probe",
            "parameters": {"type": "object", "properties": {}, "required": []},
        },
    }
]


class TemplateAnalysisError(UniAgentError, ValueError):
    """The chat template cannot be rendered incrementally; the message says what was expected."""


@dataclass(frozen=True)
class TemplateAnalysis:
    """What the incremental builder needs to know about one tokenizer + chat template.

    ``eot_id`` closes an assistant turn (``<|im_end|>`` for Qwen). ``boundary_text`` is what
    the template renders after that token before the next message (``"\\n"`` for Qwen,
    ``""`` for Llama 3); ``final_tail_text`` is what it renders after the last assistant
    turn of a conversation (used when comparing against a full re-render).
    """

    eot_id: int
    eot_text: str
    boundary_text: str
    boundary_ids: tuple[int, ...]
    final_tail_text: str
    eot_is_eos: bool
    suffix_needs_tools: bool


def render_text(
    tokenizer: Any,
    messages: Sequence[Mapping[str, Any]],
    *,
    tools: Sequence[ToolSchema] | None,
    add_generation_prompt: bool,
    chat_template_kwargs: Mapping[str, Any],
) -> str:
    """Render ``messages`` with the tokenizer's chat template, as text."""
    text = tokenizer.apply_chat_template(
        list(messages),
        tools=list(tools) if tools else None,
        add_generation_prompt=add_generation_prompt,
        tokenize=False,
        **chat_template_kwargs,
    )
    if not isinstance(text, str):  # defensive: batched input or an exotic tokenizer
        raise TypeError(f"apply_chat_template(tokenize=False) returned {type(text).__name__}")
    return text


def encode(tokenizer: Any, text: str) -> list[int]:
    """Tokenize rendered template text the way ``apply_chat_template(tokenize=True)`` does."""
    # The template already contains BOS and friends, so no special tokens are added here.
    backend = _direct_backend(tokenizer)
    if backend is None:
        return list(tokenizer.encode(text, add_special_tokens=False))
    fast = getattr(backend, "encode_batch_fast", None)  # tokenizers >= 0.21: no offsets
    if fast is not None:
        return list(fast([text], add_special_tokens=False)[0].ids)
    return list(backend.encode(text, add_special_tokens=False).ids)


def _direct_backend(tokenizer: Any) -> Any:
    """The ``tokenizers.Tokenizer`` of a fast tokenizer when calling it gives ``encode``'s ids.

    A fast tokenizer's ``encode`` runs its Rust tokenizer's ``encode_batch`` on a batch of
    one after turning truncation and padding off and setting whether special tokens are
    split, and computes character offsets nobody here reads. Where those settings already
    hold, the Rust tokenizer called directly (``encode_batch_fast``: the same pipeline
    without offsets, about a fifth faster) gives the same ids; otherwise (or for a slow
    tokenizer) ``None``: ``encode`` is called.
    """
    backend = getattr(tokenizer, "_tokenizer", None)
    if backend is None or type(backend).__module__.split(".")[0] != "tokenizers":
        return None
    if not _plain_encode(type(tokenizer)):
        return None
    try:
        split = bool(getattr(tokenizer, "split_special_tokens", False))
        if backend.truncation is not None or backend.padding is not None:
            return None
        if bool(backend.encode_special_tokens) != split:
            return None
    except AttributeError:
        return None
    return backend


#: The methods between ``encode`` and the Rust tokenizer, and the modules of transformers'
#: base classes that define them: a class that defines one elsewhere (CodeLlama splits at
#: ``<FILL_ME>``, a ``trust_remote_code`` tokenizer may do anything) is called as it is.
_ENCODE_PATH = ("encode", "encode_plus", "_encode_plus", "_batch_encode_plus", "tokenize")
_BASE_MODULES = (
    "transformers.tokenization_utils_base",
    "transformers.tokenization_utils_fast",
    "transformers.tokenization_utils_tokenizers",
)


_PLAIN: weakref.WeakKeyDictionary[type, bool] = weakref.WeakKeyDictionary()


def _plain_encode(cls: type) -> bool:
    """Whether ``cls`` encodes with transformers' own methods only (nothing overridden)."""
    plain = _PLAIN.get(cls)
    if plain is None:
        owners = (next((k for k in cls.__mro__ if n in vars(k)), None) for n in _ENCODE_PATH)
        plain = all(k is None or k.__module__ in _BASE_MODULES for k in owners)
        _PLAIN[cls] = plain
    return plain


def decode(tokenizer: Any, ids: Sequence[int]) -> str:
    """Decode ids verbatim: special tokens kept, no clean-up of spaces."""
    return str(
        tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)
    )


_CACHE: dict[tuple[Any, ...], TemplateAnalysis] = {}
# Per tokenizer object: computing a content key (``len(tokenizer)``) rebuilds the whole
# vocabulary in some tokenizers releases (~40 ms), far too slow for every episode.
_BY_OBJECT: weakref.WeakKeyDictionary[Any, dict[tuple[Any, ...], TemplateAnalysis]] = (
    weakref.WeakKeyDictionary()
)
_CACHE_LOCK = threading.Lock()


def analyse_chat_template(tokenizer: Any, **chat_template_kwargs: Any) -> TemplateAnalysis:
    """Detect the end-of-turn token and boundary text of a chat template (cached per tokenizer)."""
    template = getattr(tokenizer, "chat_template", None)
    # str hashes are cached by Python, so this stays O(1) after the first call.
    template_hash = hash(template) if isinstance(template, str) else hash(repr(template))
    fast_key = (template_hash, json.dumps(dict(chat_template_kwargs), sort_keys=True, default=repr))
    try:
        per_object = _BY_OBJECT.get(tokenizer)
    except TypeError:  # not weak-referenceable or unhashable: use the content key only
        per_object = None
    if per_object is not None and fast_key in per_object:
        return per_object[fast_key]
    key = _cache_key(tokenizer, chat_template_kwargs)
    analysis = _CACHE.get(key)
    if analysis is None:
        analysis = _analyse(tokenizer, chat_template_kwargs)
        with _CACHE_LOCK:
            _CACHE[key] = analysis
    with _CACHE_LOCK, contextlib.suppress(TypeError):
        _BY_OBJECT.setdefault(tokenizer, {})[fast_key] = analysis
    return analysis


def _cache_key(tokenizer: Any, kwargs: Mapping[str, Any]) -> tuple[Any, ...]:
    template = getattr(tokenizer, "chat_template", None)
    # str hashes are cached by Python, so this stays O(1) after the first call.
    template_hash = hash(template) if isinstance(template, str) else hash(repr(template))
    return (
        type(tokenizer).__qualname__,
        str(getattr(tokenizer, "name_or_path", "")),
        len(tokenizer),
        template_hash,
        json.dumps(dict(kwargs), sort_keys=True, default=repr),
    )


def _render_for_analysis(
    tokenizer: Any,
    messages: list[Message],
    kwargs: Mapping[str, Any],
    *,
    add_generation_prompt: bool,
    tools: list[ToolSchema] | None = None,
) -> str:
    try:
        return render_text(
            tokenizer,
            messages,
            tools=tools,
            add_generation_prompt=add_generation_prompt,
            chat_template_kwargs=kwargs,
        )
    except Exception as exc:
        roles = [m["role"] for m in messages]
        raise TemplateAnalysisError(
            f"the chat template failed to render a dummy conversation with roles {roles}: "
            f"{type(exc).__name__}: {exc}"
        ) from exc


def _added_token_ids(tokenizer: Any) -> set[int]:
    ids = set(getattr(tokenizer, "all_special_ids", []) or [])
    decoder = getattr(tokenizer, "added_tokens_decoder", None)
    if isinstance(decoder, Mapping):
        ids.update(int(i) for i in decoder)
    return ids


def _analyse(tokenizer: Any, kwargs: Mapping[str, Any]) -> TemplateAnalysis:
    if not getattr(tokenizer, "chat_template", None):
        raise TemplateAnalysisError(
            f"tokenizer {getattr(tokenizer, 'name_or_path', '?')!r} has no chat template; "
            "set tokenizer.chat_template (a Jinja template) before building rollouts"
        )
    user = {"role": "user", "content": DUMMY_USER}
    assistant = {"role": "assistant", "content": DUMMY_ASSISTANT}
    closed = _render_for_analysis(tokenizer, [user, assistant], kwargs, add_generation_prompt=False)
    pos = closed.find(DUMMY_ASSISTANT)
    if pos < 0:
        raise TemplateAnalysisError(
            "expected the chat template to render an assistant message's content verbatim, but "
            f"{DUMMY_ASSISTANT!r} does not occur in the rendering {closed!r}"
        )
    tail = closed[pos + len(DUMMY_ASSISTANT) :]
    tail_ids = encode(tokenizer, tail)
    special = _added_token_ids(tokenizer)
    if not tail_ids or tail_ids[0] not in special:
        found = repr(decode(tokenizer, tail_ids[:1])) if tail_ids else "nothing"
        raise TemplateAnalysisError(
            "expected the chat template to close an assistant turn with a special end-of-turn "
            "token (an added token such as <|im_end|> or <|eot_id|>) right after the content, "
            f"but it renders {found} there (full tail {tail!r}); without such a token the "
            "model's own output cannot be separated from the template's rendering"
        )
    eot_id = int(tail_ids[0])
    eot_text = decode(tokenizer, [eot_id])
    if not tail.startswith(eot_text):
        raise TemplateAnalysisError(
            f"the end-of-turn token {eot_text!r} does not round-trip through the tokenizer "
            f"(rendered tail {tail!r})"
        )
    final_tail_text = tail[len(eot_text) :]

    # The boundary between turns is what follows the end-of-turn token when another
    # message comes next; it can differ from the tail at the end of a conversation.
    probe_user = {"role": "user", "content": _PROBE_USER}
    following = _render_for_analysis(
        tokenizer, [user, assistant, probe_user], kwargs, add_generation_prompt=True
    )
    cut = following.find(DUMMY_ASSISTANT) + len(DUMMY_ASSISTANT)
    if not following.startswith(eot_text, cut):
        raise TemplateAnalysisError(
            "expected the assistant turn to render the same way whether or not a message follows "
            f"it, but after the content came {following[cut : cut + 40]!r} instead of {eot_text!r}"
        )
    suffix = following[cut + len(eot_text) :]
    next_start = suffix.find(_PROBE_USER)
    head = suffix[:next_start]
    # The boundary is the text between the end-of-turn token and the next special token
    # (the next message's header); the header itself belongs to the next message.
    head_ids = encode(tokenizer, head)
    boundary_ids: list[int] = []
    for token in head_ids:
        if token in special:
            break
        boundary_ids.append(token)
    boundary_text = decode(tokenizer, boundary_ids)
    if not suffix.startswith(boundary_text):
        raise TemplateAnalysisError(
            f"cannot separate the boundary after {eot_text!r} from the next message in {suffix!r}"
        )

    # Exactness of the incremental path rests on this: tokenizing the text before and
    # after an end-of-turn token separately gives the same ids as tokenizing it whole
    # (true when the token is an added token, since those split pre-tokenization).
    split_at = cut + len(eot_text)
    whole = encode(tokenizer, following)
    parts = encode(tokenizer, following[:split_at]) + encode(tokenizer, following[split_at:])
    if whole != parts:
        raise TemplateAnalysisError(
            f"tokenizing a rendering in two parts at the end-of-turn token {eot_text!r} gives "
            "different ids than tokenizing it whole, so incremental tokenization cannot be exact "
            "for this tokenizer"
        )

    # Does the rendering of later messages depend on the tool schemas? (Qwen's does not:
    # tools only shape the system block.) If it does, every incremental render gets them.
    probe_tool = {"role": "tool", "content": _PROBE_TOOL, "tool_call_id": "probe"}
    try:
        plain = _suffix_after_dummy(
            tokenizer, [probe_tool, probe_user], eot_text, kwargs, tools=None
        )
        with_tools = _suffix_after_dummy(
            tokenizer, [probe_tool, probe_user], eot_text, kwargs, tools=_PROBE_TOOLS
        )
        suffix_needs_tools = plain != with_tools
    except TemplateAnalysisError:
        # Templates without a tool role (or without tool support) still work for user
        # messages; a tool message will fail later with the template's own error.
        suffix_needs_tools = False

    eos_id = getattr(tokenizer, "eos_token_id", None)
    return TemplateAnalysis(
        eot_id=eot_id,
        eot_text=eot_text,
        boundary_text=boundary_text,
        boundary_ids=tuple(boundary_ids),
        final_tail_text=final_tail_text,
        eot_is_eos=eos_id == eot_id,
        suffix_needs_tools=suffix_needs_tools,
    )


_DUMMY_PREFIX: tuple[Message, ...] = (
    {"role": "user", "content": DUMMY_USER},
    {"role": "assistant", "content": DUMMY_ASSISTANT},
)


def _suffix_after_dummy(
    tokenizer: Any,
    messages: Sequence[Mapping[str, Any]],
    eot_text: str,
    kwargs: Mapping[str, Any],
    *,
    tools: Sequence[ToolSchema] | None,
) -> str:
    """Text the template renders after an assistant turn's end-of-turn token for ``messages``.

    Renders ``[dummy user, dummy assistant, *messages]`` with the generation prompt and
    keeps what follows the dummy assistant's end-of-turn token: the boundary, the new
    messages and the next generation prompt. Cost is proportional to ``messages`` only.
    """
    try:
        text = render_text(
            tokenizer,
            [*_DUMMY_PREFIX, *messages],
            tools=tools,
            add_generation_prompt=True,
            chat_template_kwargs=kwargs,
        )
    except Exception as exc:
        roles = [m.get("role") for m in messages]
        raise TemplateAnalysisError(
            f"the chat template failed to render messages with roles {roles} after an assistant "
            f"turn: {type(exc).__name__}: {exc}"
        ) from exc
    end = text.find(DUMMY_ASSISTANT)
    if end < 0:
        raise TemplateAnalysisError(
            "the chat template dropped the assistant turn before the new messages; "
            "incremental rendering needs assistant content rendered verbatim"
        )
    end += len(DUMMY_ASSISTANT)
    if not text.startswith(eot_text, end):
        raise TemplateAnalysisError(
            f"expected {eot_text!r} right after the assistant content when messages follow, "
            f"found {text[end : end + 40]!r}"
        )
    return text[end + len(eot_text) :]


def suffix_text(
    tokenizer: Any,
    analysis: TemplateAnalysis,
    messages: Sequence[Mapping[str, Any]],
    *,
    tools: Sequence[ToolSchema] | None,
    chat_template_kwargs: Mapping[str, Any],
) -> str:
    """Text to append after an assistant turn's end-of-turn token for ``messages``."""
    return _suffix_after_dummy(
        tokenizer,
        messages,
        analysis.eot_text,
        chat_template_kwargs,
        tools=tools if analysis.suffix_needs_tools else None,
    )


def assistant_text(
    tokenizer: Any,
    analysis: TemplateAnalysis,
    message: Mapping[str, Any],
    *,
    chat_template_kwargs: Mapping[str, Any],
) -> str:
    """Text the template renders for an assistant message after the generation prompt.

    Ends with the end-of-turn token; it is what a model would have emitted. Used to
    render token ids for message-only rollouts.
    """
    user = {"role": "user", "content": DUMMY_USER}
    prompt = _render_for_analysis(
        tokenizer, [user], chat_template_kwargs, add_generation_prompt=True
    )
    full = _render_for_analysis(
        tokenizer, [user, dict(message)], chat_template_kwargs, add_generation_prompt=False
    )
    tail = analysis.eot_text + analysis.final_tail_text
    if not full.startswith(prompt) or not full.endswith(tail):
        raise TemplateAnalysisError(
            "expected an assistant turn to render as the generation prompt followed by the "
            f"message and {tail!r}; got {full[len(prompt) - 20 :]!r}"
        )
    return full[len(prompt) : len(full) - len(analysis.final_tail_text)]
