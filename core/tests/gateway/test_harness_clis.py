"""Real harness CLIs from npm through the gateway: Claude Code (``claude -p``, Anthropic
Messages, streaming) and Codex (``codex exec``, Responses, streaming) each finish a
scripted task (write a file with their own shell tool); each saved tree is one branch and
token-exact (every turn's prompt ids equal a fresh render of its wire request).

The CLIs are pinned and installed once into the cache (``uniagent.testing.npm_clis``).
Their non-essential traffic (telemetry, updates, analytics) is configured off; only the
gateway on 127.0.0.1 is reachable here."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from conftest import check_tree

from uniagent.testing.npm_clis import CLAUDE_CODE, CODEX, npm_cli
from uniagent.testing.scripted import hermes_call
from uniagent.testing.tokenizers import cache_dir

TASK = "Write hello into out.txt, then stop."
_TIMEOUT_S = 300


def _run(cmd: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=_TIMEOUT_S, check=False
    )
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    return proc


def _check_exact(closed: dict, session, backend) -> None:
    turns = closed["tree"]["turns"]
    assert [t["source"] for t in turns] == ["render", "extension"]
    assert closed["tree"]["branches"] == 1
    assert [t["exact"] for t in turns] == [True, True], [t["drift"] for t in turns]
    check_tree(session.tree, backend)


def test_claude_code_finishes_a_task_through_the_gateway(served, backend, tmp_path) -> None:
    claude = npm_cli(*CLAUDE_CODE, "claude")
    backend.script.extend(
        [hermes_call("Bash", {"command": "echo hello > out.txt"}, "Writing it."), "Done."]
    )
    session = served.gateway.open_session()
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(home),
        "ANTHROPIC_BASE_URL": served.base_url(session),
        "ANTHROPIC_API_KEY": session.key,
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }
    cmd = [str(claude), "-p", TASK, "--allowedTools", "Bash", "--output-format", "json"]
    proc = _run(cmd, work, env)
    assert '"is_error":false' in proc.stdout.replace(" ", ""), proc.stdout[-2000:]
    assert (work / "out.txt").read_text() == "hello\n"
    closed = served.gateway.close(session.id)
    # Its first request: Messages, streamed, with its own tools and mid-conversation system.
    first = closed["tree"]["turns"][0]["request"]
    assert first["stream"] is True and "Bash" in [t["name"] for t in first["tools"]]
    assert any(m["role"] == "system" for m in first["messages"])
    _check_exact(closed, session, backend)


def _codex_config(base_url: str) -> str:
    return f"""model = "scripted"
model_provider = "uniagent"
web_search = "disabled"
check_for_update_on_startup = false

[model_providers.uniagent]
name = "uniagent"
base_url = "{base_url}/v1"
env_key = "UNIAGENT_GATEWAY_KEY"
wire_api = "responses"

[agents]
enabled = false

[features]
goals = false
image_generation = false

[analytics]
enabled = false
"""


def test_codex_finishes_a_task_through_the_gateway(served, backend, tmp_path) -> None:
    codex = npm_cli(*CODEX, "codex")
    backend.script.extend([hermes_call("exec_command", {"cmd": "echo hello > out.txt"}), "Done."])
    session = served.gateway.open_session()
    work = tmp_path / "work"
    work.mkdir()
    # Codex refuses to set up its sandbox helper (codex-linux-sandbox) under a temporary
    # folder, so its home lives in the cache directory for the test's duration.
    (cache_dir() / "codex-home").mkdir(parents=True, exist_ok=True)
    codex_home = Path(tempfile.mkdtemp(dir=cache_dir() / "codex-home"))
    try:
        (codex_home / "config.toml").write_text(_codex_config(served.base_url(session)))
        env = {
            "PATH": os.environ["PATH"],
            "HOME": str(tmp_path),
            "CODEX_HOME": str(codex_home),
            "UNIAGENT_GATEWAY_KEY": session.key,
        }
        cmd = [
            str(codex),
            "exec",
            "--skip-git-repo-check",
            "--ephemeral",
            "-s",
            "workspace-write",
            TASK,
        ]
        _run(cmd, work, env)
    finally:
        shutil.rmtree(codex_home, ignore_errors=True)
    # The command ran in Codex's own sandbox (bubblewrap, workspace-write) in `work`.
    assert (work / "out.txt").read_text() == "hello\n"
    closed = served.gateway.close(session.id)
    first = closed["tree"]["turns"][0]["request"]
    assert first["stream"] is True and first["store"] is False
    assert "exec_command" in [t["name"] for t in first["tools"]]
    second = closed["tree"]["turns"][1]["request"]
    assert second["input"][-1]["type"] == "function_call_output"
    assert "exited with code 0" in second["input"][-1]["output"]
    _check_exact(closed, session, backend)


def test_a_mid_conversation_system_message_is_rendered_where_it_is_sent(served, backend) -> None:
    """Claude Code sends ``role: system`` inside ``messages`` (its environment notes)."""
    import anthropic

    backend.script.append("Ok.")
    session = served.gateway.open_session()
    client = anthropic.Anthropic(base_url=served.base_url(session), api_key=session.key)
    client.messages.create(
        model="m",
        max_tokens=50,
        system="Top.",
        messages=[
            {"role": "user", "content": "Hi."},
            {"role": "system", "content": [{"type": "text", "text": "Env notes."}]},  # type: ignore[list-item]
        ],
    )
    prompt = backend.tokenizer.decode(backend.calls[0].prompt_ids)
    assert "<|im_start|>user\nHi.<|im_end|>\n<|im_start|>system\nEnv notes.<|im_end|>" in prompt
    closed = served.gateway.close(session.id)
    assert closed["tree"]["turns"][0]["exact"] is True
