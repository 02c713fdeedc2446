"""One guided turn while it is generated: the allowed-token masks, and closing within budget.

A :class:`GuidedTurn` holds the turn's grammar state (an ``llguidance`` matcher, made by
:class:`uniagent.models.guided.ToolCallGuide`); :class:`GuidedLogitsProcessor` applies
its mask at each step of ``transformers``' ``generate()``.

**The turn's token budget.** Given the tokens the turn may still generate (``budget``,
``generate()``'s ``max_new_tokens``), the call is closed before they run out, so a guided
turn that fits at all is always a complete call. At each step a short way to finish the
call from here is worked out on a copy of the matcher (:meth:`ClosingPlanner.path`,
greedy, not always the shortest): the bytes the grammar forces, else the token that ends
soonest what the turn is in the middle of (a newline ends the thought, then the open
tag; ``"`` closes a JSON string, ``}``/``]`` an object/array, ``,`` goes to the next
element, ``0`` is the shortest number; otherwise the smallest id the grammar allows),
up to the end-of-turn token. With ``r`` tokens left and a closing path of
``c`` tokens:

- ``c >= r``: only the path's next token is allowed (forced, log-prob 0.0). With ``c > r``
  the budget is smaller than this way to close: the turn is cut, as any length cut;
- ``r - c <= WINDOW``: among the model's ``CANDIDATES`` likeliest allowed tokens, those
  after which the call can still close in time (each checked on a copy of the matcher),
  plus the path's next token;
- otherwise everything the grammar allows. (This assumes that no single token lengthens
  the closing path by more than ``WINDOW`` tokens: true of JSON tool calls, whose tokens
  open at most a few strings, objects or arrays each.)

The mask recorded for the log-probs is the one applied.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from uniagent.models.base import ModelError

#: Slack (tokens left beyond the closing path) under which candidates are checked.
WINDOW = 16
#: How many of the model's likeliest tokens are checked inside the window.
CANDIDATES = 16
#: A closing path longer than this is not looked for (the budget is left to the grammar).
MAX_CLOSING = 1024


def unpack_bitmask(words: Any, vocab_size: int) -> Any:
    """llguidance's packed mask (int32 words, token ``i`` is bit ``i % 32`` of word ``i // 32``)
    as ``vocab_size`` numpy bools."""
    import numpy as np

    # Little-endian bytes whatever the host's order, so that bit order "little" is token order.
    as_bytes = np.ascontiguousarray(words, dtype="<i4").view(np.uint8)
    return np.unpackbits(as_bytes, bitorder="little")[:vocab_size].astype(bool)


def _mask_of(matcher: Any, vocab_size: int) -> Any:
    from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask

    if matcher.is_error():
        raise ModelError(f"guided decoding failed: {matcher.get_error()}")
    bitmask = allocate_token_bitmask(1, vocab_size)
    fill_next_token_bitmask(matcher, bitmask)
    return unpack_bitmask(bitmask[0], vocab_size)


@dataclasses.dataclass
class Scan:
    """Where the turn's text stands: before the open tag (the thought), in a JSON string."""

    open_tag: str
    tail: str = ""  # the last characters before the open tag is complete
    in_call: bool = False
    in_string: bool = False
    escape: bool = False

    def feed(self, text: str) -> None:
        """Advance over the text of one token."""
        for char in text:
            if not self.in_call:
                self.tail = (self.tail + char)[-len(self.open_tag) :]
                self.in_call = self.tail == self.open_tag
            elif self.escape:
                self.escape = False
            elif self.in_string:
                if char == "\\":
                    self.escape = True
                elif char == '"':
                    self.in_string = False
            elif char == '"':
                self.in_string = True


class ClosingPlanner:
    """Works out a short way to finish a call (see the module's docstring)."""

    def __init__(self, tokenizer: Any, end_of_turn: int, open_tag: str, tag_id: int | None):
        self.tokenizer = tokenizer
        self.end_of_turn = end_of_turn
        self.open_tag = open_tag
        self._texts: dict[int, str] = {}
        self.tag_start = tag_id if tag_id is not None else self._first(open_tag)
        self.newline = self._single("\n")
        self.quote = self._single('"')
        # Outside strings: close, else the next element, else open the shortest value.
        closers = ("}", "]", ",", '"', "0")
        self.outside = [t for t in map(self._single, closers) if t is not None]

    def _first(self, text: str) -> int | None:
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        return int(ids[0]) if ids else None

    def _single(self, text: str) -> int | None:
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        return int(ids[0]) if len(ids) == 1 else None

    def text(self, token: int) -> str:
        """The text of one token (special tokens spelled out), cached."""
        text = self._texts.get(token)
        if text is None:
            text = self._texts[token] = self.tokenizer.decode([token])
        return text

    def scan(self, ids: Sequence[int] = ()) -> Scan:
        """A :class:`Scan` of a turn that has generated ``ids``."""
        scan = Scan(self.open_tag)
        for token in ids:
            scan.feed(self.text(token))
        return scan

    def path(self, matcher: Any, scan: Scan, vocab_size: int) -> list[int] | None:
        """The tokens that finish the call from this state, end of turn included (None:
        longer than :data:`MAX_CLOSING`, or the grammar refuses the way)."""
        matcher, scan = matcher.deep_copy(), dataclasses.replace(scan)
        path: list[int] = []
        while not matcher.is_stopped():
            if len(path) >= MAX_CLOSING:
                return None
            forced = matcher.compute_ff_tokens()
            token = forced[0] if forced else self._choose(_mask_of(matcher, vocab_size), scan)
            if not matcher.consume_token(token):
                return None
            scan.feed(self.text(token))
            path.append(token)
            if token == self.end_of_turn:
                return path
        # The grammar is complete: the end-of-turn token (the only one it allows) ends the turn.
        return [*path, self.end_of_turn]

    def path_after(self, matcher: Any, scan: Scan, vocab_size: int, token: int) -> list[int] | None:
        """:meth:`path` after ``token`` (None if the grammar refuses it)."""
        after = matcher.deep_copy()
        if not after.consume_token(token):
            return None
        moved = dataclasses.replace(scan)
        moved.feed(self.text(token))
        return self.path(after, moved, vocab_size)

    def _choose(self, allowed: Any, scan: Scan) -> int:
        import numpy as np

        preferred: list[int | None] = [self.end_of_turn]
        if not scan.in_call:  # the thought ends with a newline, then the open tag
            at_line_start = scan.tail == "" or scan.tail.endswith("\n")
            preferred.append(self.tag_start if at_line_start else self.newline)
        elif scan.in_string and not scan.escape:
            preferred.append(self.quote)
        elif not scan.in_string:
            preferred.extend(self.outside)
        for token in preferred:
            if token is not None and token < len(allowed) and allowed[token]:
                return token
        ids = np.flatnonzero(allowed)
        if not len(ids):
            raise ModelError("guided decoding: the grammar allows no token at this step")
        return int(ids[0])


class GuidedTurn:
    """One turn's grammar state: the allowed-token mask per step, advanced by each token."""

    def __init__(
        self,
        matcher: Any,
        vocab_size: int,
        end_of_turn: int,
        planner: ClosingPlanner | None = None,
        prefix: Sequence[int] = (),
    ) -> None:
        self.matcher = matcher
        self.vocab_size = vocab_size
        #: The only token that ends the turn (the chat template's end of turn).
        self.end_of_turn = end_of_turn
        #: Works out how to close the call within the budget (None: no budget applied).
        self.planner = planner
        self.scan = planner.scan(prefix) if planner is not None else None
        #: The mask applied at each step (numpy bool arrays), for the log-probs afterwards.
        self.masks: list[Any] = []

    def allowed(self, scores: Any = None, remaining: int | None = None) -> Any:
        """A numpy bool array over the vocabulary: the tokens allowed next.

        With ``remaining`` (tokens this turn may still generate, this one included) and the
        step's ``scores``, only tokens after which the call can still close in time.
        """
        mask = _mask_of(self.matcher, self.vocab_size)
        if remaining is not None and self.planner is not None and self.scan is not None:
            mask = self._within_budget(mask, scores, remaining)
        self.masks.append(mask)
        return mask

    def closing_path(self) -> list[int] | None:
        """A short way to finish the call from here, end of turn included (see
        :class:`ClosingPlanner`)."""
        if self.planner is None or self.scan is None:
            return None
        return self.planner.path(self.matcher, self.scan, self.vocab_size)

    def _within_budget(self, mask: Any, scores: Any, remaining: int) -> Any:
        import numpy as np

        assert self.planner is not None and self.scan is not None
        path = self.closing_path()
        if path is None:
            return mask
        if len(path) >= remaining:  # close now: only the path's next token
            only = np.zeros_like(mask)
            only[path[0]] = True
            return only
        if remaining - len(path) > WINDOW:
            return mask  # room enough: anything the grammar allows
        keep = np.zeros_like(mask)
        keep[path[0]] = True
        for token in self._likeliest(mask, scores):
            if token != path[0]:
                after = self.planner.path_after(self.matcher, self.scan, self.vocab_size, token)
                keep[token] = after is not None and 1 + len(after) <= remaining
        return keep

    def _likeliest(self, mask: Any, scores: Any) -> list[int]:
        import numpy as np

        if scores is None:
            return []
        values = scores[0].detach().float().cpu().numpy()
        width = min(len(values), len(mask))
        masked = np.where(mask[:width], values[:width], -np.inf)
        count = min(CANDIDATES, int(mask[:width].sum()))
        if count <= 0:
            return []
        top = np.argpartition(-masked, count - 1)[:count]
        return [int(t) for t in top[np.argsort(-masked[top])] if np.isfinite(masked[t])]

    def advance(self, token: int) -> None:
        """Feed the token sampled at the last step."""
        if not self.matcher.consume_token(int(token)):
            raise ModelError(
                f"guided decoding: token {token} was sampled outside the grammar "
                f"({self.matcher.get_error()})"
            )
        if self.planner is not None and self.scan is not None:
            self.scan.feed(self.planner.text(int(token)))


class GuidedLogitsProcessor:
    """A ``transformers`` logits processor that masks what ``turn`` does not allow.

    With ``budget`` (``generate()``'s ``max_new_tokens``) the turn closes its call in time.
    """

    def __init__(self, turn: GuidedTurn, prompt_length: int, budget: int | None = None) -> None:
        self.turn = turn
        self.prompt_length = prompt_length
        self.budget = budget

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        """Feed the last sampled token, then set every disallowed logit to -inf."""
        if input_ids.shape[0] != 1:
            raise ModelError("guided decoding generates one sequence at a time")
        generated = input_ids.shape[1] - self.prompt_length
        if generated > 0:
            self.turn.advance(int(input_ids[0, -1]))
        remaining = None if self.budget is None else self.budget - generated
        return mask_scores(scores, self.turn.allowed(scores, remaining))


def mask_scores(scores: Any, allowed: Any) -> Any:
    """``scores`` (a 1 x width tensor) with -inf wherever ``allowed`` (numpy bools) is False.

    The model's logits may be wider than the tokenizer's vocabulary (padded embedding
    rows): those ids are never allowed. Narrower logits that would drop an allowed id
    are an error, never a silent cut.
    """
    import numpy as np
    import torch

    width = scores.shape[-1]
    if width > allowed.shape[0]:  # padded embedding rows are never allowed
        allowed = np.concatenate([allowed, np.zeros(width - allowed.shape[0], dtype=bool)])
    elif width < allowed.shape[0]:
        if allowed[width:].any():
            raise ModelError(
                f"guided decoding: the model has {width} logits but the grammar allows token "
                f"ids up to {int(np.flatnonzero(allowed)[-1])} (tokenizer and model differ)"
            )
        allowed = allowed[:width]
    if not allowed.any():
        raise ModelError("guided decoding: the grammar allows no token at this step")
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
