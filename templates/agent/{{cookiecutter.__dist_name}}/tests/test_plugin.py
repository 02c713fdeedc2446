"""The plugin is found once installed, and its agent solves a task through `uniagent run`:
in a real sandbox, with the gateway in front of a scripted model on the real Qwen3
tokenizer; the reward is graded and the trajectory tree saved."""

from __future__ import annotations

import json
from pathlib import Path

from uniagent import get_registry
from uniagent.testing import ScriptedTokenModel, hermes_call, load_qwen3_tokenizer, run_tasks

AGENT = "{{ cookiecutter.__record_name }}"


def test_plugin_is_discovered() -> None:
    """After ``pip install``, uniagent lists the agent as this distribution's."""
    assert get_registry().agents()[AGENT].distribution == "{{ cookiecutter.__dist_name }}"


async def test_agent_solves_a_task_through_uniagent_run(tmp_path: Path) -> None:
    """The model's call writes the file, the reward finds it, the tree is one branch."""
    config = {
        "agent": {"name": AGENT, "settings": {"steps": 5}},
        "env": {"deployment": {"type": "host", "isolation": "bwrap", "network": True}},
        "reward": {"name": "command", "settings": {"command": "grep -qx hello out.txt"}},
    }
    script = [hermes_call("bash", {"command": "echo hello > out.txt"}), "Done."]
    model = ScriptedTokenModel(load_qwen3_tokenizer(), script)
    out = tmp_path / "out"
    tasks = {"hello": {"problem_statement": "Write hello into out.txt."}}
    await run_tasks(config, tasks, model, out)
    episode = out / "episodes" / "hello" / "0"
    result = json.loads((episode / "result.json").read_text())
    assert result["exit_reason"] == "finished", (episode / "log.txt").read_text()[-2000:]
    assert result["reward"] == 1.0 and result["submission"] == "Done."
    tree = json.loads((episode / "rollout.json").read_text())["tree"]
    assert tree["branches"] == 1 and [t["exact"] for t in tree["turns"]] == [True, True]
