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
        (
            "?guided=tool_call",
            ("sampling: {extra_body: {num_beams: 4}}",),
            "sampling.extra_body.num_beams=4 cannot",
        ),
        ("", ("sampling: {stop: [x]}",), "sampling.stop is not applied by hf: models"),
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


@pytest.mark.parametrize(
    ("sampling", "message"),
    [
        ("{max_token: 20}", "sampling.max_token: unknown key (did you mean max_tokens?"),
        ("{temperature: hot}", "sampling.temperature: Input should be a valid number"),
    ],
)
def test_bad_sampling_exits_2_before_anything_starts(tmp_path, sampling, message):
    # Before: a typo was ignored, and a bad value failed every episode as a retried model_error.
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    proc = uniagent_run(tmp_path, f"hf:{model_dir}", f"sampling: {sampling}")
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and "agent.yaml" in proc.stderr
    assert not (tmp_path / "out").exists()  # no model loaded, no episode, nothing written


def test_guided_decoding_without_llguidance_is_refused_up_front(tmp_path, monkeypatch):
    import importlib.util

    from uniagent.errors import ConfigError
    from uniagent.models import check_spec

    real = importlib.util.find_spec

    def find_spec(name, *args):
        return None if name == "llguidance" else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    (tmp_path / "model").mkdir()
    with pytest.raises(ConfigError, match="guided decoding needs llguidance"):
        check_spec(f"hf:{tmp_path}/model?guided=tool_call", None)
    check_spec(f"hf:{tmp_path}/model", None)  # unguided needs no llguidance


def test_a_home_relative_hf_path_is_the_same_for_the_check_and_the_loader(tmp_path, monkeypatch):
    from uniagent.errors import ConfigError
    from uniagent.models import check_spec
    from uniagent.models.hf import parse_spec

    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "m").mkdir()
    assert parse_spec("~/m?guided=tool_call")[0] == str(tmp_path / "m")
    check_spec("hf:~/m", None)
    with pytest.raises(ConfigError, match="does not exist"):
        check_spec("hf:~/missing", None)
