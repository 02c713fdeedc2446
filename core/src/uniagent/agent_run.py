"""The agent seam: what runs in an episode between the baseline and the grading.

Every agent, the built-in ReAct loop (``react``) and a harness run in the sandbox (Claude
Code, Codex, mini-swe-agent, ...), is an :class:`EpisodeAgent` made for one episode from
an :class:`EpisodeContext`. :func:`uniagent.episode.run_episode` is the one episode body
around it::

    agent = spec.runner(context)        # per episode (a harness's: uniagent's own runner)
    env = await agent.new_env()         # the unstarted sandbox it runs in
    await env.start()
    await agent.setup(env)              # what it needs there (its tools...)
    ... the grader's baseline ...
    run = await agent.run(env, metrics) # -> AgentRun
    ... grading, close ...

An agent plugin gives its :class:`~uniagent.specs.AgentSpec` a ``runner`` (a callable
taking the :class:`EpisodeContext`); a spec with a harness's ``install``, ``wire`` and
``launch`` and no ``runner`` is run by uniagent's harness runner
(:class:`uniagent.agents.harness.HarnessAgent`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from uniagent.exit import ExitReason

if TYPE_CHECKING:  # pragma: no cover - imports for type checkers only
    from uniagent.env.agent_env import AgentEnv
    from uniagent.interaction.metrics import EpisodeMetrics
    from uniagent.observer import EpisodeObserver
    from uniagent.resolver import ResolvedAgent
    from uniagent.rollout import Rollout


@dataclass(frozen=True)
class EpisodeContext:
    """What an agent is made from, once per episode: the resolved agent (its config,
    tools, parser, sandbox backend, settings), the task row, the model, the first messages
    when the caller has them (verl's dataset prompt; else rendered from the config's
    templates), the episode's logger and its observer (progress)."""

    agent: ResolvedAgent
    task: Mapping[str, Any]
    model: Any
    messages: Sequence[Mapping[str, Any]] | None
    logger: logging.Logger
    observer: EpisodeObserver


@dataclass(kw_only=True)
class AgentRun:
    """How an agent's run ended and what it produced (the episode adds the treatment,
    reward and integrity: :class:`uniagent.episode.EpisodeResult`).

    ``cache`` is the rollout trained on (a harness's main branch); ``tree`` a harness's
    trajectory tree (the gateway session's). The run's turn counts and times go into the
    :class:`~uniagent.interaction.metrics.EpisodeMetrics` that ``run`` was given."""

    exit_reason: ExitReason
    cache: Rollout | None = None
    submission: str | None = None
    error: str | None = None
    #: What the record adds to some messages, by index (see ``InteractionResult.notes``).
    notes: dict[int, dict[str, Any]] = field(default_factory=dict)
    #: Per-turn scores by model turn index from 0 (the tools').
    turn_scores: dict[int, float] = field(default_factory=dict)
    tree: Mapping[str, Any] | None = None
    #: The tools of MCP servers the agent had, by name: their server (``mcp:NAME``).
    tool_servers: Mapping[str, str] = field(default_factory=dict)
    #: A tree rollout's leaves (``interaction.branching``), the root's own branch first;
    #: each has its ``branch``, ``env`` (its sandbox: the episode's own for the first, a fork
    #: for the others, which the episode grades and closes) and ``metrics``. ``None``: one
    #: branch.
    leaves: list[AgentRun] | None = None
    branch: tuple[int, ...] = ()
    env: AgentEnv | None = None
    metrics: EpisodeMetrics | None = None
    #: Where the tree split: ``{"turn", "leaf", "width", "why"}`` per branch point.
    splits: list[dict[str, Any]] = field(default_factory=list)
    #: The parent shell's background jobs a fork did not carry (a leaf's, from its fork).
    lost_processes: tuple[str, ...] = ()
    #: Where the root sandbox's directories are in this leaf's (a fork without bubblewrap).
    moved: Mapping[str, str] = field(default_factory=dict)


class EpisodeAgent(Protocol):
    """One episode's agent. Exceptions from ``new_env`` and ``setup`` are the sandbox's
    set-up failures (``env_error``, infrastructure); from ``run``, anything but the
    policy's own outcome, which ``run`` returns as an exit reason."""

    async def new_env(self) -> AgentEnv:
        """The episode's sandbox, not started."""
        ...

    async def setup(self, env: AgentEnv) -> None:
        """What the agent needs in the started sandbox (its tools, a check that the
        sandbox can run it), before the grader's baseline."""
        ...

    async def run(self, env: AgentEnv, metrics: EpisodeMetrics) -> AgentRun:
        """The agent's whole run in ``env``; its turns and times go into ``metrics``."""
        ...
