"""Exactness check: compare a rollout's ids with a full chat-template re-render."""

from __future__ import annotations

import re
import zlib
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from difflib import SequenceMatcher
from typing import Literal

DifferenceKind = Literal["retokenized", "think_block", "drift"]

# Reasoning blocks as Qwen3 / DeepSeek-R1 templates write them; the templates drop or
# rewrite them in earlier assistant turns, which is a known, benign difference. Greedy,
# like the templates (reasoning runs to the last "</think>"), and applied to one turn
# at a time.
_THINK_BLOCK = re.compile(r"<think>.*</think>\s*", re.DOTALL)
_THINK_CONTENT = re.compile(r"<think>(.*)</think>", re.DOTALL)
_WHITESPACE = re.compile(r"\s+")


def strip_think_blocks(text: str) -> str:
    """Remove the ``<think>...</think>`` block (and the whitespace after it) from a turn's text."""
    return _THINK_BLOCK.sub("", text)


def ids_checksum(ids: Sequence[int], start: int, end: int, previous: int) -> int:
    """CRC-32 of ``ids[start:end]`` continuing from ``previous`` (running, append-only)."""
    if end <= start:
        return previous
    return zlib.crc32(array("q", ids[start:end]).tobytes(), previous)


@dataclass(frozen=True)
class Difference:
    """One region where the rollout's ids and the re-rendered ids differ.

    ``kind`` is ``"retokenized"`` (same text, other token split: the model chose a
    non-canonical tokenization, harmless for training), ``"think_block"`` (the template
    dropped or rewrote a ``<think>`` block of an earlier assistant turn: the model really
    saw the block, a re-render would not) or ``"drift"`` (anything else: a bug).
    """

    kind: DifferenceKind
    cache_start: int
    cache_end: int
    render_start: int
    render_end: int
    cache_text: str
    render_text: str


@dataclass(frozen=True)
class ExactnessReport:
    """Result of :meth:`Rollout.check_exactness`.

    ``prefix_ok``: the context given to the model at every turn is a prefix of the final
    ids (``prefix_violations`` lists the turns where it is not). ``ids_match`` /
    ``text_match``: the final ids (or their decoded text) equal a full re-render of
    ``messages``; ``differences`` classifies every differing region.
    """

    num_model_calls: int
    turn_context_lengths: tuple[int, ...]
    prefix_ok: bool
    prefix_violations: tuple[int, ...]
    ids_match: bool
    text_match: bool
    cache_length: int
    render_length: int
    differences: tuple[Difference, ...]

    @property
    def drift(self) -> tuple[Difference, ...]:
        """Differences not explained by a known template effect."""
        return tuple(d for d in self.differences if d.kind == "drift")

    @property
    def ok(self) -> bool:
        """True when the prefix invariant holds and there is no unexplained drift."""
        return self.prefix_ok and not self.drift

    def summary(self) -> str:
        """A short human-readable account of the report."""
        lines = [
            f"exactness: {'ok' if self.ok else 'FAILED'} ({self.num_model_calls} model calls, "
            f"{self.cache_length} cached ids vs {self.render_length} re-rendered)",
            f"  prefix invariant: {'ok' if self.prefix_ok else 'broken at turns'}"
            + ("" if self.prefix_ok else f" {list(self.prefix_violations)}"),
            f"  ids match re-render: {self.ids_match}; text matches: {self.text_match}",
        ]
        counts: dict[str, int] = {}
        for d in self.differences:
            counts[d.kind] = counts.get(d.kind, 0) + 1
        if counts:
            lines.append(
                "  differences: " + ", ".join(f"{k}={v}" for k, v in sorted(counts.items()))
            )
        for d in self.drift[:3]:
            lines.append(
                f"  drift at cache[{d.cache_start}:{d.cache_end}] / render[{d.render_start}:"
                f"{d.render_end}]: cache {d.cache_text[:120]!r} vs render {d.render_text[:120]!r}"
            )
        return "\n".join(lines)


def prefix_violations(ids: Sequence[int], marks: Sequence[tuple[int, int]]) -> tuple[int, ...]:
    """Turns whose recorded (length, checksum) context is not a prefix of ``ids``."""
    bad: list[int] = []
    crc = 0
    pos = 0
    for turn, (length, expected) in enumerate(marks):
        if length > len(ids) or length < pos:
            bad.append(turn)
            continue
        crc = ids_checksum(ids, pos, length, crc)
        pos = length
        if crc != expected:
            bad.append(turn)
            # Later checksums chain from the recorded value, so one bad turn is reported once.
            crc = expected
    return tuple(bad)


# Differing regions closer than this (in tokens) are classified together: an aligner can
# cut one dropped think block into pieces when its tokens also occur nearby.
_MERGE_GAP = 8
# Equal tokens added on both sides of a region before classifying it: a deletion is
# only defined up to a shift when the tokens around it repeat (e.g. "<think>").
_PAD = 4


def explained_by_think_blocks(cache_text: str, render_text: str) -> bool:
    """True when two turns differ only by think blocks the template dropped, re-spaced or
    inserted empty."""
    if strip_think_blocks(cache_text) != strip_think_blocks(render_text):
        return False
    # The reasoning of every block the render kept must be text the cache has (whitespace
    # aside; the template may also have re-split the turn at a "</think>" found in the
    # content): a block whose reasoning changed is drift, not a template effect. An empty
    # block is one the template inserts (Qwen3 does for a last turn whose content has no
    # "</think>", e.g. a generation cut inside its reasoning).
    cache_compact = _WHITESPACE.sub("", cache_text)
    for m in _THINK_CONTENT.finditer(render_text):
        needle = _WHITESPACE.sub("", m.group(1))
        if needle and needle not in cache_compact:
            return False
    return True


def classify_differences(
    cache_ids: Sequence[int],
    render_ids: Sequence[int],
    decode: Callable[[Sequence[int]], str],
    eot_id: int | None = None,
) -> tuple[Difference, ...]:
    """Align the two id sequences and classify every differing region.

    With ``eot_id``, both sequences are first cut into turns at the end-of-turn token;
    when they have the same number of turns, turn *k* is compared with turn *k* (exact
    alignment, even for very repetitive conversations). Otherwise a generic diff aligns them.
    """
    if eot_id is not None:
        cache_turns = _turns(cache_ids, eot_id)
        render_turns = _turns(render_ids, eot_id)
        if len(cache_turns) == len(render_turns):
            diffs: list[Difference] = []
            for (c0, c1), (r0, r1) in zip(cache_turns, render_turns, strict=True):
                if cache_ids[c0:c1] != render_ids[r0:r1]:
                    diffs.append(_turn_difference(cache_ids, render_ids, c0, c1, r0, r1, decode))
            return tuple(diffs)
    return _diff_generic(cache_ids, render_ids, decode)


def _turns(ids: Sequence[int], eot_id: int) -> list[tuple[int, int]]:
    """Spans of ``ids`` that each end just after an end-of-turn token (the last may not)."""
    spans = []
    start = 0
    for i, token in enumerate(ids):
        if token == eot_id:
            spans.append((start, i + 1))
            start = i + 1
    spans.append((start, len(ids)))
    return spans


def _turn_difference(
    cache_ids: Sequence[int],
    render_ids: Sequence[int],
    c0: int,
    c1: int,
    r0: int,
    r1: int,
    decode: Callable[[Sequence[int]], str],
) -> Difference:
    # Report the differing middle of the turn, classify on the whole turn's text so a
    # think block is seen whole.
    lo = 0
    while c0 + lo < c1 and r0 + lo < r1 and cache_ids[c0 + lo] == render_ids[r0 + lo]:
        lo += 1
    hi = 0
    while (
        c1 - hi > c0 + lo
        and r1 - hi > r0 + lo
        and cache_ids[c1 - 1 - hi] == render_ids[r1 - 1 - hi]
    ):
        hi += 1
    ct = decode(cache_ids[c0 + lo : c1 - hi])
    rt = decode(render_ids[r0 + lo : r1 - hi])
    kind: DifferenceKind
    if ct == rt:
        kind = "retokenized"
    elif explained_by_think_blocks(decode(cache_ids[c0:c1]), decode(render_ids[r0:r1])):
        kind = "think_block"
    else:
        kind = "drift"
    return Difference(kind, c0 + lo, c1 - hi, r0 + lo, r1 - hi, ct, rt)


def _diff_generic(
    cache_ids: Sequence[int],
    render_ids: Sequence[int],
    decode: Callable[[Sequence[int]], str],
) -> tuple[Difference, ...]:
    n, m = len(cache_ids), len(render_ids)
    # Trim the common prefix and suffix first: they are most of a long conversation and
    # SequenceMatcher is quadratic in the worst case.
    lo = 0
    while lo < n and lo < m and cache_ids[lo] == render_ids[lo]:
        lo += 1
    hi = 0
    while hi < n - lo and hi < m - lo and cache_ids[n - 1 - hi] == render_ids[m - 1 - hi]:
        hi += 1
    a = list(cache_ids[lo : n - hi])
    b = list(render_ids[lo : m - hi])
    regions: list[list[int]] = []
    for tag, i1, i2, j1, j2 in SequenceMatcher(None, a, b).get_opcodes():
        if tag == "equal":
            continue
        i1, i2, j1, j2 = i1 + lo, i2 + lo, j1 + lo, j2 + lo
        if regions and i1 - regions[-1][1] <= _MERGE_GAP:
            regions[-1][1], regions[-1][3] = i2, j2
        else:
            regions.append([i1, i2, j1, j2])
    diffs: list[Difference] = []
    previous_end = 0
    for index, (i1, i2, j1, j2) in enumerate(regions):
        ct = decode(cache_ids[i1:i2])
        rt = decode(render_ids[j1:j2])
        kind: DifferenceKind
        if ct == rt:
            kind = "retokenized"
        else:
            # Pad with equal tokens on both sides (never into a neighbouring region).
            next_start = regions[index + 1][0] if index + 1 < len(regions) else n
            before = min(_PAD, i1 - previous_end)
            after = min(_PAD, next_start - i2, m - j2)
            head = decode(cache_ids[i1 - before : i1])
            tail = decode(cache_ids[i2 : i2 + after])
            if explained_by_think_blocks(head + ct + tail, head + rt + tail):
                kind = "think_block"
            else:
                kind = "drift"
        diffs.append(Difference(kind, i1, i2, j1, j2, ct, rt))
        previous_end = i2
    return tuple(diffs)
