"""``uniagent run`` and the resolve step: typos stop the run; vLLM-style token mode recorded."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from uniagent.testing import Reply, ScriptedChatServer, hermes_call, load_qwen3_tokenizer
from uniagent.testing.tokenizers import qwen3_tokenizer_path

CONFIG = {
    "tools": ["execute_bash", "submit"],
    "interaction": {"max_turns": 4},
    "env": {"deployment": {"type": "host", "isolation": "none"}},
}


def run(tmp_path: Path, config: dict[str, Any], model: str) -> subprocess.CompletedProcess:
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump(config))
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"instance_id": "t1", "problem_statement": "say hi"}) + "\n")
    command = [
        sys.executable,
        "-m",
        "uniagent.cli",
        "run",
        str(path),
        "--data",
        str(tasks),
        "--model",
        model,
        "--out",
        str(tmp_path / "out"),
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"env": {"post_setpu": ["x"]}}, "env.post_setpu: unknown key"),
        (
            {"reward": {"name": "command", "settings": {"comand": "x"}}},
            "reward.settings.comand: unknown key",
        ),
        (
            {"tools": [{"name": "execute_bash", "settings": {"blokced": []}}, "submit"]},
            "tools.0.settings.blokced: unknown key",
        ),
        ({"tools": ["execute_bash", "sumbit"]}, "tools.1.name: unknown tool 'sumbit'"),
    ],
)
def test_a_typo_in_any_section_stops_the_run_before_any_episode(tmp_path, change, message):
    proc = run(tmp_path, {**CONFIG, **change}, "openai:http://127.0.0.1:9/v1#never-asked")
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and "agent.yaml" in proc.stderr
    assert not (tmp_path / "out" / "episodes").exists()


def test_a_vllm_style_server_with_a_tokenizer_gives_token_exact_trajectories(tmp_path):
    tokenizer = load_qwen3_tokenizer()
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")

    def reply(body: dict) -> Reply:
        turn = sum(1 for m in body["messages"] if m["role"] == "assistant")
        text = (
            hermes_call("execute_bash", {"command": "echo hi"})
            if turn == 0
            else (hermes_call("submit"))
        )
        ids = [*tokenizer.encode(text, add_special_tokens=False), end]
        return Reply(text, token_ids=ids, logprobs=[-0.25] * len(ids))

    with ScriptedChatServer(default=reply, tokenizer=tokenizer) as server:
        model = f"openai:{server.base_url}#qwen3?tokenizer={qwen3_tokenizer_path()}"
        proc = run(tmp_path, CONFIG, model)
    assert proc.returncode == 0, proc.stderr
    [record] = [json.loads(line) for line in (tmp_path / "out" / "results.jsonl").open()]
    assert record["exit_reason"] == "finished" and not record["traj_masked"]
    assert record["metrics"]["inexact_turns"] == 0
    rollout = json.loads((Path(record["episode_dir"]) / "rollout.json").read_text())
    assert rollout["mode"] == "tokens"
    model_ids = [i for i, m in zip(rollout["response_ids"], rollout["response_mask"]) if m]
    assert model_ids and server.requests[0]["return_token_ids"] is True
    logprobs = [lp for lp, m in zip(rollout["response_logprobs"], rollout["response_mask"]) if m]
    assert set(logprobs) == {-0.25}
