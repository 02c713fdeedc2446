"""One episode end to end: sandbox → tools → baseline → agent → grading → close.

Both ``uniagent run`` and the verl adapter call :func:`run_episode`; it never
raises for a failed episode: every outcome is an :class:`EpisodeResult` with
exactly one exit reason. The agent, the built-in loop or a harness, is an
:class:`~uniagent.agent_run.EpisodeAgent`: one body runs every kind.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import time
import traceback
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from uniagent.agent_run import AgentRun, EpisodeAgent, EpisodeContext
from uniagent.config import AgentConfig
from uniagent.env import AgentEnv
from uniagent.errors import ConfigError
from uniagent.exit import ExitReason
from uniagent.gateway.tree import TrajectoryTree
from uniagent.grading.grader import EpisodeGrader, GradingPlan
from uniagent.interaction.loop import InteractionResult
from uniagent.interaction.metrics import EpisodeMetrics

# Where they were before the agent seam (verl's adapter, scripts and tests import them here).
from uniagent.interaction.prompts import (  # noqa: F401
    describe_tools,
    first_messages,
    system_prompt,
)
from uniagent.interaction.tree import leaf_name
from uniagent.models.base import ChatModel
from uniagent.observer import NULL_OBSERVER, EpisodeObserver
from uniagent.resolver import ResolvedAgent
from uniagent.specs import AgentSpec

log = logging.getLogger(__name__)

#: What takes an episode's sandbox when the episode is done: ``uniagent run`` closes it off the
#: episodes' path (:class:`uniagent.run.jobs.BackgroundCloser`); by default it is closed, and
#: waited for, by the episode itself.
Closer = Callable[[AgentEnv], Awaitable[None]]
#: Entered once the sandbox is set up (and baselined), for the agent's turns only (not the
#: grading): a run that prepares sandboxes ahead (``warm``) passes a semaphore of its
#: ``concurrency`` agent slots, which the episode waits for in phase ``ready``.
Gate = contextlib.AbstractAsyncContextManager[Any]


def worker_slots(concurrency: int, warm: int, workers: int) -> tuple[int, int]:
    """(agents, sandboxes) one of ``workers`` workers keeps at once: ``concurrency //
    workers`` agents (at least one) and, with ``warm``, ``warm // workers`` sandboxes more
    (at least one), set up ahead or being graded (Ray actors, verl's agent-loop workers)."""
    agents = max(1, concurrency // workers)
    return agents, agents + (max(1, warm // workers) if warm else 0)


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
    #: A tree rollout's (``interaction.branching``): every leaf's own result, this one's
    #: branch first (``None``: one branch); ``tree`` then holds the whole tree.
    leaves: list[EpisodeResult] | None = None
    #: This leaf's branch path (one number per branch point it passed; empty: no split).
    branch: tuple[int, ...] = ()
    #: The branch points (``{"turn", "leaf", "width", "why"}``), on the root's result.
    splits: list[dict[str, Any]] = field(default_factory=list)
    #: The parent shell's background jobs a fork did not carry (a forked leaf's).
    lost_processes: tuple[str, ...] = ()

    @property
    def leaf(self) -> str | None:
        """This leaf's name (``"0.2"``), or ``None`` outside a tree rollout."""
        return leaf_name(self.branch) if self.branch else None

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
        """The JSON-ready result without the (large) rollout."""
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
            **({"leaf": self.leaf, "branch": list(self.branch)} if self.branch else {}),
            **({"lost_processes": list(self.lost_processes)} if self.lost_processes else {}),
        }


async def run_episode(
    agent: ResolvedAgent,
    task: Mapping[str, Any],
    model: ChatModel,
    *,
    messages: Sequence[Mapping[str, Any]] | None = None,
    logger: logging.Logger | None = None,
    observer: EpisodeObserver | None = None,
    closer: Closer | None = None,
    gate: Gate | None = None,
) -> EpisodeResult:
    """Run one task to completion; failures become exit reasons, never exceptions.

    ``agent`` comes from :func:`uniagent.resolver.resolve` (with the task's
    overrides: ``agent.for_task``). ``messages`` are the first messages when the
    caller already has them (verl's dataset prompt); by default they are
    rendered from the config's templates. Only a task the episode cannot even
    begin with (a field missing for ``instance_template``) raises, before any
    sandbox starts. ``observer`` is told each phase, turn and tool call (progress).
    ``closer`` takes the sandbox at the end (default: closed here, before this returns).
    ``gate`` is held while the agent runs: entered after the sandbox's set-up (phase
    ``ready`` while it waits), left before the grading.
    """
    grader = make_grader(agent, task)
    try:
        return await _run_episode(
            agent, task, model, grader, messages, logger, observer, closer, gate
        )
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
    gate: Gate | None = None,
) -> EpisodeResult:
    logger = logger or log
    observer = observer or NULL_OBSERVER
    config = agent.config
    runner = runner_of(agent.agent)(EpisodeContext(agent, task, model, messages, logger, observer))
    metrics = EpisodeMetrics()
    started = time.perf_counter()
    env: AgentEnv | None = None
    integrity: Mapping[str, Any] = {}
    try:
        observer.phase("setup")
        env = await runner.new_env()
        await env.start()
        observer.phase("tools")
        await runner.setup(env)
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
        if gate is not None:  # the sandbox is ready; the agent waits for its slot
            observer.phase("ready")
        async with gate if gate is not None else contextlib.nullcontext():
            observer.phase("agent")
            run = await runner.run(env, metrics)
        if run.leaves is not None:
            return await _conclude_tree(
                config, grader, env, run, integrity, logger, observer, closer
            )
        result = _result_of(config, run, metrics, integrity)
        return await _conclude(config, grader, env, result, logger, observer)
    except Exception as exc:
        logger.exception("episode failed")
        return failed(config, ExitReason.UNKNOWN_ERROR, metrics, exc)
    finally:
        await _close(env, closer, observer)


def _result_of(
    config: AgentConfig, run: AgentRun, metrics: EpisodeMetrics, integrity: Mapping[str, Any]
) -> EpisodeResult:
    inexact = metrics.inexact_turns > 0 and config.inexact_treatment() == "mask"
    return EpisodeResult(
        exit_reason=run.exit_reason,
        traj_masked=config.treatment(run.exit_reason) == "mask" or inexact,
        metrics=metrics,
        cache=run.cache,
        submission=run.submission,
        error=run.error,
        integrity=integrity,
        notes=run.notes,
        turn_scores=dict(run.turn_scores),
        tree=run.tree,
        tool_servers=dict(run.tool_servers),
        branch=run.branch,
        lost_processes=run.lost_processes,
    )


async def _conclude_tree(
    config: AgentConfig,
    grader: EpisodeGrader | None,
    env: AgentEnv,
    run: AgentRun,
    integrity: Mapping[str, Any],
    logger: logging.Logger,
    observer: EpisodeObserver,
    closer: Closer | None,
) -> EpisodeResult:
    """A tree rollout's end: every leaf graded in its own sandbox, each fork's with the
    root's baseline (:meth:`EpisodeGrader.for_fork`), then closed; the episode's result is
    its root branch's, with every leaf's result (``leaves``) and the tree (``tree``)."""
    assert run.leaves is not None
    root_branch = run.leaves[0]

    async def conclude(leaf: AgentRun) -> EpisodeResult:
        # The root's branch is graded by the episode's grader, in the episode's sandbox or
        # in its layered copy (AgentEnv.layered: the same paths); the other leaves by one
        # of their own with the same baseline.
        first = leaf is root_branch
        sandbox = env if leaf.env is None else leaf.env
        own = sandbox is env
        metrics = leaf.metrics or EpisodeMetrics()
        leaf_grader = grader if first or grader is None else grader.for_fork(leaf.moved)
        try:
            result = _result_of(config, leaf, metrics, integrity)
            return await _conclude(config, leaf_grader, sandbox, result, logger, observer)
        except Exception as exc:
            logger.exception("leaf %s failed", leaf_name(leaf.branch))
            result = failed(config, ExitReason.UNKNOWN_ERROR, metrics, exc)
            result.branch = leaf.branch
            return result
        finally:
            if not own:
                if leaf_grader is not None and leaf_grader is not grader:
                    await leaf_grader.close()
                await _close(sandbox, closer, observer)

    leaves = list(await asyncio.gather(*(conclude(leaf) for leaf in run.leaves)))
    root = copy.copy(leaves[0])
    root.leaves = leaves
    root.splits = list(run.splits)
    root.tree = tree_record(leaves, run.splits)
    return root


def tree_record(
    leaves: Sequence[EpisodeResult], splits: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """A tree rollout's record: the leaves' token runs as one trajectory tree (the
    gateway's format, ``uniagent.trajectory_tree/1``: shared prefixes are shared nodes),
    plus ``leaves`` (per leaf: its node, name, branch path, reward, exit reason, masking)
    and ``splits`` (the branch points). A message-mode rollout has no token runs: its
    ``nodes`` are empty and each leaf's ``node`` is ``None``."""
    tree = TrajectoryTree()
    rows: list[dict[str, Any]] = []
    for leaf in leaves:
        node_id = None
        cache = leaf.cache
        if cache is not None and cache.mode == "tokens" and cache.prompt_ids:
            prompt, mask = cache.prompt_ids, cache.response_mask
            logprobs = cache.response_logprobs if cache.has_logprobs else [0.0] * len(mask)
            node = tree.insert(
                [*prompt, *cache.response_ids],
                [0] * len(prompt) + list(mask),
                [0.0] * len(prompt) + list(logprobs),
            )
            node_id = node.id
        rows.append({
            "leaf": leaf_name(leaf.branch),
            "branch": list(leaf.branch),
            "node": node_id,
            "exit_reason": leaf.exit_reason.value,
            "traj_masked": leaf.traj_masked,
            "reward": leaf.reward,
            "turns": leaf.metrics.turns,
        })  # fmt: skip
    record = tree.to_dict()
    record["leaves"] = rows
    record["splits"] = [dict(s) for s in splits]
    return record


def runner_of(spec: AgentSpec[Any]) -> Callable[[EpisodeContext], EpisodeAgent]:
    """What makes an episode's agent from ``spec``: its own ``runner``, or for a harness
    (``install``, ``wire``, ``launch``) uniagent's harness runner."""
    if spec.runner is not None:
        return spec.runner
    from uniagent.agents.harness import HarnessAgent

    return HarnessAgent


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
        open_fresh=agent.new_env,
        # the agent's deployment with the task's verifier overrides ({}: the same one)
        open_verifier=None
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
