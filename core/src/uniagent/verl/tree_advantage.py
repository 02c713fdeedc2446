"""Tree advantages of a tree rollout's leaves (``tree_advantage: tree``), pure Python (no verl).

A tree rollout (``interaction.branching``) gives one sample per leaf. Its leaves' token runs
(prompt, then every generated and observed token) form a trajectory tree
(:class:`~uniagent.gateway.tree.TrajectoryTree`): a shared prefix is one node, each
branch's own tokens are nodes below it. Following tree-structured RL (TreeRL, Hou et al.
2025), each node is a segment with a value and an advantage:

- a node's value ``V(n)`` is the mean reward of the leaves under it;
- the tree root's value is the mean reward of all the tree's leaves;
- a node's advantage is ``A(n) = V(n) - V(parent(n))``: what taking this segment changed
  about the expected reward, given the context before it.

Every generated token (mask 1) of a leaf's sample carries the advantage of the node it lies
in; observed tokens (mask 0) carry none. Along one leaf's path the advantages add up to
``V(leaf) - V(root)``: its reward minus the tree's mean.

Masked leaves (``traj_masked``: an infrastructure failure, a cut prompt) are left out of the
tree: the values, the nodes and so every sibling's advantages are exactly those of the tree
without them (as ``uniagent_grpo`` leaves a masked sample's group as if it were absent), so a
flaky sandbox does not change what its siblings learn. A masked leaf's own advantages are 0
(its sample trains no token anyway); a tree without an unmasked leaf gives 0 everywhere.

:func:`tree_token_scores` turns a sample's advantages into additions to verl's
``rm_scores`` such that every trained token's score IS its advantage (what the
``uniagent_tree`` estimator, :mod:`uniagent.verl.advantage`, hands the policy loss), while
the row's score still sums to the leaf's reward: the rest sits on an untrained token.
"""

from __future__ import annotations

from collections.abc import Sequence
from statistics import fmean

from uniagent.gateway.tree import Node, TrajectoryTree

#: One leaf's token run: ids and mask from the first prompt token on (None: no tokens).
Run = tuple[Sequence[int], Sequence[int]] | None


def leaf_advantages(
    runs: Sequence[Run], rewards: Sequence[float | None], kept: Sequence[bool]
) -> list[list[float]]:
    """Per leaf, per token of its run: the advantage of the node the token lies in on a
    generated token (mask 1), 0.0 on an observed one (see the module docstring).

    ``rewards[i]`` and ``kept[i]`` (unmasked) are leaf i's; a leaf that is not kept, has no
    reward or no run is left out of the tree (its advantages are all 0.0). Two leaves with
    the same tokens end in the same node (its value is their mean).
    """
    if not len(runs) == len(rewards) == len(kept):
        raise ValueError(f"{len(runs)} runs, {len(rewards)} rewards, {len(kept)} kept flags")
    tree = TrajectoryTree()
    ends: list[Node | None] = []
    for run, reward, keep in zip(runs, rewards, kept, strict=True):
        if run is None:
            ends.append(None)
            continue
        ids, mask = [int(i) for i in run[0]], [int(m) for m in run[1]]
        if len(ids) != len(mask):
            raise ValueError(f"a run of {len(ids)} ids with {len(mask)} mask entries")
        ends.append(
            tree.insert(ids, mask, [0.0] * len(ids))
            if ids and keep and reward is not None
            else None
        )
    under: dict[int, list[float]] = {}  # node id -> rewards of the kept leaves under it
    for end, reward in zip(ends, rewards, strict=True):
        if end is None or reward is None:
            continue
        under.setdefault(tree.root.id, []).append(float(reward))
        for node in end.path():
            under.setdefault(node.id, []).append(float(reward))

    def value(node: Node) -> float | None:
        values = under.get(node.id)
        return fmean(values) if values else None

    out: list[list[float]] = []
    for run, end in zip(runs, ends, strict=True):
        if end is None:
            out.append([0.0] * (len(run[0]) if run is not None else 0))
            continue
        advantages: list[float] = []
        for node in end.path():
            mine = value(node)
            above = value(node.parent) if node.parent is not None else None
            advantage = mine - above if mine is not None and above is not None else 0.0
            advantages += [advantage if m else 0.0 for m in node.mask]
        out.append(advantages)
    return out


def tree_token_scores(
    advantages: Sequence[float], response_mask: Sequence[int], reward: float
) -> tuple[list[list[float]], bool]:
    """``([[position, addition], ...], balanced)``: what to add to a sample's ``rm_scores``
    (verl puts ``reward`` on its last response token) so that every token under mask 1
    scores its advantage, and the last token under mask 0 holds the rest, so that the row
    still sums to ``reward`` (verl's score metrics, and any estimator reading sums, see the
    leaf's reward). ``balanced`` is False for a response with no token under mask 0: its
    row sums to its advantages.

    ``advantages`` and ``response_mask`` are over the sample's response (as long as it).
    """
    n = len(response_mask)
    if len(advantages) != n or n == 0:
        raise ValueError(f"{len(advantages)} advantages for a response of {n} tokens")
    total = [float(a) if m else 0.0 for a, m in zip(advantages, response_mask, strict=True)]
    carrier = next((p for p in range(n - 1, -1, -1) if not response_mask[p]), None)
    if carrier is not None:
        total[carrier] = float(reward) - sum(total)
    placed = [0.0] * n
    placed[n - 1] = float(reward)
    additions = [[p, total[p] - placed[p]] for p in range(n) if total[p] - placed[p] != 0.0]
    return additions, carrier is not None
