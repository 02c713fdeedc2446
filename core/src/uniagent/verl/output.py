"""An :class:`~uniagent.episode.EpisodeResult` as the fields of verl's ``AgentLoopOutput``.

Pure Python (no verl import) so the conversion is testable on its own. Rules:

- ids, mask and log-probs are cut to ``prompt_length`` / ``response_length`` here, aligned
  one to one (verl 0.9.1 pads but never truncates);
- a masked trajectory (``traj_masked``: the exit policy says so, the prompt had to be cut,
  or log-probs were asked for but the server gave none) keeps its ids with an all-zero mask;
- log-probs are a list exactly when verl asked for them (``calculate_log_probs``), so every
  sample of a batch agrees; tokens the model did not generate carry 0.0 under mask 0;
- the response is never empty: an episode that produced no response gets one end-of-turn
  token with mask 0, so verl's reward position (last valid token) exists;
- ``extra_fields`` hold only keys verl gives every agent loop's output (:data:`EXTRA_FIELD_KEYS`:
  ``turn_scores``, ``tool_rewards``, ``min_global_steps``, ``max_global_steps``, ``extras``),
  so a batch mixing uniagent rows with any other verl loop's rows concatenates in any order
  and worker split; everything uniagent reports sits in one structured field,
  ``extras["uniagent"]`` (:data:`UNIAGENT_FIELDS`). The agent loop adds what verl's own loops
  carry besides (the server's extra fields, ``reward_extra_info``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from uniagent.episode import EpisodeResult
from uniagent.exit import ExitReason
from uniagent.gateway.tree import Sample
from uniagent.interaction.metrics import EpisodeMetrics
from uniagent.protect.report import integrity_flags
from uniagent.rubric import component_scores
from uniagent.verl.credit import token_scores

log = logging.getLogger(__name__)

#: The keys of ``AgentLoopOutput.extra_fields`` (they land in ``non_tensor_batch``): exactly
#: the ones verl 0.9.1's ``AgentLoopWorker._postprocess`` defaults for every loop's output.
EXTRA_FIELD_KEYS: tuple[str, ...] = (
    "turn_scores",
    "tool_rewards",
    "min_global_steps",
    "max_global_steps",
    "extras",
)
#: ``extra_fields["extras"]`` is ``{UNIAGENT_KEY: {...}}`` for uniagent rows (other loops: None).
UNIAGENT_KEY = "uniagent"
#: The keys of ``extras["uniagent"]``.
UNIAGENT_FIELDS: tuple[str, ...] = (
    "exit_reason",
    "traj_masked",
    "turns",
    "tool_calls",
    "format_errors",
    "syntax_errors",
    "timeouts",
    "setup_seconds",
    "model_seconds",
    "env_seconds",
    "reward_seconds",
    "truncated",
    "error",
    "reward_components",
    "token_scores",
    "integrity",
    "branch",
    "branches",
)
_ERROR_CHARS = 2000


@dataclass
class LoopFields:
    """The keyword arguments of verl's ``AgentLoopOutput`` (``metrics`` as a plain dict)."""

    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_logprobs: list[float] | None
    reward_score: float | None
    num_turns: int
    metrics: dict[str, float | int]
    extra_fields: dict[str, Any] = field(default_factory=dict)

    def check(self) -> None:
        """Raise ``ValueError`` unless ids, mask and log-probs line up."""
        n = len(self.response_ids)
        if n == 0 or len(self.response_mask) != n:
            raise ValueError(f"response of {n} ids with {len(self.response_mask)} mask entries")
        if self.response_logprobs is not None and len(self.response_logprobs) != n:
            raise ValueError(f"{len(self.response_logprobs)} log-probs for {n} response ids")


def _extra(
    result: EpisodeResult | None,
    *,
    exit_reason: ExitReason,
    traj_masked: bool,
    truncated: bool,
    error: str | None,
    token_scores: list[list[float]] | None = None,
    branch: int = 0,
    branches: int = 1,
) -> dict[str, Any]:
    metrics = result.metrics if result is not None else EpisodeMetrics()
    record = {
        "exit_reason": exit_reason.value,
        "traj_masked": bool(traj_masked),
        "turns": metrics.turns,
        "tool_calls": dict(metrics.tool_calls),
        "format_errors": metrics.format_errors,
        "syntax_errors": metrics.syntax_errors,
        "timeouts": metrics.timeouts,
        "setup_seconds": metrics.setup_seconds,
        "model_seconds": metrics.model_seconds,
        "env_seconds": metrics.env_seconds,
        "reward_seconds": metrics.reward_seconds,
        "truncated": bool(truncated),
        "error": error[-_ERROR_CHARS:] if error else None,
        # a rubric's scores, every component's and metric's ({} for one reward or masked)
        "reward_components": {}
        if result is None or traj_masked
        else component_scores(result.reward_info),
        # what reward.credit adds to rm_scores: [[position in the response, score], ...]
        "token_scores": list(token_scores or []),
        "integrity": integrity_flags(result.reward_info if result is not None else None),
        # which of the episode's samples this is (one per branch of a harness's tree; the
        # last-served branch is the last, branches - 1) and how many the episode gave
        "branch": branch,
        "branches": branches,
    }
    turns = metrics.turns
    return {
        # the reward's score of each model turn (RewardResult.turn_scores), [] without any
        "turn_scores": [float(result.turn_scores.get(t, 0.0)) for t in range(turns)]
        if result is not None and result.turn_scores and not traj_masked
        else [],
        "tool_rewards": [],
        "min_global_steps": None,  # filled by the agent loop from the server's outputs
        "max_global_steps": None,
        "extras": {UNIAGENT_KEY: record},
    }


def extras_record(extras: Any) -> dict[str, Any] | None:
    """The uniagent record in one value of the batch's ``extras`` column (None: another loop's)."""
    if not isinstance(extras, Mapping):
        return None
    record = extras.get(UNIAGENT_KEY)
    return dict(record) if isinstance(record, Mapping) else None


def _loop_metrics(metrics: EpisodeMetrics | None) -> dict[str, float | int]:
    if metrics is None:
        return {"generate_sequences": 0.0, "tool_calls": 0.0}
    return {"generate_sequences": metrics.model_seconds, "tool_calls": metrics.env_seconds}


def episode_fields(
    result: EpisodeResult,
    *,
    prompt_length: int,
    response_length: int,
    want_logprobs: bool,
    reward_configured: bool,
    end_token_id: int,
    num_prompt_messages: int = 2,
    credit: str = "outcome",
    gamma: float = 1.0,
) -> LoopFields:
    """Convert a finished episode; one without token ids becomes :func:`placeholder_fields`.

    ``credit`` and ``gamma`` (``reward.credit``, ``reward.gamma``) say what each model
    turn's last generated token gets besides the episode's reward (:mod:`.credit`).
    """
    cache = result.cache
    if cache is None or cache.mode != "tokens":
        return placeholder_fields(
            prompt_ids=[end_token_id],
            prompt_length=prompt_length,
            want_logprobs=want_logprobs,
            reward_configured=reward_configured,
            end_token_id=end_token_id,
            exit_reason=result.exit_reason,
            error=result.error,
            result=result,
        )
    cut = cache.truncated(prompt_length, response_length, prompt_truncation="left")
    masked = result.traj_masked
    error = result.error
    if cut.prompt_truncated:
        log.warning(
            "prompt of %d tokens cut to prompt_length=%d: trajectory masked (raise "
            "prompt_length: it must hold the system prompt, the tool schemas and the task)",
            len(cache.prompt_ids),
            prompt_length,
        )
        masked = True
        error = error or f"prompt longer than prompt_length={prompt_length}: masked"
    ids, mask = list(cut.response_ids), list(cut.response_mask)
    logprobs = list(cut.response_logprobs) if cut.response_logprobs is not None else None
    if want_logprobs and logprobs is None:
        if any(mask):
            log.warning("verl asked for log-probs but the server returned none: trajectory masked")
            masked = True
            error = error or "the server returned no log-probs: masked"
        logprobs = [0.0] * len(ids)
    elif not want_logprobs:
        logprobs = None
    if not ids:  # no response at all: one end-of-turn token that nobody trains on
        ids, mask = [end_token_id], [0]
        logprobs = [0.0] if logprobs is not None else None
    if masked:
        mask = [0] * len(ids)
    if reward_configured:
        reward: float | None = 0.0 if masked or result.reward is None else float(result.reward)
    else:
        reward = None
    messages = cache.messages
    fields = LoopFields(
        prompt_ids=list(cut.prompt_ids),
        response_ids=ids,
        response_mask=mask,
        response_logprobs=logprobs,
        reward_score=reward,
        num_turns=max(1, len(messages) - num_prompt_messages + 1),
        metrics=_loop_metrics(result.metrics),
        extra_fields=_extra(
            result,
            exit_reason=result.exit_reason,
            traj_masked=masked,
            truncated=cut.truncated,
            error=error,
            token_scores=[]
            if masked or reward is None
            else token_scores(
                cache,
                result.turn_scores,
                mode=credit,
                gamma=gamma,
                response_length=len(ids),
            ),
        ),
    )
    fields.check()
    return fields


def branch_fields(
    result: EpisodeResult,
    sample: Sample,
    *,
    branch: int,
    branches: int,
    prompt_length: int,
    response_length: int,
    want_logprobs: bool,
    reward_configured: bool,
    end_token_id: int,
) -> LoopFields:
    """One branch of a trained (unmasked) harness episode as a sample: cut as
    :func:`episode_fields` cuts (a prompt over ``prompt_length`` masks the sample), the
    episode's reward, outcome credit only (``reward.credit`` per turn applies to one-branch
    episodes)."""
    masked = False
    error = result.error
    prompt = list(sample.prompt_ids)
    if len(prompt) > prompt_length:
        log.warning(
            "branch %d: prompt of %d tokens cut to prompt_length=%d: sample masked",
            branch,
            len(prompt),
            prompt_length,
        )
        prompt, masked = prompt[-prompt_length:], True
        error = error or f"prompt longer than prompt_length={prompt_length}: masked"
    ids = list(sample.response_ids[:response_length])
    mask = list(sample.response_mask[:response_length])
    logprobs: list[float] | None = list(sample.response_logprobs[:response_length])
    truncated = len(sample.response_ids) > response_length
    if not ids:
        ids, mask, logprobs = [end_token_id], [0], [0.0]
    if masked:
        mask = [0] * len(ids)
    if not want_logprobs:
        logprobs = None
    reward: float | None = None
    if reward_configured:
        reward = 0.0 if masked or result.reward is None else float(result.reward)
    fields = LoopFields(
        prompt_ids=prompt or [end_token_id],
        response_ids=ids,
        response_mask=mask,
        response_logprobs=logprobs,
        reward_score=reward,
        num_turns=max(1, sample.turns),
        metrics=_loop_metrics(result.metrics),
        extra_fields=_extra(
            result,
            exit_reason=result.exit_reason,
            traj_masked=masked,
            truncated=truncated,
            error=error,
            branch=branch,
            branches=branches,
        ),
    )
    fields.check()
    return fields


def placeholder_fields(
    *,
    prompt_ids: Sequence[int],
    prompt_length: int,
    want_logprobs: bool,
    reward_configured: bool,
    end_token_id: int,
    exit_reason: ExitReason = ExitReason.UNKNOWN_ERROR,
    error: str | None = None,
    result: EpisodeResult | None = None,
) -> LoopFields:
    """A masked stand-in for an episode that produced nothing trainable.

    One end-of-turn token with mask 0 (log-prob 0.0 only when verl wants log-probs, so the
    batch stays aligned; no token under mask 1 gets an invented log-prob); reward 0.0 when
    the agent computes rewards, else None like every other sample of the batch.
    """
    prompt = list(prompt_ids)[-prompt_length:] if prompt_length > 0 else []
    fields = LoopFields(
        prompt_ids=prompt or [end_token_id],
        response_ids=[end_token_id],
        response_mask=[0],
        response_logprobs=[0.0] if want_logprobs else None,
        reward_score=0.0 if reward_configured else None,
        num_turns=1,
        metrics=_loop_metrics(result.metrics if result is not None else None),
        extra_fields=_extra(
            result, exit_reason=exit_reason, traj_masked=True, truncated=False, error=error
        ),
    )
    fields.check()
    return fields


def as_kwargs(fields: LoopFields) -> Mapping[str, Any]:
    """The fields as keyword arguments (``metrics`` still a dict)."""
    return {
        "prompt_ids": fields.prompt_ids,
        "response_ids": fields.response_ids,
        "response_mask": fields.response_mask,
        "response_logprobs": fields.response_logprobs,
        "reward_score": fields.reward_score,
        "num_turns": fields.num_turns,
        "metrics": fields.metrics,
        "extra_fields": fields.extra_fields,
    }
