"""Tree rollouts (``interaction.branching``): an episode forks its sandbox mid-way and goes on
several ways; every leaf is graded in its own sandbox with the root's baseline.

Real parts: the tiny example task set (git repositories, unittest tests, the ``command``
reward with its integrity checks), real host sandboxes (none and bubblewrap) and their
forks, podman containers, the real Qwen3 tokenizer; the policy is scripted. The tools are
two of this file's (a shell command, a finish): the core's tests need no plugin.
"""

from __future__ import annotations

import io
import itertools
import json
import os
import shutil
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from uniagent import ToolSpec, hookimpl
from uniagent.config import AgentConfig
from uniagent.episode import EpisodeResult, run_episode
from uniagent.errors import ConfigError
from uniagent.plugins import load_plugins, reset_plugins
from uniagent.resolver import resolve
from uniagent.rollout import Rollout
from uniagent.run.progress import Progress
from uniagent.run.runner import run
from uniagent.tasks import load_tasks
from uniagent.testing.scripted import ScriptedTokenModel, hermes_call

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "swe_tiny"
NEEDS_BWRAP = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
ISOLATIONS = ["none", pytest.param("bwrap", marks=NEEDS_BWRAP)]
TEST = "python3 -m unittest discover -s tests"
FIX = "sed -i 's|/ len(values)$|/ len(values) if values else 0.0|' stats.py"
WRONG = "sed -i 's|len(values)|(len(values) + 1)|' stats.py"
TAMPER = "printf 'import unittest\\n' > tests/test_stats.py"


class Command(BaseModel):
    command: str


class NoArgs(BaseModel):
    pass


SHELL = ToolSpec(
    name="tree_shell", description="Run a bash command.", arguments=Command,
    render=lambda a: a["command"],
)  # fmt: skip
FINISH = ToolSpec(
    name="tree_done", description="Finish.", arguments=NoArgs, render=lambda a: "echo done",
    ends_episode=True,
)  # fmt: skip


@pytest.fixture(autouse=True)
def tools() -> Iterator[None]:
    """``tree_shell`` and ``tree_done`` registered as a plugin; the plugins are reset after."""
    reset_plugins()

    @hookimpl
    def uniagent_tools() -> list[ToolSpec]:
        return [SHELL, FINISH]

    load_plugins().register(types.SimpleNamespace(uniagent_tools=uniagent_tools), "tree-tools")
    yield
    reset_plugins()


@pytest.fixture(scope="module")
def tasks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("swe_tiny")
    subprocess.run(
        [sys.executable, str(EXAMPLE / "make_tasks.py"), str(out)], check=True, capture_output=True
    )
    return out / "tasks.jsonl"


def config(isolation: str, **branching: Any) -> AgentConfig:
    data = yaml.safe_load((EXAMPLE / "config.yaml").read_text())
    data["tools"] = ["tree_shell", "tree_done"]
    data["env"]["deployment"]["isolation"] = isolation
    data["interaction"]["branching"] = branching or {"at_turns": [2], "width": 4}
    return AgentConfig.from_dict(data)


def turn_of(cache: Rollout) -> int:
    """The model turn about to be generated (from 1)."""
    return cache.num_turns + 1


def policy(second_turns: list[str]) -> Any:
    """Turn 1 reads the code; turn 2 runs the next of ``second_turns`` (each branch samples
    its own: the order they are generated in does not change which ones there are);
    turn 3 runs the tests, turn 4 submits."""
    pending = iter(second_turns)

    def reply(cache: Rollout) -> str:
        turn = turn_of(cache)
        if turn == 1:
            return hermes_call("tree_shell", {"command": "cat stats.py"}, "Let me look.")
        if turn == 2:
            return hermes_call("tree_shell", {"command": next(pending)})
        if turn == 3:
            return hermes_call("tree_shell", {"command": TEST})
        return hermes_call("tree_done")

    return reply


async def run_tree(
    tasks_file: Path, agent: AgentConfig, second_turns: list[str], out: Path, qwen3_tokenizer: Any
) -> tuple[dict[str, Any], list[dict[str, Any]], ScriptedTokenModel]:
    tasks, bad = load_tasks(tasks_file)
    mean = [t for t in tasks if t.id == "mean-empty"]
    model = ScriptedTokenModel(qwen3_tokenizer, policy=policy(second_turns))
    stream = io.StringIO()
    summary = await run(agent, mean, bad, lambda: model, out, progress=Progress(stream, live=False))
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    solved = sum(1 for r in rows if r["reward"] == 1.0)
    assert f"; {len(rows)} leaves, {solved} solved" in stream.getvalue()
    return summary, rows, model


@pytest.mark.parametrize("isolation", ISOLATIONS)
async def test_a_tree_of_four_leaves_each_graded_in_its_own_sandbox(
    isolation: str, tasks: Path, qwen3_tokenizer: Any, tmp_path: Path
) -> None:
    summary, rows, _ = await run_tree(
        tasks,
        config(isolation),
        [FIX, WRONG, FIX + " # again", WRONG + " # again"],
        tmp_path / "out",
        qwen3_tokenizer,
    )
    assert sorted(r["leaf"] for r in rows) == ["0", "1", "2", "3"]
    assert all(r["exit_reason"] == "finished" for r in rows), rows
    assert sorted(r["reward"] for r in rows) == [0.0, 0.0, 1.0, 1.0], rows
    assert summary["episodes"] == 4 and summary["mean_reward"] == 0.5

    episode = tmp_path / "out" / "episodes" / "mean-empty" / "0"
    rollout = json.loads((episode / "rollout.json").read_text())
    # Under bubblewrap as root, the episode's sandbox is layered first: forks copy only
    # what the agent wrote.
    layered = "forks copy only what the agent writes" in (episode / "log.txt").read_text()
    assert layered == (isolation == "bwrap" and os.geteuid() == 0)
    tree = rollout["tree"]
    assert [s["turn"] for s in tree["splits"]] == [2] and tree["splits"][0]["width"] == 4
    leaves = {leaf["leaf"]: leaf for leaf in tree["leaves"]}
    assert sorted(leaves) == ["0", "1", "2", "3"]
    assert sorted(leaf["reward"] for leaf in leaves.values()) == [0.0, 0.0, 1.0, 1.0]
    # One shared prefix (the prompt, turn 1 and its output), then four branches whose
    # turn-2 tokens differ: every leaf's path starts with the same node.
    assert tree["branches"] == 4
    nodes = {n["id"]: n for n in tree["nodes"]}
    tops = [n for n in nodes.values() if n["parent"] == 0]
    assert len(tops) == 1
    top = tops[0]
    runs = [k for k, _ in itertools.groupby(top["mask"])]
    assert runs[:3] == [0, 1, 0], "the prompt, turn 1's generation, its tool output"
    for leaf in leaves.values():
        node = nodes[leaf["node"]]
        while node["parent"] != 0:
            node = nodes[node["parent"]]
        assert node is top


async def test_a_leaf_that_tampers_scores_zero_and_its_siblings_keep_theirs(
    tasks: Path, qwen3_tokenizer: Any, tmp_path: Path
) -> None:
    isolation = "bwrap" if shutil.which("bwrap") else "none"
    _, rows, _ = await run_tree(
        tasks, config(isolation), [FIX, TAMPER + " && " + FIX, FIX, WRONG],
        tmp_path / "out", qwen3_tokenizer,
    )  # fmt: skip
    by_reward = sorted((r["reward"], r["reward_info"].get("score_reason", "")) for r in rows)
    assert by_reward == [(0.0, ""), (0.0, "tampered"), (1.0, ""), (1.0, "")], rows


def test_branching_needs_a_backend_that_forks() -> None:
    data = config("none").model_dump(exclude_unset=True)
    data["env"]["deployment"] = {"type": "remote", "host": "http://127.0.0.1:1"}
    with pytest.raises(ConfigError, match="the 'remote' sandbox backend cannot fork"):
        resolve(AgentConfig.from_dict(data))
    data["env"]["deployment"] = {"type": "host", "binds": ["/tmp:/shared"]}
    with pytest.raises(ConfigError, match="binds are shared by a sandbox and its forks"):
        resolve(AgentConfig.from_dict(data))


def test_branching_is_refused_for_a_harness_and_its_settings_are_checked(tiny: Any) -> None:
    data = yaml.safe_load((EXAMPLE / "config.yaml").read_text())
    data["tools"] = []
    data["interaction"]["branching"] = {"at_turns": [2]}
    data["agent"] = {"name": "tiny"}
    data["env"]["deployment"]["network"] = True
    with pytest.raises(ConfigError, match="built-in loop"):
        resolve(AgentConfig.from_dict(data))
    for bad, message in [
        ({"at_turns": [0]}, "turns count from 1"),
        ({"width": 1}, "greater than or equal to 2"),
        ({"at_turns": [2], "depth": 3}, "interaction.branching.depth"),
    ]:
        data = yaml.safe_load((EXAMPLE / "config.yaml").read_text())
        data["interaction"]["branching"] = bad
        with pytest.raises(ConfigError, match=message):
            AgentConfig.from_dict(data)


def test_a_trees_lines_are_one_record_again_and_a_retry_replaces_them_all(tmp_path: Path) -> None:
    from uniagent.run.results import ResultsFile, is_infra_failure, latest

    def tree(rewards: list[float | None], reasons: list[str]) -> dict[str, Any]:
        rows = [
            {"task_id": "t", "sample": 0, "leaf": str(i), "reward": r, "exit_reason": e}
            for i, (r, e) in enumerate(zip(rewards, reasons, strict=True))
        ]
        return {**rows[0], "leaf_rows": rows, "attempt": 1, "episode_dir": "x"}

    results = ResultsFile(tmp_path / "results.jsonl")
    failed = tree([1.0, None, 0.0], ["finished", "reward_error", "finished"])
    assert is_infra_failure(failed), "one leaf's infrastructure failure runs the tree again"
    results.append(failed)
    results.append({"task_id": "u", "sample": 0, "reward": 1.0, "exit_reason": "finished"})
    results.append(tree([1.0, 0.0], ["finished", "finished"]))
    lines = results.load()
    assert len(lines) == 6 and all(line["episode_dir"] == "x" for line in lines[:3])
    found = latest(lines)
    assert [r["leaf"] for r in found[("t", 0)]["leaf_rows"]] == ["0", "1"]
    assert not is_infra_failure(found[("t", 0)]) and "leaf_rows" not in found[("u", 0)]
    # A crash that cut a tree's lines short leaves fewer leaves than it had: run it again.
    cut = latest(lines[4:5])[("t", 0)]  # the first of the second tree's two leaf lines
    assert cut["exit_reason"] == "finished" and len(cut["leaf_rows"]) == 1
    assert is_infra_failure(cut)


async def episode(
    tasks_file: Path, agent_config: AgentConfig, model: ScriptedTokenModel
) -> EpisodeResult:
    """One tree rollout of the mean-empty task through ``run_episode``."""
    loaded, _ = load_tasks(tasks_file)
    task = next(t for t in loaded if t.id == "mean-empty")
    agent = resolve(agent_config).for_task(task.overrides(), source="test")
    return await run_episode(agent, task.row, model)


@pytest.mark.parametrize("isolation", ISOLATIONS)
async def test_every_leaf_is_token_exact_and_shares_the_prefix_ids(
    isolation: str, tasks: Path, qwen3_tokenizer: Any
) -> None:
    model = ScriptedTokenModel(
        qwen3_tokenizer, policy=policy([FIX, WRONG, FIX + " #", WRONG + " #"])
    )
    result = await episode(tasks, config(isolation), model)
    assert result.leaves is not None and len(result.leaves) == 4
    prefix = None
    for leaf in result.leaves:
        assert leaf.cache is not None
        report = leaf.cache.check_exactness()
        assert report.ok, (leaf.leaf, report.summary())  # prefix invariant, no drift
        # Everything before turn 2's generation is the same ids in every leaf.
        turn2 = leaf.cache.turn_context_lengths[1]
        ids = [*leaf.cache.prompt_ids, *leaf.cache.response_ids][:turn2]
        assert prefix is None or ids == prefix
        prefix = ids
        assert leaf.metrics.turns == 4 and leaf.exit_reason.value == "finished"
    assert sorted(leaf.reward or 0.0 for leaf in result.leaves) == [0.0, 0.0, 1.0, 1.0]


async def test_an_uncertain_turn_splits_and_the_leaf_budget_holds(
    tasks: Path, qwen3_tokenizer: Any
) -> None:
    # The scripted log-probs are -0.01 to -0.97 per token: a mean surprisal of about 0.5,
    # so every turn is "uncertain" at 0.1 and none at 5.
    calm = config("none", entropy_above=5.0)
    model = ScriptedTokenModel(qwen3_tokenizer, policy=policy([FIX]))
    result = await episode(tasks, calm, model)
    assert result.leaves is not None and len(result.leaves) == 1 and not result.splits
    unsure = config("none", entropy_above=0.1, width=2, max_leaves=3)
    model = ScriptedTokenModel(qwen3_tokenizer, policy=policy([FIX, WRONG, FIX, WRONG]))
    result = await episode(tasks, unsure, model)
    assert result.leaves is not None and len(result.leaves) == 3  # max_leaves
    # Turn 1 splits the root in two; the new branch samples turn 1 anew (no split there
    # again); the one of the two that reaches turn 2 first takes the last leaf.
    assert [s["turn"] for s in result.splits] == [1, 2]
    assert all("surprisal" in s["why"] for s in result.splits)
    names = sorted(leaf.leaf or "" for leaf in result.leaves)
    assert names in (["0.0", "0.1", "1"], ["0", "1.0", "1.1"]), names


@pytest.mark.parametrize("isolation", ISOLATIONS)
async def test_leaves_graded_in_fresh_sandboxes(
    isolation: str, tasks: Path, qwen3_tokenizer: Any
) -> None:
    agent_config = config(isolation)
    data = agent_config.model_dump(exclude_unset=True)
    data["reward"]["grade_in"] = "fresh"
    model = ScriptedTokenModel(
        qwen3_tokenizer, policy=policy([FIX, TAMPER + " && " + FIX, WRONG, FIX + " #"])
    )
    result = await episode(tasks, AgentConfig.from_dict(data), model)
    assert result.leaves is not None
    graded = sorted(
        (leaf.reward, leaf.reward_info.get("score_reason", "")) for leaf in result.leaves
    )
    assert graded == [(0.0, ""), (0.0, "tampered"), (1.0, ""), (1.0, "")], graded
    assert all(leaf.reward_info["integrity"]["grade_in"] == "fresh" for leaf in result.leaves)


#: A container image with what the tiny tasks need (Debian's Python and git), built offline
#: once per machine (the integrity tests use the same one).
GRADING_IMAGE = "localhost/uniagent-integrity:bookworm"
GRADING_PACKAGES = ("python3", "python3-venv", "python3-pytest", "git")


@pytest.mark.parametrize("grade_in", ["episode", "fresh"])
async def test_a_tree_in_podman_containers(
    grade_in: str, tasks: Path, qwen3_tokenizer: Any, tmp_path: Path
) -> None:
    """The same tree on the ``local`` backend: each fork a commit of the container and a
    new container from it; each leaf graded in its own container (or a fresh one)."""
    from uniagent.testing.images import engine_with_test_image

    engine = engine_with_test_image(GRADING_IMAGE, packages=GRADING_PACKAGES)
    repos = str(tasks.parent / "repos")
    rows = [json.loads(line) for line in tasks.read_text().splitlines()]
    for row in rows:  # the repository comes in through a volume, not a host bind
        del row["config_overrides"]["env"]["deployment"]
    moved = tmp_path / "tasks.jsonl"
    moved.write_text("".join(json.dumps(r) + "\n" for r in rows))
    data = config("none").model_dump(exclude_unset=True)
    data["env"]["workdir"] = "/testbed"
    data["env"]["deployment"] = {
        "type": "local", "image": GRADING_IMAGE, "engine": engine, "pull": "never",
        "run_args": ["-v", f"{repos}:{repos}:ro"],
    }  # fmt: skip
    data["reward"]["grade_in"] = grade_in
    model = ScriptedTokenModel(
        qwen3_tokenizer, policy=policy([FIX, TAMPER + " && " + FIX, WRONG, FIX + " #"])
    )
    result = await episode(moved, AgentConfig.from_dict(data), model)
    assert result.leaves is not None and len(result.leaves) == 4
    graded = sorted(
        (leaf.reward, leaf.reward_info.get("score_reason", "")) for leaf in result.leaves
    )
    assert graded == [(0.0, ""), (0.0, "tampered"), (1.0, ""), (1.0, "")], graded
    for leaf in result.leaves:
        assert leaf.cache is not None and leaf.cache.check_exactness().ok
