"""A Harbor task's ``[agent] timeout_sec`` bounds a harness's own time: Codex, in a
bubblewrap sandbox, running a command that outlasts it is ended there (the policy's
``timeout_error``, trained on and graded); a model slower than the whole limit is not
counted against it (the harness finishes and scores)."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

from conftest import HARBOR_TASK, run_harbor

from uniagent import AgentConfig
from uniagent.testing import ScriptedTokenModel, hermes_call


def with_agent_timeout(tmp_path: Path, seconds: float) -> Path:
    """The Harbor task with ``[agent] timeout_sec = seconds``."""
    task = tmp_path / "hello-file"
    shutil.copytree(HARBOR_TASK, task)
    toml = task / "task.toml"
    old = "[agent]\ntimeout_sec = 300.0"
    assert old in toml.read_text()
    toml.write_text(toml.read_text().replace(old, f"[agent]\ntimeout_sec = {seconds}"))
    return task


def codex_on_bwrap() -> AgentConfig:
    return AgentConfig.from_dict(
        {
            "agent": {"name": "codex"},
            "env": {"deployment": {"type": "host", "isolation": "bwrap", "network": True}},
            "reward": {"name": "harbor"},
        }
    )


class SlowModel(ScriptedTokenModel):
    """A scripted model that takes ``delay`` seconds over its first reply (a loaded server)."""

    def __init__(self, *args: Any, delay: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.delay = delay

    async def _generate(self, prompt_ids: list[int], max_tokens: int | None) -> Any:
        if not self.calls:
            await asyncio.sleep(self.delay)
        return await super()._generate(prompt_ids, max_tokens)


async def test_a_harness_past_the_tasks_time_limit_is_ended(qwen3_tokenizer, tmp_path):
    task = with_agent_timeout(tmp_path, 5.0)
    script = [hermes_call("exec_command", {"cmd": "sleep 600; echo hello > hello.txt"}), "Done."]
    model = ScriptedTokenModel(qwen3_tokenizer, script)
    done = await run_harbor(codex_on_bwrap(), task, model, tmp_path / "out")
    result = done["result"]
    assert result["exit_reason"] == "timeout_error", (result, done["log"][-3000:])
    assert result["traj_masked"] is False and result["reward"] == 0.0
    assert result["reward_info"]["reward_file"] == "reward.txt"  # graded by its verifier
    assert "the task's time limit (5 s of its own time" in result["error"]
    assert result["metrics"]["env_seconds"] < 600
    assert "ending the agent's session and its processes" in done["log"]


async def test_the_time_waiting_for_the_model_is_not_the_harness_s(qwen3_tokenizer, tmp_path):
    # The limit leaves Codex's own start and two turns ample room on a loaded machine; the
    # model alone takes longer than all of it.
    task = with_agent_timeout(tmp_path, 30.0)
    script = [hermes_call("exec_command", {"cmd": "echo hello > hello.txt"}), "Done."]
    model = SlowModel(qwen3_tokenizer, script, delay=31.0)  # longer than the whole limit
    done = await run_harbor(codex_on_bwrap(), task, model, tmp_path / "out")
    result = done["result"]
    assert result["exit_reason"] == "finished", (result, done["log"][-3000:])
    assert result["reward"] == 1.0
    assert done["rollout"]["tree"]["turns"][0]["exact"] is True
