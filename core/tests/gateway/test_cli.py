"""``uniagent gateway`` as a command: it serves, opens sessions over HTTP, and refuses
a backend that does not continue token ids."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import openai

from uniagent.testing import cli
from uniagent.testing.tokenizers import qwen3_tokenizer_path


def test_the_command_serves_scripted_replies(tmp_path: Path) -> None:
    import urllib.request

    replies = tmp_path / "replies.json"
    replies.write_text(json.dumps(["Hello from the gateway."]))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uniagent.cli",
            "gateway",
            "--scripted",
            str(replies),
            "--tokenizer",
            str(qwen3_tokenizer_path()),
            "--port",
            "0",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("uniagent gateway: http://127.0.0.1:"), line
        url = line.split()[2]
        with urllib.request.urlopen(
            urllib.request.Request(url + "/sessions", method="POST"), timeout=30
        ) as r:
            opened = json.loads(r.read())
        client = openai.OpenAI(base_url=opened["base_url"] + "/v1", api_key=opened["key"])
        r2 = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        assert r2.choices[0].message.content == "Hello from the gateway."
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0


def test_an_openai_chat_backend_is_refused_with_the_reason(capsys) -> None:
    status = cli(["gateway", "--model", "openai:http://127.0.0.1:9/v1#m"])
    assert status != 0
    assert "continues token ids" in capsys.readouterr().err
