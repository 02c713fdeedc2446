"""A rubric reward in verl 0.9.1's real AgentLoopWorker on the CPU: the weighted sum on the
last token, every component (the zero-weight metric too) in the batch and its metrics."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from verl_helpers import (
    AGENT,
    SCRIPTS,
    agent_field,
    make_batch,
    make_worker,
    task,
    trainer_config,
    write_loop_yaml,
)

from uniagent.verl.metrics import batch_agent_metrics
from uniagent.verl.testing import ScriptedTokenServer

RUBRIC = {
    "rubric": [
        {"name": "command", "weight": 0.75, "settings": {"timeout": 30}},  # test -f marker.txt
        {"name": "command", "label": "never", "weight": 0.5, "settings": {"command": "false"}},
        {"name": "command", "label": "always", "weight": 0.25, "settings": {"command": "true"}},
    ],
    "metrics": [{"name": "command", "label": "lint", "settings": {"command": "true"}}],
}


async def test_rubric_reward_and_metric_reach_the_batch(
    tmp_path: Path, verl_model_dir: Path, qwen3_tokenizer: Any
) -> None:
    loop_yaml = write_loop_yaml(tmp_path, {**AGENT, "reward": RUBRIC})
    tasks = [task("fin", "[script:finish]"), task("loop", "[script:loop]")]
    batch = make_batch(tmp_path, qwen3_tokenizer, tasks)
    server = ScriptedTokenServer(str(verl_model_dir), SCRIPTS, global_steps=1)
    config = trainer_config(verl_model_dir, loop_yaml, response_length=512)
    out = await make_worker(config, server).generate_sequences(batch)

    assert agent_field(out, "exit_reason") == ["finished", "max_step_limit"]
    # fin made marker.txt: 0.75 + 0.25; loop did not: 0.25. The metric is not in either.
    expected = [1.0, 0.25]
    prompt_length = out.batch["prompts"].shape[1]
    for i, reward in enumerate(expected):
        n = int(out.batch["attention_mask"][i][prompt_length:].sum())
        scores = out.batch["rm_scores"][i].tolist()
        assert scores[n - 1] == pytest.approx(reward) and sum(scores) == pytest.approx(reward)
    assert agent_field(out, "reward_components") == [
        {"command": 1.0, "never": 0.0, "always": 1.0, "lint": 1.0},
        {"command": 0.0, "never": 0.0, "always": 1.0, "lint": 1.0},
    ]
    metrics = batch_agent_metrics(out)
    assert metrics["agent/reward/command/mean"] == 0.5
    assert metrics["agent/reward/never/mean"] == 0.0
    assert metrics["agent/reward/lint/mean"] == 1.0
