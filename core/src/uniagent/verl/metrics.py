"""Agent metrics (``agent/...``) from a batch's ``extras`` column, for verl's per-step metrics.

:func:`agent_metrics` turns the uniagent records of a batch (``extras["uniagent"]``; rows
of other agent loops are skipped) into flat numbers:

- ``agent/samples``: uniagent samples in the batch;
- ``agent/exit_reason/<reason>``: the share of samples that ended so, for every exit reason;
- ``agent/masked_share``, ``agent/truncated_share``, ``agent/failed_share`` (the adapter or
  the episode reported an error);
- ``agent/turns/{mean,max,min}``;
- ``agent/{format_errors,syntax_errors,timeouts}/{mean,per_turn,share}``: per sample, per
  model turn, and the share of samples with at least one;
- ``agent/tool_calls/mean`` and ``agent/tool_calls/<tool>/mean``: calls per sample;
- ``agent/time/{setup,model,env,reward}/{mean,max,share}``: seconds per sample, and the
  phase's share of the time all samples took;
- ``agent/reward/<key>/mean``: a rubric's component and metric scores (zero-weight metrics
  included: logged, not trained on), over the unmasked samples that have them.
- ``integrity/tampered``, ``integrity/tampered/<kind>`` and ``integrity/tampered/<class>``
  (every kind and attack class, each step: ``artifacts``, ``test_env``, ``plugin_config``,
  ``patch_screen``, ``outside_paths``, ``self_masking``, ``task_files``,
  ``status_channel``), and
  ``integrity/rule/<rule>``, ``integrity/score_reason/<reason>`` (those seen): the share of
  samples whose grading reported it (:mod:`uniagent.protect.report`), so that a run shows
  when its policy starts probing the grader.

How they reach verl's logs (both are verl extension points, set in the recipe):

- v1 trainer (``trainer.use_v1=True``, ``main_ppo``'s default): the replay buffer's
  ``sample()`` returns metrics that verl adds to the step's; set
  ``trainer.v1.sampler.custom_sampler.path=pkg://uniagent.verl.replay_buffer`` and
  ``...custom_sampler.name=UniAgentReplayBuffer`` (verl's own buffer plus these metrics);
- classic trainers (``trainer.use_v1=False``, one-step-off): set
  ``actor_rollout_ref.rollout.agent.agent_loop_manager_class=uniagent.verl.metrics.UniAgentLoopManager``;
  verl logs the manager's ``timing`` dict, so the keys appear as ``timing_s/agent/...``;
- the fully async trainer: run ``python -m uniagent.verl.fully_async`` in place of verl's
  ``fully_async_main`` (see :mod:`uniagent.verl.fully_async`); the keys are ``agent/...``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from statistics import fmean
from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopManager
from verl.protocol import DataProto
from verl.utils.ray_utils import auto_await

from uniagent.exit import ExitReason
from uniagent.protect.report import integrity_metrics
from uniagent.verl.output import extras_record

PREFIX = "agent"
_ERROR_COUNTS = ("format_errors", "syntax_errors", "timeouts")
_PHASES = ("setup", "model", "env", "reward")


def agent_metrics(extras: Iterable[Any], prefix: str = PREFIX) -> dict[str, float]:
    """The ``agent/...`` metrics of one batch's ``extras`` values ({} without uniagent rows)."""
    records = [r for r in (extras_record(e) for e in extras) if r is not None]
    if not records:
        return {}
    n = len(records)
    out: dict[str, float] = {f"{prefix}/samples": float(n)}
    reasons = Counter(str(r.get("exit_reason")) for r in records)
    known = [reason.value for reason in ExitReason]
    for reason in known + sorted(set(reasons) - set(known)):
        out[f"{prefix}/exit_reason/{reason}"] = reasons[reason] / n
    out[f"{prefix}/masked_share"] = _share(bool(r.get("traj_masked")) for r in records)
    out[f"{prefix}/truncated_share"] = _share(bool(r.get("truncated")) for r in records)
    out[f"{prefix}/failed_share"] = _share(bool(r.get("error")) for r in records)

    turns = [_number(r.get("turns")) for r in records]
    out[f"{prefix}/turns/mean"] = fmean(turns)
    out[f"{prefix}/turns/max"] = max(turns)
    out[f"{prefix}/turns/min"] = min(turns)
    for kind in _ERROR_COUNTS:
        counts = [_number(r.get(kind)) for r in records]
        out[f"{prefix}/{kind}/mean"] = fmean(counts)
        out[f"{prefix}/{kind}/per_turn"] = sum(counts) / sum(turns) if sum(turns) else 0.0
        out[f"{prefix}/{kind}/share"] = _share(c > 0 for c in counts)

    calls: list[dict[str, Any]] = [
        c if isinstance(c := r.get("tool_calls"), dict) else {} for r in records
    ]
    out[f"{prefix}/tool_calls/mean"] = fmean(sum(map(_number, c.values())) for c in calls)
    for tool in sorted({name for c in calls for name in c}):
        out[f"{prefix}/tool_calls/{tool}/mean"] = fmean(_number(c.get(tool)) for c in calls)

    seconds = {phase: [_number(r.get(f"{phase}_seconds")) for r in records] for phase in _PHASES}
    total = sum(sum(values) for values in seconds.values())
    for phase, values in seconds.items():
        out[f"{prefix}/time/{phase}/mean"] = fmean(values)
        out[f"{prefix}/time/{phase}/max"] = max(values)
        out[f"{prefix}/time/{phase}/share"] = sum(values) / total if total else 0.0
    components: dict[str, list[float]] = {}
    for r in records:
        scores = r.get("reward_components")
        for key, score in (scores if isinstance(scores, dict) else {}).items():
            components.setdefault(str(key), []).append(_number(score))
    for key, values in sorted(components.items()):
        out[f"{prefix}/reward/{key}/mean"] = fmean(values)
    out.update(integrity_metrics(records))
    return out


def batch_agent_metrics(batch: DataProto) -> dict[str, float]:
    """:func:`agent_metrics` of a verl batch (its ``extras`` column; {} without one)."""
    extras = batch.non_tensor_batch.get("extras")
    return agent_metrics(extras.tolist() if extras is not None else [])


#: ``meta_info`` flag of a batch whose token scores were placed.
PLACED = "uniagent_token_scores_placed"


def place_token_scores(batch: Any) -> int:
    """Add every uniagent row's ``token_scores`` to the batch's ``rm_scores``, in place.

    ``batch`` is a verl ``DataProto`` (its ``rm_scores`` right-padded like ``responses``);
    returns how many scores were placed. Rows of other agent loops are left as they are.
    """
    extras = batch.non_tensor_batch.get("extras")
    if extras is None or "rm_scores" not in batch.batch:
        return 0
    if batch.meta_info.get(PLACED):  # once per batch: a second call would add them again
        return 0
    batch.meta_info[PLACED] = True
    rm_scores = batch.batch["rm_scores"]
    placed = 0
    for row, value in enumerate(extras.tolist()):
        record = extras_record(value) or {}
        pairs: list[Any] = record.get("token_scores") or []
        for position, score in pairs:
            rm_scores[row, int(position)] += float(score)
            placed += 1
    return placed


class UniAgentLoopManager(AgentLoopManager):
    """verl's ``AgentLoopManager`` whose ``timing`` output also holds the agent metrics, and
    whose ``rm_scores`` get each turn's credit (``reward.credit``, :mod:`uniagent.verl.credit`).

    For verl's classic trainers (``agent_loop_manager_class``): they log the manager's
    ``meta_info["timing"]`` with a ``timing_s/`` prefix.
    """

    @auto_await
    async def generate_sequences(self, prompts: DataProto) -> DataProto:
        """verl's ``generate_sequences``, then the batch's agent metrics in its timing."""
        output: DataProto = await super().generate_sequences(prompts)
        place_token_scores(output)
        output.meta_info.setdefault("timing", {}).update(batch_agent_metrics(output))
        return output


def _share(flags: Iterable[bool]) -> float:
    values = [1.0 if flag else 0.0 for flag in flags]
    return fmean(values) if values else 0.0


def _number(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return 0.0
