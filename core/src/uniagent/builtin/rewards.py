"""Built-in rewards: ``command`` scores 1.0 when a test command exits 0 in the grading sandbox;
``llm_judge`` asks an OpenAI-compatible endpoint to grade the submission."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from uniagent.builtin.judge import JudgeSettings, llm_judge_reward
from uniagent.grading.statuses import (
    keep_recorder,
    module_shadow_reports,
    read_status_records,
    status_recorder,
)
from uniagent.harbor.reward import HarborRewardConfig, harbor_reward
from uniagent.hookspecs import hookimpl
from uniagent.reward import RewardContext, RewardInfraError, RewardResult
from uniagent.specs import RewardSpec


class CommandRewardConfig(BaseModel):
    """Settings of the ``command`` reward."""

    model_config = ConfigDict(extra="forbid")

    command: str | None = Field(None, description="command to run; default: the task's field")
    task_field: str = Field("test_command", description="task field holding the command")
    timeout: float = Field(600.0, gt=0, description="seconds the command may run")
    output_chars: int = Field(2000, ge=0, description="tail of the output kept in the result")
    status_channel: bool = Field(
        True,
        description="also ask the command's test runner (pytest, unittest, Django's) how its "
        "run ended, through a grader-owned recorder in its Python: a run that started and "
        "never reported its end (the interpreter left in the middle of the tests) scores 0 "
        "however the command exited. false: the exit status alone",
    )


def command_task_fields(settings: CommandRewardConfig) -> tuple[str, ...]:
    """The task field holding the command, unless the settings give the command."""
    return () if settings.command else (settings.task_field,)


async def command_reward(ctx: RewardContext[CommandRewardConfig]) -> RewardResult:
    """Run the test command in a clean grading shell in the repository; 1.0 if it exits 0."""
    config = ctx.settings
    command = config.command or ctx.task.get(config.task_field)
    if not command:
        raise RewardInfraError(
            f"the command reward needs a command: set reward.settings.command or give each task "
            f"a {config.task_field!r} field"
        )
    sandbox = ctx.require_sandbox()
    record, script = None, str(command)
    if config.status_channel:
        nonce = secrets.token_hex(8)
        record, hook = f"{sandbox.scratch}/status-{nonce}.jsonl", f"{sandbox.scratch}/hook-{nonce}"
        # first on PYTHONPATH again after the command's own `export PYTHONPATH=...`
        script = status_recorder(hook, record, nonce) + keep_recorder(script, hook)
    done = await sandbox.run(script, timeout=config.timeout)
    passed = done.exit_code == 0 and not done.timed_out
    info: dict[str, Any] = {
        "command": command,
        "exit_code": done.exit_code,
        "timed_out": done.timed_out,
        "output_tail": done.output[-config.output_chars :] if config.output_chars else "",
    }
    if record is not None and passed:  # a failed command needs no second word
        records, problem = await read_status_records(sandbox, record)
        unfinished = records.unfinished() if records is not None else []
        info["status_channel"] = problem or (
            "compared" if records and records.sessions else "absent"
        )
        tampered = [
            {"kind": "verdict", "rule": "runner-unfinished", "path": family,
             "change": "its run started and never reported its end, and the command exited 0"}
            for family in unfinished
        ]  # fmt: skip
        if problem == "removed":
            tampered.append(
                {"kind": "verdict", "rule": "status-record", "path": record, "change": "removed"}
            )
        if records is not None and records.shadows:
            repo = ctx.workspace.repo or sandbox.workdir or "."
            base = ctx.workspace.base_commit
            tampered += await module_shadow_reports(sandbox, records, repo, base)
        if tampered:
            info.update(
                score_reason="tampered",
                detail="the test runner did not finish its run, its record was removed, or "
                "it imported a module of the agent's that shadows the standard library",
                tampered=tampered,
            )
        passed = not tampered and problem is None
    return RewardResult(score=1.0 if passed else 0.0, info=info)


@hookimpl
def uniagent_rewards() -> Iterator[RewardSpec]:
    """The built-in rewards."""
    yield RewardSpec(
        name="command",
        fn=command_reward,
        settings=CommandRewardConfig,
        description="1.0 when a test command (from the config or the task) exits 0 in a clean "
        "grading shell",
        task_fields=command_task_fields,
    )
    yield RewardSpec(
        name="harbor",
        fn=harbor_reward,
        settings=HarborRewardConfig,
        description="a Harbor task's tests/test.sh, copied in at grading time; its reward.txt "
        "or named rewards (reward.json)",
    )
    yield RewardSpec(
        name="llm_judge",
        fn=llm_judge_reward,
        settings=JudgeSettings,
        description="an OpenAI-compatible chat model grades the submission with a rubric "
        "prompt (verdict or number); retries infrastructure errors, caches verdicts",
        uses_sandbox=False,
        concurrent=True,
    )
