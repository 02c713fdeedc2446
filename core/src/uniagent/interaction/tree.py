"""Tree rollouts of the built-in loop: an episode that forks its sandbox mid-way and goes on
several ways (``interaction.branching``).

At a branch point (a turn of ``at_turns``, or a turn whose sampled tokens' mean surprisal
is above ``entropy_above``) the branch that reached it forks its sandbox ``width - 1``
times (:meth:`uniagent.env.AgentEnv.fork`: the same files, working directory and exported
variables). Each new branch starts from the state before that turn's generation (the same
token prefix, the loop's budgets and counters) and samples the turn anew; the branch that
reached the point goes on with the turn it sampled. Every branch runs to its own end in its
own sandbox: a leaf. At most ``max_leaves`` leaves are made per task.

A leaf's branch path (``branch``) has one number per branch point it passed: 0 for the
branch that reached the point, 1..k-1 for the ones started there.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import MutableMapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from uniagent.config import BranchingConfig
from uniagent.interaction.metrics import EpisodeMetrics

if TYPE_CHECKING:  # pragma: no cover - imports for type checkers only
    from uniagent.env.agent_env import AgentEnv
    from uniagent.interaction.loop import AgentInteraction, InteractionResult
    from uniagent.rollout import Rollout

log = logging.getLogger(__name__)


def leaf_name(branch: tuple[int, ...]) -> str:
    """A leaf's name from its branch path: ``"0.2"``; ``"root"`` before any branch point."""
    return ".".join(str(i) for i in branch) if branch else "root"


@dataclass
class Leaf:
    """One branch, run to its end: its sandbox (the episode's own for branch 0...), where
    it split off, and how it ended."""

    branch: tuple[int, ...]
    env: AgentEnv
    cache: Rollout
    metrics: EpisodeMetrics
    outcome: InteractionResult | None = None
    #: What the fork left behind: the parent shell's background jobs at the fork.
    lost_processes: tuple[str, ...] = ()
    #: Where the root sandbox's directories are in this one's (none with bubblewrap).
    moved: dict[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return leaf_name(self.branch)


@dataclass
class BranchPoint:
    """Where a branch may split: its state before a turn's generation."""

    interaction: AgentInteraction
    leaf: Leaf
    turn: int
    cache: Rollout
    metrics: EpisodeMetrics
    #: The response's first position in the rollout (the turn's log-probs start there).
    response_start: int


@dataclass
class Split:
    """A branch point that split: the turn, the branch that reached it, how many it made."""

    turn: int
    branch: tuple[int, ...]
    width: int
    why: str
    #: Forks that failed (infrastructure: the branch point made fewer branches).
    failed: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "turn": self.turn,
            "leaf": leaf_name(self.branch),
            "width": self.width,
            "why": self.why,
        }
        if self.failed:
            out["failed"] = list(self.failed)
        return out


class _LeafLog(logging.LoggerAdapter[logging.Logger]):
    """The episode's logger, each line naming the leaf."""

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, Any]:
        return f"[leaf {self.extra['leaf'] if self.extra else '?'}] {msg}", kwargs


class TreeRollout:
    """Drives one episode's tree: the brancher every branch's loop asks (see the module
    docstring). :meth:`run` returns every leaf, the root's own branch first."""

    def __init__(self, config: BranchingConfig, logger: logging.Logger) -> None:
        self.config = config
        self.log = logger
        self.leaves: list[Leaf] = []
        self.splits: list[Split] = []
        self._tasks: list[asyncio.Task[None]] = []
        #: Leaves made or promised so far (the root's branch is one).
        self._budget = 1

    async def run(
        self, interaction: AgentInteraction, env: AgentEnv, cache: Rollout, metrics: EpisodeMetrics
    ) -> list[Leaf]:
        """Run the root branch in ``env`` and every branch it splits into; wait for all."""
        root = Leaf((), env, cache, metrics)
        self.leaves.append(root)
        try:
            await self._drive(interaction, root)
            while pending := [t for t in self._tasks if not t.done()]:
                await asyncio.wait(pending)
            for task in self._tasks:
                task.result()  # a branch's own failure (never the policy's: see _drive)
        except BaseException:
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            await self.close_forks()
            raise
        return self.leaves

    async def close_forks(self) -> None:
        """Close every leaf's sandbox but the root's (shielded: closing must finish)."""
        forks = [leaf.env for leaf in self.leaves[1:]]
        if forks:
            await asyncio.shield(asyncio.gather(*(env.close() for env in forks),
                                                return_exceptions=True))  # fmt: skip

    async def _drive(
        self, interaction: AgentInteraction, leaf: Leaf, resampled: int | None = None
    ) -> None:
        """Run one branch to its end; ``resampled``: the turn it was started to sample anew
        (it does not split there again)."""
        interaction.brancher = _Brancher(self, leaf, interaction, resampled)
        leaf.outcome = await interaction.run(leaf.cache, leaf.metrics)

    # -- asked by the loop ------------------------------------------------------------
    def may_split(self, turn: int) -> bool:
        if self._budget >= self.config.max_leaves:
            return False
        return turn in self.config.at_turns or self.config.entropy_above is not None

    async def split(self, point: BranchPoint, cache: Rollout, live: AgentInteraction) -> None:
        """After ``point.turn``'s generation by ``live`` (the loop of ``point.leaf``): split
        there if the config says so."""
        why = self._why(point, cache)
        if why is None:
            return
        room = self.config.max_leaves - self._budget
        width = min(self.config.width, room + 1)
        if width < 2:
            return
        self._budget += width - 1
        parent = point.leaf
        split = Split(point.turn, parent.branch, 1, why)
        self.splits.append(split)
        for number in range(1, width):
            try:
                fork = await parent.env.fork()
            except Exception as exc:  # infrastructure: fewer branches, recorded
                self._budget -= 1
                split.failed.append(f"{type(exc).__name__}: {exc}")
                self.log.warning("turn %d: a fork failed: %s", point.turn, exc)
                continue
            split.width += 1
            branch = (*parent.branch, number)
            child = Leaf(
                branch,
                fork.env,
                point.cache.branch(),
                _copy_metrics(point.metrics),
                lost_processes=fork.background,
                moved=_compose(parent.moved, getattr(fork.env.deployment, "moved_from", {})),
            )
            self.leaves.append(child)
            copy = point.interaction.clone(
                fork.env, _LeafLog(self.log, {"leaf": leaf_name(branch)})
            )
            self._tasks.append(asyncio.ensure_future(self._drive(copy, child, point.turn)))
        # The branch that reached the point goes on as number 0 of it.
        parent.branch = (*parent.branch, 0)
        live.log = _LeafLog(self.log, {"leaf": leaf_name(parent.branch)})
        self.log.info("turn %d: split into %d branches (%s)", point.turn, split.width, why)

    def _why(self, point: BranchPoint, cache: Rollout) -> str | None:
        if point.turn in self.config.at_turns:
            return f"turn {point.turn}"
        threshold = self.config.entropy_above
        if threshold is None:
            return None
        surprisal = turn_surprisal(cache, point.response_start)
        if surprisal is not None and surprisal > threshold:
            return f"mean surprisal {surprisal:.3f} > {threshold:g}"
        return None


class _Brancher:
    """What one branch's loop asks (:attr:`AgentInteraction.brancher`)."""

    def __init__(
        self,
        tree: TreeRollout,
        leaf: Leaf,
        interaction: AgentInteraction,
        resampled: int | None,
    ) -> None:
        self.tree, self.leaf, self.interaction = tree, leaf, interaction
        self.resampled = resampled

    def before(
        self, interaction: AgentInteraction, cache: Rollout, metrics: EpisodeMetrics
    ) -> BranchPoint | None:
        """Before a turn's generation: its state, when the turn may split."""
        turn = metrics.turns + 1
        if turn == self.resampled or not self.tree.may_split(turn):
            return None
        return BranchPoint(
            interaction.clone(interaction.env, interaction.log),
            self.leaf,
            turn,
            cache.branch(),
            _copy_metrics(metrics),
            len(cache.response_mask) if cache.mode == "tokens" else 0,
        )

    async def split(self, point: BranchPoint, cache: Rollout) -> None:
        await self.tree.split(point, cache, self.interaction)


def turn_surprisal(cache: Rollout, start: int) -> float | None:
    """The mean -log-prob of the tokens generated from response position ``start`` on
    (``None``: a rollout without log-probs)."""
    if cache.mode != "tokens" or not cache.has_logprobs:
        return None
    mask = cache.response_mask[start:]
    logprobs = cache.response_logprobs[start:]
    values = [-lp for m, lp in zip(mask, logprobs, strict=True) if m]
    return sum(values) / len(values) if values else None


def _compose(first: dict[str, str], then: dict[str, str]) -> dict[str, str]:
    """Root -> parent, then parent -> child: root -> child."""
    if not first:
        return dict(then)
    out = {}
    for root, there in first.items():
        out[root] = there
        for old, new in then.items():
            if there == old or there.startswith(old.rstrip("/") + "/"):
                out[root] = new + there[len(old) :]
    return out


def _copy_metrics(metrics: EpisodeMetrics) -> EpisodeMetrics:
    return EpisodeMetrics.from_dict(metrics.to_dict())
