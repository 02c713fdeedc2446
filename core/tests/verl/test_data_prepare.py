"""``uniagent data prepare``: the Parquet loads with verl's RLHFDataset as run() expects."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import yaml

from uniagent.cli import main
from uniagent.data import parquet_schema
from uniagent.verl.settings import row_messages, row_overrides, row_task

AGENT = {
    "tool_parser": "hermes",
    "tools": ["execute_bash", "finish"],
    "system_prompt": "You are a test agent.",
    "instance_template": "Repository {repo}: {problem_statement}",
}

# Heterogeneous rows: different fields, nested values of different shapes.
TASKS = [
    {
        "instance_id": "a-1",
        "repo": "alpha",
        "problem_statement": "Fix the mean of an empty list.",
        "test_command": "python -m unittest",
        "tools_kwargs": {"env": {"post_setup": ["git clone -q /repos/a ."]}},
        "meta": {"labels": ["easy"], "weight": 1.5},
    },
    {
        "task_id": "b-2",
        "repo": "beta",
        "problem_statement": "Make the parser accept tabs.",
        "answer": {"files": ["parser.py"]},
        "tools_kwargs": {"system_prompt": "You are a parser expert."},
        "meta": [1, 2, 3],
    },
    {"id": "c-3", "repo": "gamma", "problem_statement": "Nothing nested here."},
]


@pytest.fixture
def prepared(tmp_path: Path, capsys: pytest.CaptureFixture) -> Path:
    """The three tasks (plus one bad row: written without it, status 2) prepared through
    the CLI."""
    tasks = tmp_path / "tasks.jsonl"
    lines = [json.dumps(t) for t in TASKS] + ['{"problem_statement": "no id"}']
    tasks.write_text("\n".join(lines) + "\n")
    config = tmp_path / "agent.yaml"
    config.write_text(yaml.safe_dump(AGENT))
    out = tmp_path / "data" / "train.parquet"
    assert main(["data", "prepare", str(tasks), "--out", str(out), "--config", str(config)]) == 2
    assert "task 4 skipped: no id" in capsys.readouterr().err
    return out


def test_columns_and_schema(prepared: Path) -> None:
    """The columns verl reads, with one fixed schema whatever the tasks hold."""
    table = pq.read_table(prepared)
    assert table.schema.equals(parquet_schema())
    rows = table.to_pylist()
    assert [r["index"] for r in rows] == [0, 1, 2]
    assert {r["agent_name"] for r in rows} == {"uniagent"}
    assert {r["data_source"] for r in rows} == {"tasks"}  # the task file's stem
    assert rows[0]["prompt"] == [
        {"role": "system", "content": "You are a test agent."},
        {"role": "user", "content": "Repository alpha: Fix the mean of an empty list."},
    ]
    assert rows[1]["prompt"][0]["content"] == "You are a parser expert."  # task override
    assert rows[1]["reward_model"] == {
        "style": "uniagent",
        "ground_truth": '{"files": ["parser.py"]}',
    }
    assert rows[2]["reward_model"]["ground_truth"] == ""
    assert [r["extra_info"]["task_id"] for r in rows] == ["a-1", "b-2", "c-3"]


def test_rlhf_dataset_yields_the_kwargs_run_expects(prepared: Path, qwen3_tokenizer: Any) -> None:
    """Through verl's RLHFDataset and collate_fn: raw_prompt, tools_kwargs, the task row."""
    from omegaconf import OmegaConf
    from verl.protocol import DataProto
    from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn

    dataset = RLHFDataset(
        str(prepared),
        qwen3_tokenizer,
        OmegaConf.create(
            # filter_overlong_prompts=True works too but costs ~30 s here: `datasets`
            # fingerprints the filter by pickling the whole tokenizer.
            {
                "max_prompt_length": 256,
                "filter_overlong_prompts": False,
                "cache_dir": str(prepared.parent / "cache"),
            }
        ),
    )
    assert len(dataset) == 3
    batch = DataProto.from_single_dict(collate_fn([dataset[i] for i in range(3)]))
    columns = batch.non_tensor_batch
    for key in ("raw_prompt", "agent_name", "index", "tools_kwargs", "extra_info", "data_source"):
        assert key in columns, key
    for i, original in enumerate(TASKS):
        # What AgentLoopWorker hands to run(): one value per non-tensor column.
        kwargs = {k: v[i] for k, v in columns.items()}
        assert kwargs["agent_name"] == "uniagent" and int(kwargs["index"]) == i
        assert row_task(kwargs) == original
        assert row_overrides(kwargs) == original.get("tools_kwargs", {})
        messages = row_messages(kwargs)
        assert messages is not None and [m["role"] for m in messages] == ["system", "user"]
        assert original["problem_statement"] in messages[1]["content"]


def test_bad_template_field_names_the_task(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A task without a field the template needs fails with the task's id."""
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"instance_id": "x-9", "problem_statement": "p"}) + "\n")
    config = tmp_path / "agent.yaml"
    config.write_text(yaml.safe_dump(AGENT))
    code = main(
        [
            "data",
            "prepare",
            str(tasks),
            "--out",
            str(tmp_path / "o.parquet"),
            "--config",
            str(config),
        ]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert "x-9" in err and "repo" in err
