"""Shared set-up: an agent config for a harness, a run through `uniagent run`, its files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from uniagent.config import AgentConfig
from uniagent.run.progress import Progress
from uniagent.run.runner import run
from uniagent.run.tasks import Task
from uniagent.testing import load_qwen3_tokenizer

TASK = Task("hello", {"problem_statement": "Write hello into out.txt, then stop."})
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
    import io

    summary = await run(
        config, [TASK], [], lambda: model, out, progress=Progress(io.StringIO(), live=False)
    )
    episode = out / "episodes" / "hello" / "0"
    return {
        "summary": summary,
        "result": json.loads((episode / "result.json").read_text()),
        "rollout": json.loads((episode / "rollout.json").read_text()),
        "log": (episode / "log.txt").read_text(),
    }


@pytest.fixture(scope="session")
def qwen3_tokenizer() -> Any:
    """The real Qwen3 tokenizer (from the cache)."""
    return load_qwen3_tokenizer()
