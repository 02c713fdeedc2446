"""The ``search_qa`` reward: the ``finish`` answer against the task's gold answers.

Only the submission text is graded (the output of the finishing tool), never the
sandbox or the conversation, so nothing the agent does in its session changes the
score except the answer it gives. Scores: normalised exact match or token F1 (max
over the task's aliases, :mod:`uniagent_tools_search.qa`), optionally thresholded,
optionally checked by an LLM judge (:mod:`uniagent_tools_search.judge`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from uniagent import RewardContext, RewardInfraError, RewardResult

from uniagent_tools_search.errors import SearchError
from uniagent_tools_search.judge import JudgeSettings, ask_judge, judge_prompt
from uniagent_tools_search.qa import as_aliases, normalize_answer, score_answer


class SearchQARewardConfig(BaseModel):
    """Settings of the ``search_qa`` reward (``reward.settings``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    answers_field: str = Field("answers", description="task field: gold answer or aliases")
    question_field: str = Field("question", description="task field: the question (judge)")
    metric: Literal["em", "f1"] = Field("em", description="exact match or token F1")
    threshold: float | None = Field(
        None,
        gt=0,
        le=1,
        description="score 1.0 when the metric reaches it, else 0.0 (null: the metric itself)",
    )
    fold_accents: bool = Field(True, description="compare Brasília and Brasilia as equal")
    max_answer_chars: int = Field(
        1000, ge=1, description="a longer answer scores 0 (no credit for pasting documents)"
    )
    check_service_url: str | None = Field(
        None,
        description="the search service's URL (as in UNIAGENT_SEARCH_URL): it must answer at "
        "grading time, else the episode is a reward_error (masked), not a wrong answer",
    )
    judge: JudgeSettings | None = Field(None, description="optional LLM judge")


async def _check_service(url: str) -> None:
    import aiohttp

    from uniagent_tools_search.client import SearchClient

    try:
        async with SearchClient(url, timeout=15) as client:
            await client.health()
    except (SearchError, aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
        raise RewardInfraError(
            f"the search service at {url} does not answer at grading time ({exc}); the "
            "episode's searches may have failed for reasons that are not the agent's"
        ) from None


async def search_qa_reward(ctx: RewardContext) -> RewardResult:
    """Grade ``ctx.submission`` (the ``finish`` answer) against the task's answers."""
    config = (
        ctx.settings if isinstance(ctx.settings, SearchQARewardConfig) else SearchQARewardConfig()
    )
    try:
        aliases = as_aliases(ctx.task.get(config.answers_field))
    except (TypeError, ValueError) as exc:  # the task row is broken, not the answer
        raise RewardInfraError(
            f"search_qa: task field {config.answers_field!r}: {exc} (set "
            "reward.settings.answers_field to the field holding the gold answers)"
        ) from None
    if config.check_service_url:
        await _check_service(config.check_service_url)
    info: dict[str, object] = {"answers": aliases, "metric": config.metric}
    if ctx.submission is None:
        reason = ctx.exit_reason.value if ctx.exit_reason is not None else "no exit reason"
        info["reason"] = f"no answer: the episode ended with {reason}"
        return RewardResult(0.0, info)
    prediction = ctx.submission.strip()
    info["prediction"] = prediction[: config.max_answer_chars]
    if len(prediction) > config.max_answer_chars:
        info["reason"] = f"the answer is longer than {config.max_answer_chars} characters"
        return RewardResult(0.0, info)
    scored = score_answer(prediction, aliases, fold_accents=config.fold_accents)
    value = scored.exact_match if config.metric == "em" else scored.f1
    score = value if config.threshold is None else float(value >= config.threshold)
    info.update(
        normalized_prediction=normalize_answer(prediction, fold_accents=config.fold_accents),
        exact_match=scored.exact_match,
        f1=round(scored.f1, 4),
        best_alias=scored.best_em_alias if scored.exact_match else scored.best_f1_alias,
        threshold=config.threshold,
    )
    judge = config.judge
    if judge is not None and (judge.use == "always" or score < 1.0):
        question = str(ctx.task.get(config.question_field) or "")
        verdict = await ask_judge(judge, judge_prompt(judge, question, aliases, prediction))
        info["judge"] = verdict
        judged = 1.0 if verdict["correct"] else 0.0
        score = judged if judge.use == "always" else max(score, judged)
    return RewardResult(score, info)
