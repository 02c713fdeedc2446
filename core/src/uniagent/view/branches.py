"""The branches of a saved trajectory tree, each as the linear rollout the token view shows:
root-to-leaf ids, mask and log-probs, one model call mark per turn on the path. A rollout
without a tree is its own one branch.

Two kinds of tree are saved in ``rollout.json``: a harness episode's (the gateway's record
of its model calls; its branches are its tree's leaves, in node order), and a tree
rollout's (``interaction.branching``: its branches are its ``leaves``, each one's token run
ending in its ``node``; the tree's ``splits`` are the branch points). :func:`tree_shape`
gives the latter's shape for drawing."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from uniagent.errors import ConfigError
from uniagent.rollout.exactness import ids_checksum


def _paths(tree: Mapping[str, Any]) -> list[list[Mapping[str, Any]]]:
    """Root-to-leaf node lists, leaves in the tree's node order."""
    nodes = {int(n["id"]): n for n in tree["nodes"]}
    parents = {int(n["parent"]) for n in tree["nodes"]}
    paths = []
    for node_id, node in nodes.items():
        if node_id in parents:
            continue
        path, here = [], node
        while True:
            path.append(here)
            parent = int(here["parent"])
            if parent == 0:
                break
            here = nodes[parent]
        paths.append(path[::-1])
    return paths


def _path_to(tree: Mapping[str, Any], node_id: int) -> list[Mapping[str, Any]]:
    """The root-to-``node_id`` node list."""
    nodes = {int(n["id"]): n for n in tree["nodes"]}
    path = [nodes[node_id]]
    while int(path[-1]["parent"]) != 0:
        path.append(nodes[int(path[-1]["parent"])])
    return path[::-1]


def tree_leaves(rollout: Mapping[str, Any]) -> list[Mapping[str, Any]] | None:
    """A tree rollout's leaves (as its record lists them); None for any other rollout."""
    tree = rollout.get("tree")
    leaves = tree.get("leaves") if isinstance(tree, Mapping) else None
    if not isinstance(leaves, list) or not leaves:
        return None
    return [leaf for leaf in leaves if isinstance(leaf, Mapping)]


def _leaf_branch(rollout: Mapping[str, Any], leaf: Mapping[str, Any], i: int) -> dict[str, Any]:
    node = leaf.get("node")
    path = _path_to(rollout["tree"], int(node)) if isinstance(node, int) else []
    return {
        "index": i,
        "leaf": str(leaf.get("leaf")),
        "node": node,
        "tokens": sum(len(n["ids"]) for n in path),
        "model_tokens": sum(sum(n["mask"]) for n in path),
        "turns": leaf.get("turns"),
        "reward": leaf.get("reward"),
        "exit_reason": leaf.get("exit_reason"),
    }


def branches(rollout: Mapping[str, Any]) -> list[dict[str, Any]]:
    """What the branch picker lists: per branch its leaf, tokens, turns and model tokens
    (a tree rollout's: per leaf, with its name, reward and exit reason)."""
    tree = rollout.get("tree")
    if not isinstance(tree, Mapping):
        return []
    leaves = tree_leaves(rollout)
    if leaves is not None:
        return [_leaf_branch(rollout, leaf, i) for i, leaf in enumerate(leaves)]
    out = []
    for i, path in enumerate(_paths(tree)):
        out.append(
            {
                "index": i,
                "leaf": int(path[-1]["id"]),
                "tokens": sum(len(n["ids"]) for n in path),
                "model_tokens": sum(sum(n["mask"]) for n in path),
                "turns": sum(len(n["turns"]) for n in path),
            }
        )
    return out


def branch_rollout(rollout: Mapping[str, Any], index: int) -> dict[str, Any]:
    """Branch ``index`` of the rollout's tree as a token-mode rollout snapshot."""
    tree = rollout.get("tree")
    if not isinstance(tree, Mapping):
        raise ConfigError("branch: this rollout holds no tree (it is one branch)")
    leaves = tree_leaves(rollout)
    if leaves is not None:
        return _leaf_rollout(rollout, leaves, index)
    paths = _paths(tree)
    if not 0 <= index < len(paths):
        raise ConfigError(f"branch: expected 0 to {len(paths) - 1}, got {index}")
    path = paths[index]
    turns = {int(t["index"]): t for t in tree["turns"]}
    on_path = [turns[int(i)] for node in path for i in node["turns"]]
    ids, mask, logprobs = _tokens(path)
    prompt = int(on_path[0]["prompt_len"]) if on_path else 0
    ends = [int(turn["prompt_len"]) + int(turn["generated"]) for turn in on_path]
    return _token_rollout(rollout, ("tree",), ids, mask, logprobs, prompt, ends)


def _tokens(path: list[Mapping[str, Any]]) -> tuple[list[int], list[int], list[float]]:
    """The ids, mask and log-probs along ``path`` (root first)."""
    ids = [int(i) for n in path for i in n["ids"]]
    mask = [int(m) for n in path for m in n["mask"]]
    logprobs = [float(x) for n in path for x in n["logprobs"]]
    return ids, mask, logprobs


def _token_rollout(
    rollout: Mapping[str, Any],
    drop: tuple[str, ...],
    ids: list[int],
    mask: list[int],
    logprobs: list[float],
    prompt: int,
    marks_at: list[int],
) -> dict[str, Any]:
    """A token-mode rollout snapshot of a path's tokens (the keys ``drop`` left out), with
    a model-call mark (context length and running checksum) at each of ``marks_at``."""
    marks: list[list[int]] = []
    crc, previous = 0, 0
    for end in marks_at:
        crc = ids_checksum(ids, previous, end, crc)
        marks.append([end, crc])
        previous = end
    return {
        **{k: v for k, v in rollout.items() if k not in drop},
        "mode": "tokens",
        "prompt_ids": ids[:prompt],
        "response_ids": ids[prompt:],
        "response_mask": mask[prompt:],
        "response_logprobs": logprobs[prompt:],
        "has_logprobs": True,
        "turn_marks": marks,
    }


def _leaf_rollout(
    rollout: Mapping[str, Any], leaves: list[Mapping[str, Any]], index: int
) -> dict[str, Any]:
    """Leaf ``index`` of a tree rollout as a token-mode rollout: its node's root-to-node
    tokens; the prompt ends where the model's first token is, and each model call is marked
    where a run of the model's tokens starts (the context it continued), as the loop's own
    ``turn_marks`` are (a tree rollout's tree records no turns)."""
    if not 0 <= index < len(leaves):
        raise ConfigError(f"branch: expected 0 to {len(leaves) - 1}, got {index}")
    leaf = leaves[index]
    node = leaf.get("node")
    if not isinstance(node, int):
        raise ConfigError(f"branch: leaf {leaf.get('leaf')} has no token run (message mode)")
    ids, mask, logprobs = _tokens(_path_to(rollout["tree"], node))
    prompt = mask.index(1) if 1 in mask else len(mask)
    starts = [
        start
        for start in range(prompt, len(mask))
        if mask[start] == 1 and (start == 0 or mask[start - 1] == 0)
    ]
    return _token_rollout(rollout, ("tree", "messages"), ids, mask, logprobs, prompt, starts)


def tree_shape(leaves: list[Mapping[str, Any]], splits: list[Mapping[str, Any]]) -> dict[str, Any]:
    """A tree rollout drawn from its leaves' branch paths and its splits: nested nodes, each
    ``{"name", "branch", "split", "children", "leaf"}``; an inner node's ``split`` is its
    branch point (``turn``, ``width``, ``why``; None where the record has none), a leaf's
    ``leaf`` is its entry with ``index`` (its branch in the token view) added."""
    by_name = {str(s.get("leaf")): s for s in splits if isinstance(s, Mapping)}
    rows = [
        {**leaf, "index": i, "branch": [int(b) for b in leaf.get("branch") or []]}
        for i, leaf in enumerate(leaves)
    ]

    def node(prefix: list[int]) -> dict[str, Any]:
        name = ".".join(str(b) for b in prefix) if prefix else "root"
        depth = len(prefix)
        under = [r for r in rows if r["branch"][:depth] == prefix]
        numbers = sorted({r["branch"][depth] for r in under if len(r["branch"]) > depth})
        here = next((r for r in under if r["branch"] == prefix), None)
        split = by_name.get(name) if numbers else None
        return {
            "name": name,
            "branch": prefix,
            "split": None if split is None else {k: split.get(k) for k in ("turn", "width", "why")},
            "children": [node([*prefix, n]) for n in numbers],
            "leaf": here,
        }

    return node([])
