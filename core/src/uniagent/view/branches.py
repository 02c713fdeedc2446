"""The branches of a saved trajectory tree (a harness episode's ``rollout.json``), each as
the linear rollout the token view shows: root-to-leaf ids, mask and log-probs, one model
call mark per turn on the path. A rollout without a tree is its own one branch."""

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


def branches(rollout: Mapping[str, Any]) -> list[dict[str, Any]]:
    """What the branch picker lists: per branch its leaf, tokens, turns and model tokens."""
    tree = rollout.get("tree")
    if not isinstance(tree, Mapping):
        return []
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
    paths = _paths(tree)
    if not 0 <= index < len(paths):
        raise ConfigError(f"branch: expected 0 to {len(paths) - 1}, got {index}")
    path = paths[index]
    turns = {int(t["index"]): t for t in tree["turns"]}
    on_path = [turns[int(i)] for node in path for i in node["turns"]]
    ids = [int(i) for n in path for i in n["ids"]]
    mask = [int(m) for n in path for m in n["mask"]]
    logprobs = [float(x) for n in path for x in n["logprobs"]]
    prompt = int(on_path[0]["prompt_len"]) if on_path else 0
    marks: list[list[int]] = []
    crc, previous = 0, 0
    for turn in on_path:
        end = int(turn["prompt_len"]) + int(turn["generated"])
        crc = ids_checksum(ids, previous, end, crc)
        marks.append([end, crc])
        previous = end
    return {
        **{k: v for k, v in rollout.items() if k != "tree"},
        "mode": "tokens",
        "prompt_ids": ids[:prompt],
        "response_ids": ids[prompt:],
        "response_mask": mask[prompt:],
        "response_logprobs": logprobs[prompt:],
        "has_logprobs": True,
        "turn_marks": marks,
    }
