"""The plugin's ``uniagent`` entry point: it contributes the ``{{ cookiecutter.__record_name }}`` reward.

A reward is an async function awaited when an episode ends: it gets a
:class:`uniagent.reward.RewardContext` (a grading ``sandbox`` of clean shells
the agent never touched, the ``task`` row, its validated ``config``, the
conversation, the exit reason and the submission) and returns a
:class:`uniagent.reward.RewardResult` (or a plain float). The example reads the
file the agent wrote its answer to and compares it with the task's answer.

Raise :class:`uniagent.reward.RewardInfraError` for what is not the agent's
doing (a malformed task row): ``reward_error``, masked from training. A wrong
answer is a score of 0.0, never an exception.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterator

from pydantic import BaseModel, ConfigDict, Field
from uniagent import RewardContext, RewardInfraError, RewardResult, RewardSpec, hookimpl


class {{ cookiecutter.__class_name }}Config(BaseModel):
    """Settings, from ``reward.settings`` in the agent config."""

    model_config = ConfigDict(extra="forbid")

    path: str = Field("answer.txt", description="file the agent writes its answer to")
    task_field: str = Field("answer", description="task field holding the expected answer")
    timeout: float = Field(60.0, gt=0, description="seconds reading the file may take")
    turn_bonus: float = Field(0.0, description="per-turn score of the answering turn")


async def {{ cookiecutter.__record_name }}_reward(
    ctx: RewardContext[{{ cookiecutter.__class_name }}Config],
) -> RewardResult:
    """1.0 when the answer file in the work dir holds the task's answer, else 0.0."""
    config = ctx.settings
    if config.task_field not in ctx.task:
        raise RewardInfraError(
            f"the {{ cookiecutter.__record_name }} reward needs the expected answer in each task's "
            f"{config.task_field!r} field; this task has: {', '.join(sorted(ctx.task))}"
        )
    expected = str(ctx.task[config.task_field]).strip()
    done = await ctx.require_sandbox().run(
        f"cat -- {shlex.quote(config.path)}", timeout=config.timeout
    )
    if done.exit_code != 0:  # no such file: the agent gave no answer
        return RewardResult(score=0.0, info={"path": config.path, "missing": True})
    found = done.output.strip()
    score = 1.0 if found == expected else 0.0
    # Per-turn credit (optional): {model turn index from 0: score}. Here the last model
    # turn, which ended the episode, gets `turn_bonus` for a right answer; with
    # `reward.credit: turn` verl puts it on that turn's last generated token.
    turns = sum(1 for m in ctx.messages if m.get("role") == "assistant")
    turn_scores = {turns - 1: config.turn_bonus} if score and turns and config.turn_bonus else {}
    return RewardResult(
        score=score,
        info={"path": config.path, "expected": expected, "found": found[:500]},
        turn_scores=turn_scores,
    )


@hookimpl
def uniagent_rewards() -> Iterator[RewardSpec]:
    """The ``{{ cookiecutter.__record_name }}`` reward."""
    yield RewardSpec(
        name="{{ cookiecutter.__record_name }}",
        fn={{ cookiecutter.__record_name }}_reward,
        settings={{ cookiecutter.__class_name }}Config,
        description="1.0 when the agent's answer file holds the task's answer",
    )
