"""A harness episode's trajectory tree as verl samples: one per branch (no verl import).

A harness episode's tree (:class:`~uniagent.gateway.tree.TrajectoryTree`) has one branch
per leaf. :func:`branch_samples` turns each leaf-to-root path into one sample (prompt =
the path's first prompt, response = the rest, mask 1 exactly on the generated tokens),
the last-served branch last (verl's v1 trainer takes the last output of a ``run`` as the
episode's "final" one). Every sample of an episode carries the episode's reward and the
row's ``uid``: the episode stays one member of its prompt's GRPO group.

``shared_weight`` says what a token shared by k samples (a common prefix of k branches)
weighs in the loss:

- ``"1"`` (default): it is trained in each of the k samples (k times);
- ``"1/k"``: it weighs 1/k in each. verl 0.9.1 has no per-token loss weight (its policy
  loss reads ``response_mask`` as a 0/1 mask and its advantage estimators see only
  rewards, the mask and the ``uid``), so this is done exactly with the mask instead: the
  token stays under mask 1 in one of the k samples (the one that comes last) and is under
  mask 0 in the others. A shared token has the same context, log-probs and (outcome)
  advantage in all k samples, so training it once is the same gradient as weighing it
  1/k in each, under ``token-mean`` and the ``*-token-sum`` loss aggregations (not under
  ``seq-mean-token-mean``, which normalises per sample). docs/training.md has the details.

``branches`` says what a branching episode gives verl: ``"all"`` (one sample per branch,
where the worker takes several outputs of one ``run``: :func:`worker_takes_lists`) or
``"last"`` (the last-served branch only, as the classic trainer needs).
"""

from __future__ import annotations

import contextvars
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, replace
from typing import Any

from uniagent.errors import ConfigError
from uniagent.gateway.tree import Sample, TrajectoryTree

SHARED_WEIGHTS = ("1", "1/k")
BRANCHES = ("all", "last")
#: ``tree_advantage`` (tree rollouts of the built-in loop: :mod:`uniagent.verl.tree_advantage`).
TREE_ADVANTAGES = ("plain", "tree")

#: Set by a worker whose ``_agent_loop_postprocess`` takes a list of outputs
#: (:class:`uniagent.verl.worker.TreeAgentLoopWorker`) around each ``run`` it awaits.
TAKES_LISTS: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "uniagent_verl_takes_lists", default=False
)


def worker_takes_lists(row: Mapping[str, Any]) -> bool:
    """Whether the worker awaiting this ``run`` takes several outputs from it.

    verl 0.9.1's v1 worker (``AgentLoopWorkerTQ``, ``main_ppo``'s default) does: it passes
    each of a prompt's n rollouts a ``session_id`` and stores output i of a ``run`` under
    ``{uid}_{session_id}_{i}``. The classic ``AgentLoopWorker`` does not (it postprocesses
    one output per row); :class:`~uniagent.verl.worker.TreeAgentLoopWorker` does.
    """
    return TAKES_LISTS.get() or ("session_id" in row and "uid" in row)


@dataclass(frozen=True)
class TreeSettings:
    """The agent-loop YAML entry's ``branches``, ``shared_weight``, ``max_branches`` and
    ``tree_advantage``."""

    branches: str = "all"
    shared_weight: str = "1"
    #: At most this many samples per episode (the last-served branches): the policy can
    #: make branches (a harness's commands can reach its gateway session), so it must not
    #: choose how many votes its episode gets.
    max_branches: int = 8
    #: A tree rollout's advantage: ``plain`` (each leaf's reward against its GRPO group)
    #: or ``tree`` (per-segment advantages, :mod:`uniagent.verl.tree_advantage`).
    tree_advantage: str = "plain"

    @classmethod
    def pop_from(cls, kwargs: MutableMapping[str, Any], *, source: str) -> TreeSettings:
        """Take the keys out of the entry's kwargs (the rest is the agent config)."""
        values: dict[str, Any] = {}
        if "max_branches" in kwargs:
            raw = kwargs.pop("max_branches")
            if isinstance(raw, bool) or not isinstance(raw, int) or raw < 1:
                raise ConfigError(
                    f"{source}: max_branches must be a whole number >= 1, not {raw!r}"
                )
            values["max_branches"] = raw
        for key, allowed in (
            ("branches", BRANCHES),
            ("shared_weight", SHARED_WEIGHTS),
            ("tree_advantage", TREE_ADVANTAGES),
        ):
            if key not in kwargs:
                continue
            raw = kwargs.pop(key)
            value = str(raw) if isinstance(raw, int | str) and not isinstance(raw, bool) else None
            if value not in allowed:
                raise ConfigError(
                    f"{source}: {key} must be one of {', '.join(repr(a) for a in allowed)}, "
                    f"not {raw!r}"
                )
            values[key] = value
        return cls(**values)


def branch_samples(
    tree: Mapping[str, Any], *, shared_weight: str = "1", limit: int | None = None
) -> list[Sample]:
    """One sample per leaf of a saved tree (``TrajectoryTree.to_dict``), the last-served
    branch last (at most ``limit``: the last ones); under ``"1/k"`` a shared token's mask is
    1 in the last sample holding it only (``response_weights`` keep the 1/k); see the module
    docstring."""
    if shared_weight not in SHARED_WEIGHTS:
        raise ValueError(f"shared_weight must be '1' or '1/k', not {shared_weight!r}")
    live = TrajectoryTree.from_dict(tree)
    leaves = live.leaves()
    samples = live.samples(shared_weight=shared_weight)  # in the order of leaves()
    if not leaves:
        return []
    last = len(leaves) - 1
    if live.turns:
        end = live.end_of(live.turns[-1])
        holding = [i for i, leaf in enumerate(leaves) if end in leaf.path()]
        last = holding[-1] if holding else last
    order = [i for i in range(len(leaves)) if i != last] + [last]
    if limit is not None:
        order = order[-limit:]
    paths = [leaves[i].path() for i in order]
    owner: dict[int, int] = {}  # node id -> the last sample (in order) whose path holds it
    for j, path in enumerate(paths):
        for node in path:
            owner[node.id] = j
    out: list[Sample] = []
    for j, (i, path) in enumerate(zip(order, paths, strict=True)):
        sample = samples[i]
        if shared_weight == "1/k":
            node_of = [node.id for node in path for _ in node.ids][len(sample.prompt_ids) :]
            mask = [
                m if owner[n] == j else 0
                for m, n in zip(sample.response_mask, node_of, strict=True)
            ]
            sample = replace(sample, response_mask=mask)
        out.append(sample)
    return out
