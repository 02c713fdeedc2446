"""The trajectory tree of one gateway session: every token, every branch, exactly.

Each node holds a run of tokens (ids, mask, log-probs); a path from the root is a
context some request was given plus what the model generated from it. Generated ids
have mask 1 and their log-probs, observed ids (prompt, tool results, re-rendered
history) mask 0 and log-prob 0.0. Two paths share a node only while both their ids
and their masks agree, so a sample's mask marks exactly the tokens generated on it.
A turn (:class:`Turn`) is recorded on the node its generation ends in; a split keeps
the tail as the original node, so that reference never goes stale.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["Node", "Sample", "TrajectoryTree", "Turn"]


@dataclass
class Turn:
    """One served request: its wire request, how its prompt was built, what it generated."""

    index: int
    wire: str
    request: dict[str, Any]
    prompt_len: int
    generated: int
    source: str  # "extension" (exact ids of an earlier turn + rendered observations),
    # "identical" (the same prompt as an earlier turn) or "render" (a fresh render)
    finish_reason: str
    #: Whether the prompt ids equal a fresh render of the request (None: not checked yet).
    exact: bool | None = None
    drift: dict[str, Any] | None = None
    parse_error: str | None = None
    #: What a served backend reported that disagrees with our ids or our tokenizer
    #: (:class:`~uniagent.models.served.ServedTokenModel`); None when nothing did.
    server: dict[str, Any] | None = None
    messages: list[dict[str, Any]] = field(default_factory=list, repr=False)
    tools: list[dict[str, Any]] | None = field(default=None, repr=False)


class Node:
    """A run of tokens in the tree (see the module docstring)."""

    __slots__ = ("children", "id", "ids", "logprobs", "mask", "parent", "turns")

    def __init__(
        self,
        node_id: int,
        parent: Node | None,
        ids: list[int],
        mask: list[int],
        logprobs: list[float],
    ) -> None:
        self.id = node_id
        self.parent = parent
        self.ids, self.mask, self.logprobs = ids, mask, logprobs
        self.children: list[Node] = []
        self.turns: list[Turn] = []

    def path(self) -> list[Node]:
        """The nodes from the root's first child down to this one."""
        nodes: list[Node] = []
        node: Node | None = self
        while node is not None and node.parent is not None:
            nodes.append(node)
            node = node.parent
        return nodes[::-1]


@dataclass
class Sample:
    """One training sample: a leaf-to-root path (prompt = its first prompt, then the rest)."""

    leaf: int
    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_logprobs: list[float]
    #: Per response token: 1, or 1/k for a token shared by k samples (``shared_weight="1/k"``).
    response_weights: list[float]
    #: Every turn on the path has a prompt equal to a fresh render (None: not checked).
    exact: bool | None
    #: The turns (served requests) whose generation lies on the path.
    turns: int = 0


class TrajectoryTree:
    """A token trie whose root is empty; see the module docstring."""

    def __init__(self) -> None:
        self.root = Node(0, None, [], [], [])
        self._next_id = 1
        self.turns: list[Turn] = []

    # ------------------------------------------------------------------ building
    def context(self, node: Node) -> tuple[list[int], list[int], list[float]]:
        """Ids, mask and log-probs from the root to the end of ``node``."""
        ids: list[int] = []
        mask: list[int] = []
        logprobs: list[float] = []
        for n in node.path():
            ids += n.ids
            mask += n.mask
            logprobs += n.logprobs
        return ids, mask, logprobs

    def context_ids(self, node: Node) -> list[int]:
        """Ids from the root to the end of ``node``."""
        ids: list[int] = []
        for n in node.path():
            ids += n.ids
        return ids

    def insert(
        self, ids: list[int], mask: list[int], logprobs: list[float], start: Node | None = None
    ) -> Node:
        """Add the run after ``start``'s end (default: the root); return the node it ends in.

        Follows the longest common prefix (ids and masks) and branches where it ends,
        splitting a node if that is inside one.
        """
        node = start or self.root
        pos, total = 0, len(ids)
        while pos < total:
            child = next(
                (c for c in node.children if c.ids[0] == ids[pos] and c.mask[0] == mask[pos]),
                None,
            )
            if child is None:
                break
            n = len(child.ids)
            if ids[pos : pos + n] == child.ids and mask[pos : pos + n] == child.mask:
                node, pos = child, pos + n
                continue
            common = 1
            limit = min(n, total - pos)
            while (
                common < limit
                and child.ids[common] == ids[pos + common]
                and child.mask[common] == mask[pos + common]
            ):
                common += 1
            node, pos = self._split(child, common), pos + common
            if pos == total:
                return node
            break
        if pos == total:
            return node
        leaf = Node(self._next_id, node, ids[pos:], mask[pos:], logprobs[pos:])
        self._next_id += 1
        node.children.append(leaf)
        return leaf

    def _split(self, node: Node, at: int) -> Node:
        """Cut ``node`` after ``at`` tokens; the head is new, the tail stays ``node``."""
        parent = node.parent
        assert parent is not None and 0 < at < len(node.ids)
        head = Node(self._next_id, parent, node.ids[:at], node.mask[:at], node.logprobs[:at])
        self._next_id += 1
        parent.children[parent.children.index(node)] = head
        head.children = [node]
        node.parent = head
        node.ids, node.mask, node.logprobs = node.ids[at:], node.mask[at:], node.logprobs[at:]
        return head

    def record(self, node: Node, turn: Turn) -> None:
        """Attach ``turn`` to the node its generation ends in."""
        node.turns.append(turn)
        self.turns.append(turn)

    # ------------------------------------------------------------------ reading
    def nodes(self) -> Iterator[Node]:
        """Every node but the root, parents before children."""
        stack = list(reversed(self.root.children))
        while stack:
            node = stack.pop()
            yield node
            stack.extend(reversed(node.children))

    def leaves(self) -> list[Node]:
        """Nodes without children: one per branch."""
        return [n for n in self.nodes() if not n.children]

    def end_of(self, turn: Turn) -> Node:
        """The node ``turn``'s generation ends in."""
        return next(n for n in self.nodes() if any(t is turn for t in n.turns))

    def samples(self, *, shared_weight: str = "1") -> list[Sample]:
        """One sample per leaf; ``shared_weight="1/k"`` weighs a token shared by k samples 1/k."""
        if shared_weight not in ("1", "1/k"):
            raise ValueError(f"shared_weight must be '1' or '1/k', not {shared_weight!r}")
        below = self._leaf_counts()
        out: list[Sample] = []
        for leaf in self.leaves():
            ids: list[int] = []
            mask: list[int] = []
            logprobs: list[float] = []
            weights: list[float] = []
            exact: bool | None = True
            turns = 0
            for node in leaf.path():
                turns += len(node.turns)
                ids += node.ids
                mask += node.mask
                logprobs += node.logprobs
                k = below[node.id] if shared_weight == "1/k" else 1
                weights += [1.0 / k] * len(node.ids)
                for turn in node.turns:
                    if turn.exact is None and exact:
                        exact = None
                    elif turn.exact is False:
                        exact = False
            first = mask.index(1) if 1 in mask else len(mask)
            out.append(
                Sample(
                    leaf.id,
                    ids[:first],
                    ids[first:],
                    mask[first:],
                    logprobs[first:],
                    weights[first:],
                    exact,
                    turns,
                )
            )
        return out

    def _leaf_counts(self) -> dict[int, int]:
        counts: dict[int, int] = {}
        for node in reversed(list(self.nodes())):
            counts[node.id] = sum(counts[c.id] for c in node.children) if node.children else 1
        return counts

    # ------------------------------------------------------------------ serialising
    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready tree: nodes (parents first) with their tokens and turns."""
        return {
            "format": "uniagent.trajectory_tree/1",
            "nodes": [
                {
                    "id": n.id,
                    "parent": n.parent.id if n.parent is not None else 0,
                    "ids": n.ids,
                    "mask": n.mask,
                    "logprobs": n.logprobs,
                    "turns": [t.index for t in n.turns],
                }
                for n in self.nodes()
            ],
            "turns": [_turn_dict(t) for t in self.turns],
            "branches": len(self.leaves()),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrajectoryTree:
        """The tree :meth:`to_dict` wrote."""
        tree = cls()
        turns = {int(t["index"]): Turn(**t) for t in data["turns"]}
        tree.turns = [turns[i] for i in sorted(turns)]
        by_id = {0: tree.root}
        for row in data["nodes"]:
            parent = by_id[int(row["parent"])]
            node = Node(
                int(row["id"]),
                parent,
                [int(i) for i in row["ids"]],
                [int(m) for m in row["mask"]],
                [float(x) for x in row["logprobs"]],
            )
            if not len(node.ids) == len(node.mask) == len(node.logprobs):
                raise ValueError(f"node {node.id}: ids, mask and logprobs differ in length")
            node.turns = [turns[int(i)] for i in row["turns"]]
            parent.children.append(node)
            by_id[node.id] = node
        tree._next_id = max(by_id) + 1
        return tree


def _turn_dict(turn: Turn) -> dict[str, Any]:
    return asdict(turn)
