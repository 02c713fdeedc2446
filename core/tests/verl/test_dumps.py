"""Episode dumps from training (``trajectory_dir``): ``uniagent run``'s files, per step."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from verl_helpers import (
    AGENT,
    SCRIPTS,
    make_batch,
    make_worker,
    task,
    trainer_config,
    write_loop_yaml,
)

from uniagent.errors import ConfigError
from uniagent.interaction.loop import PARSED_CALLS, PARSED_CONTENT, TOOL_OUTPUT_OF
from uniagent.run.runner import RESULTS, ResultsFile
from uniagent.run.summary import summarize
from uniagent.verl.dumps import DumpSettings
from uniagent.verl.testing import ScriptedTokenServer

EPISODE_FILES = {"messages.json", "rollout.json", "result.json", "log.txt"}


def unpadded_response(out: Any, i: int) -> list[int]:
    """Sample ``i``'s response ids without padding."""
    prompt_len = out.batch["prompts"].shape[1]
    n = int(out.batch["attention_mask"][i][prompt_len:].sum())
    return out.batch["responses"][i][:n].tolist()


async def test_classic_worker_dumps_every_sample_in_run_layout(
    tmp_path: Path, verl_model_dir: Path, qwen3_tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two samples of one task, then a failed sandbox and a failed adapter: all dumped, under
    the step the server reported, in the files ``uniagent run`` writes."""
    from uniagent.verl.agent_loop import UniAgentLoop

    monkeypatch.setattr(UniAgentLoop, "_last_global_steps", None)  # a fresh worker process
    dumps = tmp_path / "dumps"
    loop_yaml = write_loop_yaml(tmp_path, AGENT, trajectory_dir=str(dumps), trajectory_rate=1.0)
    tasks = [
        task("fin", "[script:finish]"),
        task("broken", "[script:finish]", tools_kwargs={"env": {"post_setup": ["false"]}}),
        task("badcfg", "[script:finish]"),
    ]
    batch = make_batch(tmp_path, qwen3_tokenizer, tasks)
    batch.non_tensor_batch["tools_kwargs"][2] = json.dumps({"interaction": {"max_turns": 0}})
    server = ScriptedTokenServer(str(verl_model_dir), SCRIPTS, global_steps=7)
    worker = make_worker(trainer_config(verl_model_dir, loop_yaml), server)
    out = await worker.generate_sequences(batch.select_idxs([0, 0]))  # rollout.n = 2
    # Episodes without a generation take the weight version the worker saw last.
    await worker.generate_sequences(batch.select_idxs([1, 2]))

    run_dir = dumps / "step_000007"  # the weight version the server reported
    records = ResultsFile(run_dir / RESULTS).load()
    assert sorted((r["task_id"], r["sample"]) for r in records) == [
        ("badcfg", 0),
        ("broken", 0),
        ("fin", 0),
        ("fin", 1),
    ]
    for record in records:
        directory = run_dir / "episodes" / record["task_id"] / str(record["sample"])
        assert record["episode_dir"] == str(directory)
        assert json.loads((directory / "result.json").read_text()) == record
        present = {p.name for p in directory.iterdir()}
        expected = EPISODE_FILES if record["task_id"] == "fin" else EPISODE_FILES - {"rollout.json"}
        assert present == expected, record["task_id"]
    by_task = {r["task_id"]: r for r in records}
    assert by_task["fin"]["exit_reason"] == "finished" and by_task["fin"]["reward"] == 1.0
    assert by_task["broken"]["exit_reason"] == "env_error" and by_task["broken"]["traj_masked"]
    assert by_task["badcfg"]["exit_reason"] == "unknown_error"
    assert "max_turns" in by_task["badcfg"]["error"]
    summary = summarize(records, n=2, wall_seconds=1.0)  # `uniagent run`'s summary, as is
    assert summary["masked_episodes"] == 2

    verl = by_task["fin"]["verl"]
    assert verl["global_step"] == 7 and verl["traj_masked"] is False
    assert verl["reward_score"] == 1.0 and verl["trained_tokens"] > 0
    assert (verl["min_global_steps"], verl["max_global_steps"]) == (7, 7)
    assert by_task["broken"]["verl"]["prompt_messages"][1]["content"].startswith("[script:finish]")

    fin = run_dir / "episodes" / "fin" / "0"
    rollout = json.loads((fin / "rollout.json").read_text())
    assert rollout["response_ids"] in (unpadded_response(out, 0), unpadded_response(out, 1))
    # messages.json is the conversation plus what the record notes of calls parsed from text
    # (never sent to the model): without those notes, it is the rollout's conversation.
    notes = (PARSED_CALLS, PARSED_CONTENT, TOOL_OUTPUT_OF)
    saved = json.loads((fin / "messages.json").read_text())
    assert [{k: v for k, v in m.items() if k not in notes} for m in saved] == rollout["messages"]
    assert saved[2][PARSED_CALLS][0]["name"] == "execute_bash"
    log_text = (fin / "log.txt").read_text()
    assert "task fin: start" in log_text and "finished: finished reward=1.0" in log_text
    broken_log = (run_dir / "episodes" / "broken" / "0" / "log.txt").read_text()
    assert "setup command 'false'" in broken_log
    assert "episode failed" in (run_dir / "episodes" / "badcfg" / "0" / "log.txt").read_text()


async def test_rate_zero_dumps_nothing(
    tmp_path: Path, verl_model_dir: Path, qwen3_tokenizer: Any
) -> None:
    """trajectory_rate 0: no files, and the batch is the same as without dumps."""
    dumps = tmp_path / "dumps"
    loop_yaml = write_loop_yaml(tmp_path, AGENT, trajectory_dir=str(dumps), trajectory_rate=0)
    batch = make_batch(tmp_path, qwen3_tokenizer, [task("fin", "[script:finish]")])
    server = ScriptedTokenServer(str(verl_model_dir), SCRIPTS)
    out = await make_worker(trainer_config(verl_model_dir, loop_yaml), server).generate_sequences(
        batch
    )
    assert out.batch["rm_scores"].sum().item() == 1.0
    assert not dumps.exists()


def test_sampling_is_per_group_and_stable() -> None:
    """A group (uid) is dumped whole or not at all; the share follows the rate."""
    settings = DumpSettings(Path("unused"), rate=0.25)
    groups = [f"uid-{i}" for i in range(400)]
    chosen = [g for g in groups if settings.wants(g)]
    assert 60 <= len(chosen) <= 140  # a fixed hash of fixed names: the same on every run
    assert chosen == [g for g in groups if settings.wants(g)]
    assert all(DumpSettings(Path("unused"), rate=1.0).wants(g) for g in groups)
    assert not any(DumpSettings(Path("unused"), rate=0.0).wants(g) for g in groups)


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({"trajectory_rate": 0.5}, "trajectory_rate is set but trajectory_dir is not"),
        ({"trajectory_dir": "/d", "trajectory_rate": 1.5}, "number from 0 to 1"),
        ({"trajectory_dir": "/d", "trajectory_rate": "all"}, "number from 0 to 1"),
        ({"trajectory_dir": ["/d"]}, "trajectory_dir must be a path"),
    ],
)
def test_bad_dump_settings_are_rejected(keys: dict[str, Any], message: str) -> None:
    """Named in the error, with the agent loop they belong to."""
    with pytest.raises(ConfigError, match=message) as caught:
        DumpSettings.pop_from(dict(keys), source="agent loop 'uniagent'")
    assert "agent loop 'uniagent'" in str(caught.value)


def test_defaults() -> None:
    """No trajectory_dir: no dumps; a trajectory_dir alone: a tenth of the groups."""
    keys: dict[str, Any] = {"agent_config": "agent.yaml"}
    assert DumpSettings.pop_from(keys, source="s") is None
    assert keys == {"agent_config": "agent.yaml"}
    keys = {"trajectory_dir": "~/dumps", "concurrency": 4}
    settings = DumpSettings.pop_from(keys, source="s")
    assert settings is not None and settings.rate == 0.1
    assert settings.directory == Path("~/dumps").expanduser()
    assert keys == {"concurrency": 4}  # the rest stays for the agent config
