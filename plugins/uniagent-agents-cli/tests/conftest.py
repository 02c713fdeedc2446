"""Shared set-up: an agent config for a harness, a run through `uniagent run`, its files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from uniagent import AgentConfig
from uniagent.testing import load_qwen3_tokenizer, run_harbor_tasks, run_tasks

TASK = {"hello": {"problem_statement": "Write hello into out.txt, then stop."}}
#: A Harbor Dockerfile task of the core's tests (validated by Harbor's own code there):
#: write hello into /app/hello.txt; [agent] timeout_sec = 300.
HARBOR_TASK = Path(__file__).resolve().parents[3] / "core/tests/data/harbor/good/hello-file"
#: The command reward: the task is solved when out.txt holds exactly "hello".
SOLVED = "grep -qx hello out.txt"


def harness_config(name: str, settings: dict[str, Any] | None = None) -> AgentConfig:
    """A config running harness ``name`` in a bubblewrap sandbox that can reach the gateway."""
    return AgentConfig.from_dict(
        {
            "agent": {"name": name, "settings": settings or {}},
            "env": {"deployment": {"type": "host", "isolation": "bwrap", "network": True}},
            "reward": {"name": "command", "settings": {"command": SOLVED}},
        }
    )


async def run_one(config: AgentConfig, model: Any, out: Path) -> dict[str, Any]:
    """One episode through `uniagent run`; its result, rollout and log."""
    summary = await run_tasks(config, TASK, model, out)
    episode = out / "episodes" / "hello" / "0"
    return {
        "summary": summary,
        "result": json.loads((episode / "result.json").read_text()),
        "rollout": json.loads((episode / "rollout.json").read_text()),
        "log": (episode / "log.txt").read_text(),
    }


async def run_harbor(
    config: AgentConfig,
    task: Path,
    model: Any,
    out: Path,
    from_image: str | None = None,
    **options: Any,
) -> dict[str, Any]:
    """`uniagent run CONFIG --data TASK --from-image IMAGE` in this process, with ``model``
    and the run's ``options``; the episode's files (no rollout for an episode that never
    started)."""
    summary = await run_harbor_tasks(config, task, model, out, from_image=from_image, **options)
    episode = out / "episodes" / task.name / "0"
    rollout = episode / "rollout.json"
    return {
        "summary": summary,
        "result": json.loads((episode / "result.json").read_text()),
        "rollout": json.loads(rollout.read_text()) if rollout.exists() else None,
        "log": (episode / "log.txt").read_text(),
    }


@pytest.fixture(scope="session")
def qwen3_tokenizer() -> Any:
    """The real Qwen3 tokenizer (from the cache)."""
    return load_qwen3_tokenizer()


def _path_of(tree: dict[str, Any]) -> tuple[list[int], list[int]]:
    """The ids and mask from the root to the tree's one leaf."""
    nodes = {n["id"]: n for n in tree["nodes"]}
    chain, node = [], max(nodes)  # one branch: the last node is its leaf
    while node:
        chain.append(nodes[node])
        node = nodes[node]["parent"]
    ids = [i for n in reversed(chain) for i in n["ids"]]
    mask = [m for n in reversed(chain) for m in n["mask"]]
    return ids, mask


def check_exact(rollout: dict[str, Any], script: list[str], tokenizer: Any) -> None:
    """One branch, every turn exact, every generated id in it (mask 1, in order), and the
    linear rollout (what readers of a built-in loop's episode read) that branch exactly."""
    tree = rollout["tree"]
    assert tree["branches"] == 1
    assert [t["source"] for t in tree["turns"]] == ["render"] + ["extension"] * (len(script) - 1)
    assert [t["exact"] for t in tree["turns"]] == [True] * len(script), tree["turns"]
    eot = rollout["eot_id"]
    wanted = [i for s in script for i in [*tokenizer.encode(s, add_special_tokens=False), eot]]
    ids, mask = _path_of(tree)
    assert [i for i, m in zip(ids, mask) if m] == wanted
    assert rollout["prompt_ids"] + rollout["response_ids"] == ids
    assert rollout["response_mask"] == mask[len(rollout["prompt_ids"]) :]
    assert rollout["messages"][-1]["role"] == "assistant"


def check_solved(
    done: dict[str, Any], script: list[str], tokenizer: Any, wire: str | None = None
) -> None:
    """The episode finished on the policy's own terms, scored 1 and is trained on; with
    ``wire``, its first request came on that wire, streamed; its tree is token-exact
    (:func:`check_exact`)."""
    result = done["result"]
    assert result["exit_reason"] == "finished", (result, done["log"][-3000:])
    assert result["reward"] == 1.0 and result["traj_masked"] is False
    assert result["outcome"] == "policy"
    if wire is not None:
        first = done["rollout"]["tree"]["turns"][0]
        assert first["wire"] == wire and first["request"]["stream"] is True
    check_exact(done["rollout"], script, tokenizer)
