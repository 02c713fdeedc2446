"""`uniagent run --model SPEC`: a bad spec is one line and exit status 2, before anything starts."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest


def uniagent_run(
    tmp_path: Path, model: str, *config_lines: str, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess:
    config = tmp_path / "agent.yaml"
    config.write_text("".join(f"{line}\n" for line in config_lines) or "{}\n")
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"instance_id": "t1", "problem_statement": "x"}\n')
    command = [sys.executable, "-m", "uniagent.cli", "run", str(config), "--data", str(tasks)]
    command += ["--model", model, "--out", str(tmp_path / "out")]
    return subprocess.run(
        command, capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})}
    )


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


@pytest.mark.parametrize("options", ["guided=tool_call", "guided=tool_call&thought=200"])
def test_a_harness_agent_with_a_guided_hf_model_exits_2_before_any_model_loads(
    tiny, tmp_path, capsys, options
):
    # Before: accepted, then every attempt ran ~5 minutes and ended model_error ("no guided
    # turn was opened"): the gateway serves a harness's requests, never a guided turn.
    from uniagent.testing import cli

    (tmp_path / "agent.yaml").write_text(
        "agent: {name: tiny}\nenv: {deployment: {type: host, network: true}}\n"
    )
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"instance_id": "t1", "problem_statement": "x"}\n')
    model_dir = tmp_path / "model"
    model_dir.mkdir()  # empty: loading a tokenizer or a model from it would fail otherwise
    status = cli([
        "run", str(tmp_path / "agent.yaml"), "--data", str(tasks),
        "--model", f"hf:{model_dir}?{options}", "--out", str(tmp_path / "out"),
    ])  # fmt: skip
    err = capsys.readouterr().err
    assert status == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"uniagent: error: model spec 'hf:{model_dir}?{options}': "), err
    assert "agent 'tiny' is a harness" in lines[0] and "drop ?guided=" in lines[0], err
    assert not (tmp_path / "out").exists()  # no run folder, no model, no episode
    # The same model without guided decoding passes this check (and fails later, on loading
    # the empty folder: the check above came first).
    status = cli([
        "run", str(tmp_path / "agent.yaml"), "--data", str(tasks),
        "--model", f"hf:{model_dir}", "--out", str(tmp_path / "out"),
    ])  # fmt: skip
    assert "is a harness" not in capsys.readouterr().err


# -- hub ids: known names, the local cache, then the Hub (a local stand-in on 127.0.0.1) ------
class Hub:
    """The Hub's model-info API (``GET /api/models/ORG/NAME``) for the models it holds."""

    def __init__(self, models: set[str]) -> None:
        self.models = models
        self.requests: list[str] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                hub.requests.append(self.path)
                repo = self.path.split("?")[0].removeprefix("/api/models/")
                found = repo in hub.models
                body = json.dumps({"id": repo} if found else {"error": "Repository not found"})
                self.send_response(200 if found else 404)
                if not found:  # what the real Hub sends, so that the client knows the reason
                    self.send_header("X-Error-Code", "RepoNotFound")
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body.encode())

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[Hub]:
    server = Hub({"someorg/real-model"})
    thread = threading.Thread(target=server.server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.server.shutdown()
    server.server.server_close()
    thread.join()


def hub_env(tmp_path: Path, endpoint: str, **extra: str) -> dict[str, str]:
    cache = tmp_path / "hf-cache"
    cache.mkdir(exist_ok=True)
    return {"HF_ENDPOINT": endpoint, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "0", **extra}


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"  # nothing listens there now: connection refused


def test_a_typo_of_a_known_name_is_one_line_without_asking_the_hub(tmp_path, hub):
    # Before: hf:smolm2 went to the Hub as an id, retried for ~50 s and printed 22 lines.
    proc = uniagent_run(tmp_path, "hf:smolm2", env=hub_env(tmp_path, hub.url))
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "no model 'smolm2'" in lines[0] and "did you mean hf:smollm2" in lines[0]
    assert hub.requests == []
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("where", "offline", "message"),
    [
        ("closed", "0", "the Hub (http://127.0.0.1:"),
        ("hub", "1", "and HF_HUB_OFFLINE is set"),
        ("hub", "0", "has no such model"),
    ],
)
def test_a_hub_id_that_cannot_load_is_one_line(tmp_path, hub, where, offline, message):
    endpoint = closed_port_url() if where == "closed" else hub.url
    env = hub_env(tmp_path, endpoint, HF_HUB_OFFLINE=offline)
    proc = uniagent_run(tmp_path, "hf:someorg/no-such-model", env=env)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "'someorg/no-such-model' is not a local path and not in the" in lines[0]
    assert message in lines[0]
    if where == "closed":
        assert "cannot be reached" in lines[0]
        # Before: the hint was printed as `hf download {repo_id}`, the name left out.
        assert "(`hf download someorg/no-such-model`)" in lines[0], lines[0]
    assert not (tmp_path / "out").exists()


def test_a_hub_id_in_the_cache_or_on_the_hub_passes_the_check(tmp_path, hub):
    check = "import sys; from uniagent.models import check_spec; check_spec(sys.argv[1], None)"
    env = hub_env(tmp_path, closed_port_url(), HF_HUB_OFFLINE="1")
    snapshot = Path(env["HF_HUB_CACHE"]) / "models--someorg--cached" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    for spec, endpoint_env in (
        ("hf:someorg/cached", env),  # offline, but cached
        ("hf:someorg/real-model", hub_env(tmp_path, hub.url)),  # the Hub has it
    ):
        proc = subprocess.run(
            [sys.executable, "-c", check, spec],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, **endpoint_env},
        )
        assert proc.returncode == 0, proc.stderr
    asked = [path for path in hub.requests if path.startswith("/api/models/")]
    assert asked == ["/api/models/someorg/real-model"]  # the cached one was not asked about


def test_run_help_names_the_model_forms_and_how_to_start_vllm_for_tool_calls():
    proc = subprocess.run(
        [sys.executable, "-m", "uniagent.cli", "run", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "1000"},  # one line per paragraph, for the checks
    )
    assert proc.returncode == 0, proc.stderr
    for needed in (
        "hf:smollm2",
        "?guided=tool_call",
        "?tokenizer=",
        "openai:BASE_URL#MODEL",
        "--enable-auto-tool-choice --tool-call-parser",
    ):
        assert needed in proc.stdout, needed
