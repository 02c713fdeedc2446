"""One episode end to end: sandbox → tools → baseline → loop → grading → close.

Both ``uniagent run`` and the verl adapter call :func:`run_episode`; it never
raises for a failed episode: every outcome is an :class:`EpisodeResult` with
exactly one exit reason.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from uniagent.config import AgentConfig, format_validation_error
from uniagent.env import AgentEnv, EnvConfig
from uniagent.errors import ConfigError
from uniagent.grading.grader import EpisodeGrader, GradingPlan
from uniagent.interaction.exit import ExitReason
from uniagent.interaction.loop import AgentInteraction
from uniagent.interaction.metrics import EpisodeMetrics
from uniagent.interaction.prompts import tool_instructions
from uniagent.models.base import ChatModel
from uniagent.observer import NULL_OBSERVER, EpisodeObserver
from uniagent.registry import get_registry
from uniagent.rollout import RolloutCache

log = logging.getLogger(__name__)


@dataclass
class EpisodeResult:
    """Everything an episode produced, for the results file or a training batch."""

    exit_reason: ExitReason
    traj_masked: bool
    metrics: EpisodeMetrics
    cache: RolloutCache | None = None
    reward: float | None = None
    reward_info: Mapping[str, Any] = field(default_factory=dict)
    submission: str | None = None
    error: str | None = None
    #: What the grader recorded before the first turn (history scrub, protected files).
    integrity: Mapping[str, Any] = field(default_factory=dict)

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The conversation (empty when the episode failed before the first turn)."""
        return self.cache.messages if self.cache is not None else []

    def summary(self) -> dict[str, Any]:
        """The JSON-ready result without the (large) rollout cache."""
        return {
            "exit_reason": self.exit_reason.value,
            "traj_masked": self.traj_masked,
            "reward": self.reward,
            "reward_info": dict(self.reward_info),
            "submission": self.submission,
            "error": self.error,
            "metrics": self.metrics.to_dict(),
            "integrity": dict(self.integrity),
        }


def first_messages(config: AgentConfig, task: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The system prompt and the task rendered through ``instance_template``."""
    try:
        user = config.instance_template.format_map(task)
    except KeyError as exc:
        raise ConfigError(
            f"task has no field {exc.args[0]!r}, which instance_template needs; "
            f"task fields: {', '.join(sorted(task))}"
        ) from None
    return [{"role": "system", "content": config.system_prompt}, {"role": "user", "content": user}]


def describe_tools(prompt: list[dict[str, Any]], instructions: str) -> None:
    """Put the tool instructions into the system message (made if missing), once."""
    if prompt and prompt[0].get("role") == "system":
        if instructions not in str(prompt[0].get("content") or ""):
            prompt[0]["content"] = f"{prompt[0].get('content') or ''}\n\n{instructions}".lstrip()
    else:
        prompt.insert(0, {"role": "system", "content": instructions})


async def run_episode(
    config: AgentConfig,
    task: Mapping[str, Any],
    model: ChatModel,
    *,
    messages: Sequence[Mapping[str, Any]] | None = None,
    logger: logging.Logger | None = None,
    observer: EpisodeObserver | None = None,
) -> EpisodeResult:
    """Run one task to completion; failures become exit reasons, never exceptions.

    ``messages`` are the first messages when the caller already has them (verl's
    dataset prompt); by default they are rendered from the config's templates.
    Only a task or config the episode cannot even begin with (a field missing
    for ``instance_template``, an unknown plugin name) raises, before any
    sandbox starts. ``observer`` is told each phase, turn and tool call (progress).
    """
    logger = logger or log
    observer = observer or NULL_OBSERVER
    grader = make_grader(config, task)
    registry = get_registry()
    tools = [registry.tools()[name] for name in config.tools]
    parser = registry.tool_parsers()[config.tool_parser].factory()
    prompt = [dict(m) for m in messages] if messages else first_messages(config, task)
    if not model.renders_tools():  # the chat template would silently drop the tool schemas
        describe_tools(prompt, tool_instructions(tools, parser))
    metrics = EpisodeMetrics()
    started = time.perf_counter()
    env: AgentEnv | None = None
    integrity: Mapping[str, Any] = {}
    try:
        observer.phase("setup")
        env = AgentEnv.from_config(config.env.deployment, config.env.settings())
        await env.start()
        observer.phase("tools")
        await env.install_tools(tools)
        if grader is not None:
            observer.phase("baseline")
            integrity = await grader.prepare(env)
    except Exception as exc:
        logger.error("sandbox setup failed: %s", exc)
        if env is not None:
            observer.phase("close")
            await env.close()
        return _failed(config, ExitReason.ENV_ERROR, metrics, exc)
    finally:
        metrics.setup_seconds = time.perf_counter() - started

    try:
        cache = model.start_cache(prompt, [t.openai_schema() for t in tools])
        interaction = AgentInteraction(
            model, env, tools, parser, config.interaction, logger=logger, observer=observer
        )
        observer.phase("agent")
        outcome = await interaction.run(cache, metrics)
        result = EpisodeResult(
            exit_reason=outcome.exit_reason,
            traj_masked=config.treatment(outcome.exit_reason) == "mask",
            metrics=metrics,
            cache=cache,
            submission=outcome.submission,
            error=outcome.error,
            integrity=integrity,
        )
        if result.exit_reason is ExitReason.AGENT_KILLED_SHELL:
            # The agent's own command ended its shell: a policy outcome worth nothing.
            result.reward, result.reward_info = 0.0, {"score_reason": "agent_killed_shell"}
        elif grader is not None and not result.traj_masked:
            observer.phase("grading")
            await _grade(config, grader, env, result, logger)
        return result
    except Exception as exc:
        logger.exception("episode failed")
        return _failed(config, ExitReason.UNKNOWN_ERROR, metrics, exc)
    finally:
        observer.phase("close")
        await env.close()


def make_grader(config: AgentConfig, task: Mapping[str, Any]) -> EpisodeGrader | None:
    """The episode's grader, its reward settings validated before any sandbox starts."""
    if config.reward is None:
        return None
    spec = get_registry().rewards()[config.reward.name]
    settings = None
    if spec.config is not None:
        try:
            settings = spec.config.model_validate(config.reward.config)
        except ValidationError as exc:
            raise ConfigError(format_validation_error(exc, "reward.config")) from None
    env_settings = config.env.settings()
    plan = GradingPlan(
        spec=spec,
        settings=settings,
        task=task,
        grade_in=config.reward.grade_in,
        integrity=config.reward.integrity,
        fresh_env=lambda: AgentEnv.from_config(config.env.deployment, env_settings),
        session_env=EnvConfig.model_validate(env_settings).session_env(),
    )
    return EpisodeGrader(plan)


async def _grade(
    config: AgentConfig,
    grader: EpisodeGrader,
    env: AgentEnv,
    result: EpisodeResult,
    logger: logging.Logger,
) -> None:
    assert config.reward is not None
    started = time.perf_counter()
    try:
        grade = await grader.grade(
            env,
            messages=result.messages,
            exit_reason=result.exit_reason,
            submission=result.submission,
        )
        result.reward, result.reward_info = grade.score, grade.info
        logger.info("reward %s: %s %s", config.reward.name, grade.score,
                    grade.info.get("score_reason", ""))
    except Exception as exc:
        logger.error("reward %s failed: %s", config.reward.name, exc)
        result.exit_reason = ExitReason.REWARD_ERROR
        result.traj_masked = config.treatment(ExitReason.REWARD_ERROR) == "mask"
        result.error = _describe(exc)
    finally:
        result.metrics.reward_seconds = time.perf_counter() - started


def _failed(
    config: AgentConfig, reason: ExitReason, metrics: EpisodeMetrics, exc: BaseException
) -> EpisodeResult:
    return EpisodeResult(
        exit_reason=reason,
        traj_masked=config.treatment(reason) == "mask",
        metrics=metrics,
        error=_describe(exc),
    )


def _describe(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc)).rstrip()
