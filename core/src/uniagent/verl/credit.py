"""Per-turn credit in verl's ``rm_scores`` (``reward.credit``), pure Python (no verl import).

verl 0.9.1 puts an agent loop's one ``reward_score`` on the last token of the response.
With ``credit: turn`` each model turn's score (``RewardResult.turn_scores``) is added on
that turn's last generated token; with ``credit: discounted`` that token holds the
discounted return of the turn scores from that turn on, ``G_t = s_t + gamma * G_{t+1}``.
The episode's reward stays on the last token in every mode.

The adapter writes the additions into the row's uniagent record (``token_scores``:
``[[position, score], ...]`` in response coordinates) and
:func:`uniagent.verl.metrics.place_token_scores` adds them to a batch's ``rm_scores``; a
turn cut off by ``response_length`` gets nothing.
"""

from __future__ import annotations

from collections.abc import Mapping

from uniagent.rollout.cache import Rollout


def turn_ends(cache: Rollout) -> list[int | None]:
    """Each model turn's last generated token, as a position in the response (``None``:
    the turn generated nothing the mask trains on)."""
    starts = list(cache.turn_context_lengths)
    prompt = len(cache.prompt_ids)
    mask = cache.response_mask
    total = prompt + len(mask)
    ends: list[int | None] = []
    for i, start in enumerate(starts):
        stop = starts[i + 1] if i + 1 < len(starts) else total
        last = None
        for position in range(max(start, prompt), stop):
            if mask[position - prompt]:
                last = position - prompt
        ends.append(last)
    return ends


def credits(turn_scores: Mapping[int, float], turns: int, mode: str, gamma: float) -> list[float]:
    """What each of ``turns`` model turns is credited under ``mode`` (all 0.0 for outcome)."""
    scores = [float(turn_scores.get(t, 0.0)) for t in range(turns)]
    if mode == "turn":
        return scores
    if mode == "discounted":
        out, ahead = [0.0] * turns, 0.0
        for t in reversed(range(turns)):
            ahead = scores[t] + gamma * ahead
            out[t] = ahead
        return out
    return [0.0] * turns


def token_scores(
    cache: Rollout,
    turn_scores: Mapping[int, float],
    *,
    mode: str,
    gamma: float,
    response_length: int,
) -> list[list[float]]:
    """``[[position, score], ...]``: the additions to the row's ``rm_scores`` (no zeros)."""
    if mode == "outcome" or not turn_scores:
        return []
    ends = turn_ends(cache)
    out: list[list[float]] = []
    for end, value in zip(ends, credits(turn_scores, len(ends), mode, gamma), strict=True):
        if end is not None and end < response_length and value != 0.0:
            out.append([end, value])
    return out
