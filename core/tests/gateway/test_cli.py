"""``uniagent gateway`` as a command: it serves and opens sessions over HTTP (a served
model behind it: tests/gateway/test_served_backend.py)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import openai

from uniagent.testing import cli
from uniagent.testing.tokenizers import qwen3_tokenizer_path


@contextmanager
def scripted_gateway(tmp_path: Path, replies: list[str]) -> Iterator[str]:
    """``uniagent gateway --scripted`` serving ``replies``; yields its URL."""
    script = tmp_path / "replies.json"
    script.write_text(json.dumps(replies))
    command = ["gateway", "--scripted", str(script), "--tokenizer", str(qwen3_tokenizer_path())]
    proc = subprocess.Popen(
        [sys.executable, "-m", "uniagent.cli", *command, "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("uniagent gateway: http://127.0.0.1:"), line
        yield line.split()[2]
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0


def open_session(url: str) -> Any:
    """``POST /sessions``: an OpenAI client of the new session."""
    request = urllib.request.Request(url + "/sessions", method="POST")
    with urllib.request.urlopen(request, timeout=30) as response:
        opened = json.loads(response.read())
    return openai.OpenAI(base_url=opened["base_url"] + "/v1", api_key=opened["key"])


def reply(client: Any) -> str | None:
    """The session's reply to one user message."""
    messages = [{"role": "user", "content": "hi"}]
    return client.chat.completions.create(model="m", messages=messages).choices[0].message.content


def test_the_command_serves_scripted_replies(tmp_path: Path) -> None:
    with scripted_gateway(tmp_path, ["Hello from the gateway."]) as url:
        assert reply(open_session(url)) == "Hello from the gateway."


def test_each_session_replays_the_script_from_its_first_reply(tmp_path: Path) -> None:
    # Before: the sessions shared one script in request order (b's first reply was "two").
    with scripted_gateway(tmp_path, ["one", "two", "last"]) as url:
        a, b = open_session(url), open_session(url)
        assert reply(a) == "one"
        assert reply(b) == "one"
        assert [reply(a), reply(a), reply(a)] == ["two", "last", "last"]  # the last repeats
        assert reply(b) == "two"


def test_a_guided_hf_model_is_refused_before_it_loads(tmp_path: Path, capsys) -> None:
    # Before: it loaded, served, and answered every request with a 500 ("no guided turn
    # was opened"): guided decoding constrains uniagent's own loop, not a harness's requests.
    (tmp_path / "model").mkdir()  # empty: loading from it would fail with another message
    status = cli(["gateway", "--model", f"hf:{tmp_path}/model?guided=tool_call"])
    assert status == 2
    err = capsys.readouterr().err
    assert "guided decoding" in err and "drop ?guided=" in err, err
