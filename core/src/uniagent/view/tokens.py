"""The token view of a rollout: every token, whose it is (prompt, model, environment), its
log-prob, the model-call boundaries; and the exactness report when a tokenizer is at hand.

Token text needs the tokenizer that made the ids. It is the one given with
``uniagent view --tokenizer``, else the one the rollout names, if it loads from local
files (never from a hub: the viewer works offline). Without one, the view shows ids.
"""

from __future__ import annotations

import codecs
import threading
from collections import OrderedDict
from dataclasses import asdict
from pathlib import Path
from typing import Any

from uniagent.rollout.exactness import prefix_violations

PROMPT, MODEL, ENV = 0, 1, 2  # token kinds as the page colours them
MAX_TOKENS_PER_PAGE = 20_000
_BACKTRACK = 8  # tokens decoded before a page starts, so a character split across its edge reads


def _byte_alphabet() -> dict[str, int]:
    """Byte-level BPE's printable stand-in for each byte (GPT-2, Qwen, Llama 3), inverted."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    keep += range(ord("®"), ord("ÿ") + 1)
    chars = list(keep)
    extra = 0
    for byte in range(256):
        if byte not in keep:
            keep.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(keep, chars, strict=True)}


_BYTES = _byte_alphabet()


class TokenDecoder:
    """Text of each token, exact to the byte: a character split over tokens goes to the last."""

    def __init__(self, tokenizer: Any) -> None:
        """Wrap a ``transformers`` tokenizer."""
        self.tokenizer = tokenizer
        backend = getattr(tokenizer, "backend_tokenizer", None)
        self.byte_level = "ByteLevel" in repr(getattr(backend, "decoder", None))
        added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
        self.added: dict[int, str] = {int(i): str(t.content) for i, t in added.items()}
        self.special = frozenset(int(i) for i in getattr(tokenizer, "all_special_ids", []))

    def pieces(self, ids: list[int]) -> list[str]:
        """One string per id; together they are the decoded text."""
        strings = self.tokenizer.convert_ids_to_tokens(ids)
        utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        out = []
        for token_id, string in zip(ids, strings, strict=True):
            if token_id in self.added:
                out.append(utf8.decode(b"", final=True) + self.added[token_id])
                utf8.reset()
            elif self.byte_level and string is not None and all(c in _BYTES for c in string):
                out.append(utf8.decode(bytes(_BYTES[c] for c in string)))
            else:
                out.append(utf8.decode(b"", final=True) + self.tokenizer.decode([token_id]))
                utf8.reset()
        return out


class Tokenizers:
    """Loads tokenizers on demand from local files; thread-safe.

    The last :data:`KEPT` are kept (a tokenizer is tens of MB, and every rollout of a run
    folder may name another one). Code shipped with a tokenizer is never run
    (``trust_remote_code=False``): the name comes from a run folder, which is untrusted.
    """

    KEPT = 4

    def __init__(self, explicit: str | None = None, kept: int = KEPT) -> None:
        """``explicit``: a tokenizer folder (or cached hub id) used for every rollout."""
        self.explicit = explicit
        self.kept = kept
        self._loaded: OrderedDict[str, tuple[TokenDecoder | None, str]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, recorded: str | None) -> tuple[TokenDecoder | None, str]:
        """A decoder for a rollout whose snapshot names ``recorded``, or None and why not."""
        name = self.explicit or recorded
        if not name:
            return None, (
                "the rollout does not name its tokenizer: start the viewer with --tokenizer PATH"
            )
        with self._lock:  # held while loading: two requests never load one tokenizer twice
            if name in self._loaded:
                self._loaded.move_to_end(name)
            else:
                self._loaded[name] = self._load(name)
                while len(self._loaded) > self.kept:
                    self._loaded.popitem(last=False)
            return self._loaded[name]

    def cached(self) -> list[str]:
        """The names kept now, least recently used first."""
        with self._lock:
            return list(self._loaded)

    @staticmethod
    def _load(name: str) -> tuple[TokenDecoder | None, str]:
        try:
            from transformers import AutoTokenizer
        except ImportError:
            return None, "token text needs transformers: pip install 'uniagent[tokenizers]'"
        source, kwargs = gguf_source(name)
        try:
            tokenizer = AutoTokenizer.from_pretrained(
                source, local_files_only=True, trust_remote_code=False, **kwargs
            )
        except Exception as exc:  # any loader failure is a reason to show, not a crash
            return None, (
                f"tokenizer {name!r} did not load from local files ({type(exc).__name__}: "
                f"{str(exc)[:200]}); pass --tokenizer PATH"
            )
        return TokenDecoder(tokenizer), name


def gguf_source(name: str) -> tuple[str, dict[str, str]]:
    """Where ``from_pretrained`` finds a tokenizer: a ``.gguf`` file is its folder plus
    ``gguf_file``, and so is a folder holding one GGUF file and no tokenizer files (what
    a GGUF model's tokenizer records as its name, e.g. ``hf:smollm2``'s)."""
    path = Path(name)
    if path.suffix == ".gguf" and path.is_file():
        return str(path.parent), {"gguf_file": path.name}
    if path.is_dir() and not (path / "tokenizer.json").exists():
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1 and not (path / "tokenizer_config.json").exists():
            return name, {"gguf_file": ggufs[0].name}
    return name, {}


def token_page(
    rollout: dict[str, Any], decoder: TokenDecoder | None, *, offset: int, limit: int
) -> dict[str, Any]:
    """One page of tokens of a ``Rollout.to_dict()`` snapshot, with the view's figures."""
    mode = rollout.get("mode")
    prompt = [int(i) for i in rollout.get("prompt_ids") or []]
    response = [int(i) for i in rollout.get("response_ids") or []]
    if mode != "tokens" or not (prompt or response):
        return {
            "available": False,
            "mode": mode,
            "reason": "this rollout holds messages only: the model backend returned no token "
            "ids (an OpenAI-compatible server other than vLLM, or no tokenizer given)",
        }
    mask = [int(m) for m in rollout.get("response_mask") or []]
    has_logprobs = bool(rollout.get("has_logprobs")) and bool(rollout.get("response_logprobs"))
    logprobs = [float(x) for x in rollout.get("response_logprobs") or []] if has_logprobs else []
    ids = prompt + response
    kinds = [PROMPT] * len(prompt) + [MODEL if m else ENV for m in mask]
    kinds += [ENV] * (len(ids) - len(kinds))  # a misaligned snapshot still shows
    lps: list[float | None] = [None] * len(prompt)
    lps += [round(lp, 4) if m else None for lp, m in zip(logprobs, mask, strict=False)]
    lps += [None] * (len(ids) - len(lps))
    marks = [int(m[0]) for m in rollout.get("turn_marks") or [] if m]
    bad = prefix_violations(ids, [(int(m[0]), int(m[1])) for m in rollout.get("turn_marks") or []])
    model_lps = [lp for lp in lps if lp is not None]
    limit = max(1, min(limit, MAX_TOKENS_PER_PAGE))
    offset = max(0, min(offset, len(ids)))
    end = min(len(ids), offset + limit)
    text = None
    special: list[int] = []
    if decoder is not None:
        start = max(0, offset - _BACKTRACK)
        text = decoder.pieces(ids[start:end])[offset - start :]
        special = [i for i in range(offset, end) if ids[i] in decoder.special]
    return {
        "available": True,
        "mode": mode,
        "tokenizer": rollout.get("tokenizer"),
        "decoded": text is not None,
        "total": len(ids),
        "prompt_length": len(prompt),
        "offset": offset,
        "ids": ids[offset:end],
        "text": text,
        "kind": kinds[offset:end],
        "logprob": lps[offset:end],
        "special": special,
        "marks": marks,
        "has_logprobs": has_logprobs,
        "counts": {
            "prompt": len(prompt),
            "model": sum(1 for k in kinds if k == MODEL),
            "env": sum(1 for k in kinds if k == ENV),
        },
        "mean_logprob": sum(model_lps) / len(model_lps) if model_lps else None,
        "min_logprob": min(model_lps) if model_lps else None,
        "prefix_ok": not bad,
        "prefix_violations": list(bad),
    }


def exactness(rollout: dict[str, Any], decoder: TokenDecoder) -> dict[str, Any]:
    """``Rollout.check_exactness()`` of the snapshot, JSON-ready (a full re-render)."""
    from uniagent.rollout import Rollout

    cache = Rollout.from_dict(rollout, decoder.tokenizer)
    report = cache.check_exactness()
    counts: dict[str, int] = {}
    for difference in report.differences:
        counts[difference.kind] = counts.get(difference.kind, 0) + 1
    return {
        **asdict(report),
        "ok": report.ok,
        "kinds": counts,
        "summary": report.summary(),
    }
