"""Answer normalisation, exact match and token F1 (SQuAD / HotpotQA style), Unicode-aware.

The normalisation is the one of the SQuAD v1.1 evaluation script (lower case, drop
punctuation, drop the articles *a*, *an*, *the*, collapse white space), applied after
Unicode NFKC normalisation, with accents folded (``Brasília`` = ``Brasilia``) and every
Unicode punctuation character (category P: ``“ ” – … «``) removed, not only ASCII's.
F1 follows HotpotQA: when the prediction or the gold answer normalises to ``yes``,
``no`` or ``noanswer`` and they differ, F1 is 0 (no partial credit for yes/no).
"""

from __future__ import annotations

import re
import string
import unicodedata
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_SPECIAL = {"yes", "no", "noanswer"}
_ASCII_PUNCT = frozenset(string.punctuation)


def _is_punct(char: str) -> bool:
    return char in _ASCII_PUNCT or unicodedata.category(char).startswith("P")


def normalize_answer(text: str, *, fold_accents: bool = True) -> str:
    """SQuAD normalisation after NFKC (and accent folding): ``"The Beatles!"`` -> ``"beatles"``."""
    text = unicodedata.normalize("NFKC", text)
    if fold_accents:
        text = "".join(
            c for c in unicodedata.normalize("NFKD", text) if not unicodedata.combining(c)
        )
    text = text.casefold()
    # Punctuation goes before the articles are dropped, as in the SQuAD script.
    text = "".join(c for c in text if not _is_punct(c))
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def exact_match(prediction: str, gold: str, *, fold_accents: bool = True) -> float:
    """1.0 when both normalise to the same string, else 0.0."""
    return float(
        normalize_answer(prediction, fold_accents=fold_accents)
        == normalize_answer(gold, fold_accents=fold_accents)
    )


def token_f1(prediction: str, gold: str, *, fold_accents: bool = True) -> float:
    """Token-level F1 of the normalised strings (HotpotQA's yes/no/noanswer rule)."""
    pred = normalize_answer(prediction, fold_accents=fold_accents)
    ref = normalize_answer(gold, fold_accents=fold_accents)
    if (pred in _SPECIAL or ref in _SPECIAL) and pred != ref:
        return 0.0
    pred_tokens, ref_tokens = pred.split(), ref.split()
    if not pred_tokens or not ref_tokens:
        return float(pred_tokens == ref_tokens)
    common = Counter(pred_tokens) & Counter(ref_tokens)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred_tokens), same / len(ref_tokens)
    return 2 * precision * recall / (precision + recall)


@dataclass(frozen=True)
class AnswerScore:
    """The best exact match and F1 of a prediction over a list of gold aliases."""

    exact_match: float
    f1: float
    best_em_alias: str
    best_f1_alias: str


def score_answer(
    prediction: str, aliases: Sequence[str], *, fold_accents: bool = True
) -> AnswerScore:
    """Max exact match and max F1 over ``aliases`` (each alias is a full gold answer)."""
    if not aliases:
        raise ValueError("no gold answers to compare with")
    ems = [(exact_match(prediction, a, fold_accents=fold_accents), a) for a in aliases]
    f1s = [(token_f1(prediction, a, fold_accents=fold_accents), a) for a in aliases]
    em, em_alias = max(ems, key=lambda pair: pair[0])  # the first best alias
    f1, f1_alias = max(f1s, key=lambda pair: pair[0])
    return AnswerScore(em, f1, em_alias, f1_alias)


def as_aliases(value: object) -> list[str]:
    """Gold answers from a task field: a string, or a list of strings (and numbers)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, bool) or value is None:
        raise TypeError(f"gold answers must be a string or a list of strings, got {value!r}")
    if isinstance(value, int | float):
        return [str(value)]
    if isinstance(value, Iterable) and not isinstance(value, Mapping):
        aliases = []
        for item in value:
            if isinstance(item, bool) or not isinstance(item, str | int | float):
                raise TypeError(f"gold answers must be strings, got {item!r}")
            aliases.append(str(item))
        if aliases:
            return aliases
    raise ValueError(f"gold answers must be a non-empty string or list, got {value!r}")
