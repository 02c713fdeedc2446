"""One episode end to end: sandbox → tools → baseline → loop → grading → close.

Both ``uniagent run`` and the verl adapter call :func:`run_episode`; it never
raises for a failed episode: every outcome is an :class:`EpisodeResult` with
exactly one exit reason.
"""

from __future__ import annotations

import asyncio
import logging
import time
import traceback
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from uniagent.config import DEFAULT_SYSTEM_PROMPT, AgentConfig
from uniagent.env import AgentEnv
from uniagent.env.errors import EnvStartError
from uniagent.errors import ConfigError
from uniagent.exit import ExitReason
from uniagent.grading.grader import EpisodeGrader, GradingPlan
from uniagent.interaction.loop import AgentInteraction, InteractionResult
from uniagent.interaction.metrics import EpisodeMetrics
from uniagent.interaction.prompts import tool_instructions
from uniagent.models.base import ChatModel
from uniagent.observer import NULL_OBSERVER, EpisodeObserver
from uniagent.resolver import ResolvedAgent

log = logging.getLogger(__name__)

#: What takes an episode's sandbox when the episode is done: ``uniagent run`` closes it off the
#: episodes' path (:class:`uniagent.run.jobs.BackgroundCloser`); by default it is closed, and
#: waited for, by the episode itself.
Closer = Callable[[AgentEnv], Awaitable[None]]


async def _close(env: AgentEnv, closer: Closer | None, observer: EpisodeObserver) -> None:
    observer.phase("close")
    await (env.close() if closer is None else closer(env))


@dataclass(kw_only=True)
class EpisodeResult(InteractionResult):
    """Everything an episode produced, for the results file or a training batch: how the
    loop ended (:class:`InteractionResult`), plus its treatment, reward and integrity."""

    traj_masked: bool
    reward: float | None = None
    reward_info: Mapping[str, Any] = field(default_factory=dict)
    #: What the grader recorded before the first turn (history scrub, protected files).
    integrity: Mapping[str, Any] = field(default_factory=dict)
    #: A harness episode's trajectory tree (the gateway session's); ``None`` for the
    #: built-in loop, whose rollout is one branch.
    tree: Mapping[str, Any] | None = None
    #: The MCP servers' tools the agent had, by name: their server (``mcp:NAME``).
    tool_servers: Mapping[str, str] = field(default_factory=dict)

    def saved_messages(self) -> list[dict[str, Any]]:
        """The conversation as ``messages.json`` holds it: the messages, and on an assistant
        message whose calls a parser read from its text, those calls (``parsed_tool_calls``)
        and the text outside them (``parsed_content``); on the user message carrying such a
        call's output, the tool's name (``tool_output_of``)."""
        messages = self.messages
        if not self.notes:
            return messages
        return [{**m, **self.notes.get(i, {})} for i, m in enumerate(messages)]

    def summary(self) -> dict[str, Any]:
        """The JSON-ready result without the (large) rollout cache."""
        return {
            "exit_reason": self.exit_reason.value,
            "traj_masked": self.traj_masked,
            "reward": self.reward,
            "reward_info": dict(self.reward_info),
            "turn_scores": {str(turn): score for turn, score in sorted(self.turn_scores.items())},
            "submission": self.submission,
            "error": self.error,
            "metrics": self.metrics.to_dict(),
            "integrity": dict(self.integrity),
            "tool_servers": dict(self.tool_servers),
        }


def system_prompt(agent: ResolvedAgent) -> str:
    """The config's system prompt, or the default one naming the configured finishing tools."""
    if agent.config.system_prompt is not None:
        return agent.config.system_prompt
    finishing = [t.name for t in agent.tools if t.ends_episode]
    if not finishing:
        return DEFAULT_SYSTEM_PROMPT
    names = " or ".join(f"the {n} tool" for n in finishing)
    return f"{DEFAULT_SYSTEM_PROMPT} When the task is done, call {names}."


def first_messages(agent: ResolvedAgent, task: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The system prompt and the task rendered through ``instance_template``."""
    try:
        user = agent.config.instance_template.format_map(task)
    except KeyError as exc:
        raise ConfigError(
            f"task has no field {exc.args[0]!r}, which instance_template needs; "
            f"task fields: {', '.join(sorted(task))}"
        ) from None
    return [{"role": "system", "content": system_prompt(agent)}, {"role": "user", "content": user}]


def describe_tools(prompt: list[dict[str, Any]], instructions: str) -> None:
    """Put the tool instructions into the system message (made if missing), once."""
    if prompt and prompt[0].get("role") == "system":
        if instructions not in str(prompt[0].get("content") or ""):
            prompt[0]["content"] = f"{prompt[0].get('content') or ''}\n\n{instructions}".lstrip()
    else:
        prompt.insert(0, {"role": "system", "content": instructions})


async def run_episode(
    agent: ResolvedAgent,
    task: Mapping[str, Any],
    model: ChatModel,
    *,
    messages: Sequence[Mapping[str, Any]] | None = None,
    logger: logging.Logger | None = None,
    observer: EpisodeObserver | None = None,
    closer: Closer | None = None,
) -> EpisodeResult:
    """Run one task to completion; failures become exit reasons, never exceptions.

    ``agent`` comes from :func:`uniagent.resolver.resolve` (with the task's
    overrides: ``agent.for_task``). ``messages`` are the first messages when the
    caller already has them (verl's dataset prompt); by default they are
    rendered from the config's templates. Only a task the episode cannot even
    begin with (a field missing for ``instance_template``) raises, before any
    sandbox starts. ``observer`` is told each phase, turn and tool call (progress).
    ``closer`` takes the sandbox at the end (default: closed here, before this returns).
    """
    grader = make_grader(agent, task)
    try:
        return await _run_episode(agent, task, model, grader, messages, logger, observer, closer)
    finally:
        if grader is not None:  # a fresh sandbox started ahead and not used, however it ended
            await grader.close()


async def _run_episode(
    agent: ResolvedAgent,
    task: Mapping[str, Any],
    model: ChatModel,
    grader: EpisodeGrader | None,
    messages: Sequence[Mapping[str, Any]] | None,
    logger: logging.Logger | None,
    observer: EpisodeObserver | None,
    closer: Closer | None = None,
) -> EpisodeResult:
    logger = logger or log
    observer = observer or NULL_OBSERVER
    if agent.agent.is_harness:
        return await run_harness_episode(
            agent, task, model, grader, messages, logger, observer, closer
        )
    config = agent.config
    tools = list(agent.tools)
    parser = agent.new_parser()
    prompt = [dict(m) for m in messages] if messages else first_messages(agent, task)
    metrics = EpisodeMetrics()
    started = time.perf_counter()
    env: AgentEnv | None = None
    integrity: Mapping[str, Any] = {}
    try:
        observer.phase("setup")
        env = agent.new_env()
        await env.start()
        observer.phase("tools")
        await env.install_tools(tools)
        if agent.mcp_servers:  # their tools are known once the servers answer, in the sandbox
            tools += await _mcp_tools(agent, env, tools)
        if grader is not None:
            observer.phase("baseline")
            integrity = await grader.prepare(env)
    except Exception as exc:
        logger.error("sandbox setup failed: %s", exc)
        if env is not None:
            await _close(env, closer, observer)
        return failed(config, ExitReason.ENV_ERROR, metrics, exc)
    finally:
        metrics.setup_seconds = time.perf_counter() - started

    if not model.renders_tools():  # the chat template would silently drop the tool schemas
        describe_tools(prompt, tool_instructions(tools, parser))
    try:
        cache = model.start_cache(prompt, [t.openai_schema() for t in tools])
        interaction = AgentInteraction(
            model, env, tools, parser, config.interaction, logger=logger, observer=observer
        )
        observer.phase("agent")
        outcome = await interaction.run(cache, metrics)
        inexact = metrics.inexact_turns > 0 and config.inexact_treatment() == "mask"
        result = EpisodeResult(
            exit_reason=outcome.exit_reason,
            traj_masked=config.treatment(outcome.exit_reason) == "mask" or inexact,
            metrics=metrics,
            cache=cache,
            submission=outcome.submission,
            error=outcome.error,
            integrity=integrity,
            notes=outcome.notes,
            turn_scores=dict(outcome.turn_scores),
            tool_servers={  # the MCP tools' (uniagent.mcp.tools.McpToolSpec.server)
                t.name: f"mcp:{server}"
                for t in tools
                if isinstance(server := getattr(t, "server", None), str)
            },
        )
        return await _conclude(config, grader, env, result, logger, observer)
    except Exception as exc:
        logger.exception("episode failed")
        return failed(config, ExitReason.UNKNOWN_ERROR, metrics, exc)
    finally:
        await _close(env, closer, observer)


async def _conclude(
    config: AgentConfig,
    grader: EpisodeGrader | None,
    env: AgentEnv,
    result: EpisodeResult,
    logger: logging.Logger,
    observer: EpisodeObserver,
) -> EpisodeResult:
    """The end of an episode that ran (the built-in loop's or a harness's): graded, unless
    it is masked or the agent ended its own shell."""
    if result.exit_reason is ExitReason.AGENT_KILLED_SHELL:
        # The agent's own command ended its shell: a policy outcome worth nothing (and no
        # tool's turn score either: a score the grader forces drops them).
        result.reward, result.reward_info = 0.0, {"score_reason": "agent_killed_shell"}
        result.turn_scores = {}
    elif grader is not None and not result.traj_masked:
        observer.phase("grading")
        await grade(config, grader, env, result, logger)
    return result


async def _mcp_tools(agent: ResolvedAgent, env: AgentEnv, tools: list[Any]) -> list[Any]:
    """The MCP servers' tools, listed in the sandbox; a clash of names fails the set-up."""
    from uniagent.mcp.tools import list_mcp_tools

    listed = await list_mcp_tools(env, agent.mcp_servers, timeout=agent.env.setup_timeout)
    taken = {t.name for t in tools}
    for tool in listed:
        if tool.name in taken:
            raise EnvStartError(
                f"tool {tool.name!r} of MCP server {tool.server!r} has the name of another "
                f"tool; leave one out (`exclude: [{tool.name}]`)"
            )
        taken.add(tool.name)
    return list(listed)


def make_grader(agent: ResolvedAgent, task: Mapping[str, Any]) -> EpisodeGrader | None:
    """The episode's grader (``None`` without a reward)."""
    reward = agent.reward
    if reward is None:
        return None
    verifier = task.get("verifier_env")
    if verifier is not None and not isinstance(verifier, Mapping):
        raise ConfigError(f"the task's verifier_env must be a mapping, not {verifier!r}")
    plan = GradingPlan(
        spec=reward.spec,
        settings=reward.settings,
        task=task,
        grade_in=reward.grade_in,
        integrity=reward.integrity,
        fresh_env=agent.new_env,
        # the agent's deployment with the task's verifier overrides ({}: the same one)
        verifier_env=None
        if verifier is None
        else agent.for_task(verifier, source="the task's verifier_env").new_env,
        session_env=agent.env.session_env(),
    )
    return EpisodeGrader(plan)


async def grade(
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
        if grade.info.get("score_reason"):  # a forced score (tampering...): no credit at all
            result.turn_scores = {}
        for turn, value in grade.turn_scores.items():  # the reward's, added to the tools'
            result.turn_scores[turn] = result.turn_scores.get(turn, 0.0) + value
        logger.info(
            "reward %s: %s %s", config.reward.name, grade.score, grade.info.get("score_reason", "")
        )
    except Exception as exc:
        logger.error("reward %s failed: %s", config.reward.name, exc)
        result.exit_reason = ExitReason.REWARD_ERROR
        result.traj_masked = config.treatment(ExitReason.REWARD_ERROR) == "mask"
        result.error = _traceback_text(exc)
    finally:
        result.metrics.reward_seconds = time.perf_counter() - started


def failed(
    config: AgentConfig, reason: ExitReason, metrics: EpisodeMetrics, exc: BaseException
) -> EpisodeResult:
    return EpisodeResult(
        exit_reason=reason,
        traj_masked=config.treatment(reason) == "mask",
        metrics=metrics,
        error=_traceback_text(exc),
    )


def _traceback_text(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc)).rstrip()


def instruction_of(
    agent: ResolvedAgent,
    task: Mapping[str, Any],
    messages: Sequence[Mapping[str, Any]] | None,
) -> str:
    """The task's instruction for the harness: the first user message's text."""
    prompt = [dict(m) for m in messages] if messages else first_messages(agent, task)
    for message in prompt:
        if message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, list):  # content parts
                return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
            return str(content or "")
    return ""


async def run_harness_episode(
    agent: ResolvedAgent,
    task: Mapping[str, Any],
    model: Any,
    grader: EpisodeGrader | None,
    messages: Sequence[Mapping[str, Any]] | None,
    logger: logging.Logger,
    observer: EpisodeObserver,
    closer: Closer | None = None,
) -> EpisodeResult:
    """Run one task with the agent's harness: the same phases and grader as the built-in
    loop, the harness in the sandbox's agent session with a gateway session as its model
    (:mod:`uniagent.agents.harness`); failures become exit reasons, as in :func:`run_episode`."""
    from uniagent.agents.gateways import gateway_for
    from uniagent.agents.harness import check_sandbox, prepare, run_harness, with_install

    config = agent.config
    instruction = instruction_of(agent, task, messages)
    gateway_for(model, config.tool_parser)  # a model the gateway cannot serve: said now
    metrics = EpisodeMetrics()
    started = time.perf_counter()
    env: AgentEnv | None = None
    integrity: Mapping[str, Any] = {}
    try:
        observer.phase("setup")
        folder = await asyncio.to_thread(prepare, agent)
        deployment = agent.deployment.factory(with_install(agent, folder))
        env = AgentEnv(deployment, agent.env)
        await env.start()
        await check_sandbox(agent, env, folder)  # what the image lacks: said before it runs
        observer.phase("tools")
        await env.install_tools(list(agent.tools))
        if grader is not None:
            observer.phase("baseline")
            integrity = await grader.prepare(env)
    except Exception as exc:
        logger.error("sandbox setup failed: %s", exc)
        if env is not None:
            await _close(env, closer, observer)
        return failed(config, ExitReason.ENV_ERROR, metrics, exc)
    finally:
        metrics.setup_seconds = time.perf_counter() - started
    try:
        observer.phase("agent")
        began = time.perf_counter()
        run = await run_harness(agent, env, instruction, model, folder, logger)
        metrics.env_seconds = time.perf_counter() - began
        metrics.turns, metrics.inexact_turns = run.turns, run.inexact_turns
        inexact = run.inexact_turns > 0 and config.inexact_treatment() == "mask"
        result = EpisodeResult(
            exit_reason=run.exit_reason,
            traj_masked=config.treatment(run.exit_reason) == "mask" or inexact,
            metrics=metrics,
            cache=run.cache,
            submission=run.submission,
            error=run.error,
            integrity=integrity,
            tree=run.tree,
        )
        return await _conclude(config, grader, env, result, logger, observer)
    except Exception as exc:
        logger.exception("episode failed")
        return failed(config, ExitReason.UNKNOWN_ERROR, metrics, exc)
    finally:
        await _close(env, closer, observer)
