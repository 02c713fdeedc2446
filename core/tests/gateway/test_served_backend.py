"""A served model behind the gateway (``openai:BASE_URL#MODEL?tokenizer=PATH`` for a harness
or ``uniagent gateway``): prompt ids go to the server's ``/completions``, the ids it
generated come back and are recorded as they are; what the server reports that disagrees
with our ids or tokenizer is recorded per turn. The server is a real HTTP server on
127.0.0.1 speaking vLLM's token-id completions (:class:`ScriptedChatServer`)."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import openai
import pytest

from uniagent.gateway.backend import TokenModelBackend
from uniagent.gateway.manager import Gateway
from uniagent.gateway.server import start
from uniagent.models import ContextLimitError, ModelError, ServedTokenModel, from_spec
from uniagent.models.served import completion_tokens
from uniagent.testing import Fail, Reply, ScriptedChatServer, cli
from uniagent.testing.scripted import hermes_call
from uniagent.testing.tokenizers import qwen3_tokenizer_path


def reply(tokenizer: Any, text: str, *, end: bool = True, **kwargs: Any) -> Reply:
    """A server reply generating ``text`` (and the end-of-turn token), with log-probs."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    if end:
        ids.append(tokenizer.convert_tokens_to_ids("<|im_end|>"))
    lps = [-0.01 * (i + 1) for i in range(len(ids))]
    return Reply(text, token_ids=ids, logprobs=lps, **kwargs)


def spec(server: ScriptedChatServer) -> str:
    return f"openai:{server.base_url}#test-model?tokenizer={qwen3_tokenizer_path()}"


async def test_prompt_ids_go_out_and_the_generated_ids_come_back_as_they_are(
    qwen3_tokenizer,
) -> None:
    first = reply(qwen3_tokenizer, "Hello there.")
    cut = reply(qwen3_tokenizer, "Cut at the", end=False, finish_reason="length")
    with ScriptedChatServer([Fail(503), first, cut]) as server:
        model = from_spec(spec(server), token_backend=True, sampling_params={"top_k": 5})
        assert isinstance(model, ServedTokenModel)
        model.chat.sleep = lambda _delay: asyncio.sleep(0)  # the retry's wait, not timed
        prompt = qwen3_tokenizer.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
        out = await model._generate(prompt, 64)
        assert out.token_ids == first.token_ids and out.logprobs == first.logprobs
        assert out.finish_reason is None and "server" not in out.extra
        cut_out = await model._generate(prompt, 3)
        assert cut_out.token_ids == cut.token_ids and cut_out.finish_reason == "length"
        await model.aclose()
    sent = server.requests[1]  # the first was answered 503 and retried
    assert sent["prompt"] == prompt and "messages" not in sent
    assert sent["max_tokens"] == 64 and sent["return_token_ids"] is True
    assert sent["top_k"] == 5 and server.requests[2]["max_tokens"] == 3


async def test_a_turn_asks_for_at_most_the_room_left_in_the_servers_context(
    qwen3_tokenizer,
) -> None:
    """The completions API generates 16 tokens unless told: a turn without ``max_tokens``
    asks for what the server's context has left (vLLM lists ``max_model_len``)."""
    prompt = qwen3_tokenizer.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    with ScriptedChatServer([reply(qwen3_tokenizer, "Hi.")] * 2, max_model_len=100) as server:
        model = from_spec(spec(server), token_backend=True)
        await model._generate(prompt, None)
        assert server.requests[-1]["max_tokens"] == 100 - len(prompt)
        assert model.max_model_len == 100
        # A harness's max_tokens larger than the room left (Claude Code asks for 32,000) is
        # cut to it: a server would refuse it (400), an infrastructure failure to us.
        await model._generate(prompt, 32_000)
        assert server.requests[-1]["max_tokens"] == 100 - len(prompt)
        with pytest.raises(ContextLimitError, match="no room to generate"):
            await model._generate(list(range(100)), None)
        await model.aclose()


class Retokenizing(ScriptedChatServer):
    """A server that does not generate from the ids it is sent (it reports others)."""

    def text_completion(self, body: dict[str, Any], reply: Reply) -> dict[str, Any]:
        data = super().text_completion(body, reply)
        data["choices"][0]["prompt_token_ids"] = body["prompt"][:-1]
        return data


async def test_what_the_server_reports_against_our_ids_and_tokenizer_is_recorded(
    qwen3_tokenizer,
) -> None:
    ids = reply(qwen3_tokenizer, "Four.")
    other_text = Reply("Five.", token_ids=ids.token_ids, logprobs=ids.logprobs)
    prompt = qwen3_tokenizer.encode("<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n")
    with Retokenizing([ids]) as server:
        model = from_spec(spec(server), token_backend=True)
        out = await model._generate(prompt, 16)
        await model.aclose()
    differ = out.extra["server"]["prompt_ids_differ"]
    assert differ == {"first_difference": len(prompt) - 1, "sent": len(prompt),
                      "server": len(prompt) - 1}  # fmt: skip
    with ScriptedChatServer([other_text]) as server:
        model = from_spec(spec(server), token_backend=True)
        out = await model._generate(prompt, 16)
        await model.aclose()
    assert out.extra["server"]["text_differs"] == {"server": "Five.", "ours": "Four."}


def test_ids_come_from_token_ids_or_token_id_strings_and_none_is_not_a_reply() -> None:
    assert completion_tokens({"token_ids": [5, 6], "logprobs": {"token_logprobs": [-1, -2]}}) == (
        [5, 6],
        [-1.0, -2.0],
    )
    with pytest.raises(ModelError, match="no log-prob for a generated token"):
        completion_tokens({"token_ids": [5, 6], "logprobs": {"token_logprobs": [-1, None]}})
    tokens = {"tokens": ["token_id:7", "token_id:8"], "token_logprobs": [-0.5, -0.25]}
    assert completion_tokens({"logprobs": tokens}) == ([7, 8], [-0.5, -0.25])
    assert completion_tokens({"text": "plain", "logprobs": {"tokens": ["pl", "ain"]}}) == (
        None,
        None,
    )
    with pytest.raises(ModelError, match="2 log-probs for 1 generated ids"):
        completion_tokens({"token_ids": [1], "logprobs": {"token_logprobs": [-1, -2]}})


async def test_the_gateway_records_the_servers_ids_and_marks_a_turn_it_did_not_serve_as_given(
    qwen3_tokenizer,
) -> None:
    """Through the gateway's HTTP API: the tree's generated ids are the server's; a server
    that reports other prompt ids than it was sent makes the turn inexact, with the reason."""
    answers = [reply(qwen3_tokenizer, "Hi."), reply(qwen3_tokenizer, "Bye.")]
    with Retokenizing(answers[1:]) as bad, ScriptedChatServer(answers[:1]) as good:
        turns = []
        for server in (good, bad):
            model = from_spec(spec(server), token_backend=True)
            running = start(Gateway(TokenModelBackend(model)), port=0)
            try:
                session = running.gateway.open_session()
                client = openai.AsyncOpenAI(base_url=f"{running.url}/s/{session.id}/v1",
                                            api_key=session.key)  # fmt: skip
                done = await client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "hello"}]
                )
                await client.close()
                tree = running.gateway.close(session.id)["tree"]
            finally:
                running.stop()
                await model.aclose()
            turns.append((done, tree))
    (done, tree), (_, bad_tree) = turns
    assert done.choices[0].message.content == "Hi."
    node = tree["nodes"][-1]
    generated = [i for i, m in zip(node["ids"], node["mask"], strict=True) if m]
    assert generated == answers[0].token_ids
    assert tree["turns"][0]["exact"] is True and tree["turns"][0]["server"] is None
    turn = bad_tree["turns"][0]
    assert turn["exact"] is False and "prompt_ids_differ" in turn["server"]
    assert turn["drift"] == {"server_prompt": turn["server"]["prompt_ids_differ"]}


def test_a_harness_runs_on_a_served_model_through_uniagent_run(
    tiny, qwen3_tokenizer, tmp_path: Path
) -> None:
    """``uniagent run --agent tiny --model openai:...``: each gateway turn is one
    token-prompt request; the episode is graded and its tree is exact, with the server's ids."""
    write = reply(qwen3_tokenizer, hermes_call("bash", {"command": "echo hello > out.txt"}))
    done = reply(qwen3_tokenizer, "Done.")
    config = tmp_path / "agent.yaml"
    config.write_text(  # the agent comes from --agent
        "env: {deployment: {type: host, isolation: bwrap, network: true}}\n"
        "reward: {name: command, settings: {command: 'grep -qx hello out.txt'}}\n"
    )
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"id": "t", "problem_statement": "Write hello."}) + "\n")
    out = tmp_path / "out"
    with ScriptedChatServer([write, done]) as server:
        status = cli(["run", str(config), "--data", str(tasks), "--model", spec(server),
                      "--agent", "tiny", "--out", str(out), "--retries", "0"])  # fmt: skip
    episode = out / "episodes" / "t" / "0"
    result = json.loads((episode / "result.json").read_text())
    assert status == 0, (episode / "log.txt").read_text()[-2000:]
    assert result["exit_reason"] == "finished" and result["reward"] == 1.0
    completions = [r for r in server.requests if "prompt" in r]
    assert len(completions) == 2 and all("messages" not in r for r in completions)
    # The second turn's prompt extends the first turn's prompt and generated ids.
    first = completions[0]["prompt"] + write.token_ids
    assert completions[1]["prompt"][: len(first)] == first
    rollout = json.loads((episode / "rollout.json").read_text())
    assert all(t["exact"] for t in rollout["tree"]["turns"])
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["agent"] == {"name": "tiny", "settings": {}}
    generated = [i for i, m in zip(rollout["response_ids"], rollout["response_mask"]) if m]
    assert generated == write.token_ids + done.token_ids


def test_uniagent_gateway_serves_a_served_model(qwen3_tokenizer) -> None:
    with ScriptedChatServer([reply(qwen3_tokenizer, "Served.")]) as server:
        proc = subprocess.Popen(
            [sys.executable, "-m", "uniagent.cli", "gateway", "--model", spec(server),
             "--port", "0"],
            stdout=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            assert line.startswith("uniagent gateway: http://127.0.0.1:"), line
            url = line.split()[2]
            request = urllib.request.Request(url + "/sessions", method="POST")
            with urllib.request.urlopen(request, timeout=60) as r:
                opened = json.loads(r.read())
            client = openai.OpenAI(base_url=opened["base_url"] + "/v1", api_key=opened["key"])
            done = client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}]
            )
            assert done.choices[0].message.content == "Served."
        finally:
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=60) == 0
    assert server.requests[-1]["prompt"][-3:] == qwen3_tokenizer.encode(
        "<|im_start|>assistant\n", add_special_tokens=False
    )


def test_a_served_model_without_a_tokenizer_that_loads_names_the_option(
    capsys, monkeypatch
) -> None:
    # huggingface_hub reads the variable when first imported: another test of this process
    # may have imported it already, and then the lookup waits on the network (~50 s here).
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    status = cli(["gateway", "--model", "openai:http://127.0.0.1:9/v1#no-such/model"])
    assert status == 2
    assert "?tokenizer=PATH" in capsys.readouterr().err
