"""`uniagent run --model SPEC`: a bad spec is one line and exit status 2, before anything starts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


def uniagent_run(tmp_path: Path, model: str, *config_lines: str) -> subprocess.CompletedProcess:
    config = tmp_path / "agent.yaml"
    config.write_text("".join(f"{line}\n" for line in config_lines) or "{}\n")
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"instance_id": "t1", "problem_statement": "x"}\n')
    command = [sys.executable, "-m", "uniagent.cli", "run", str(config), "--data", str(tasks)]
    command += ["--model", model, "--out", str(tmp_path / "out")]
    return subprocess.run(command, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(
    ("query", "config", "message"),
    [
        ("?guided=bogus", (), "unknown mode 'bogus'; available: tool_call"),
        ("?guided=tool_call&thought=-3", (), "from 0 to 4000, got -3"),
        ("?guided=tool_call", ("tool_parser: qwen3_coder",), "not 'qwen3_coder'"),
        ("?guided=tool_call", ("sampling: {num_beams: 4}",), "sampling.num_beams=4 cannot"),
    ],
)
def test_a_bad_hf_spec_exits_2_with_one_line(tmp_path, query, config, message):
    model_dir = tmp_path / "model"
    model_dir.mkdir()  # the path exists: what is refused is the option
    proc = uniagent_run(tmp_path, f"hf:{model_dir}{query}", *config)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("uniagent: error: model spec ") and message in lines[0]
    assert not (tmp_path / "out").exists()  # nothing started, nothing written
