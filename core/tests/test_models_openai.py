"""OpenAIChatModel against a real HTTP chat-completions server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import BaseModel

from uniagent import ToolSpec
from uniagent.interaction.loop import parse_turn
from uniagent.models import ContextLimitError, ModelError
from uniagent.models.openai_chat import OpenAIChatModel, _generated_tokens
from uniagent.parsers import HermesParser, ToolCall, ToolCallFormatError
from uniagent.testing.chat_server import Fail, Gate, Reply, ScriptedChatServer, tool_call
from uniagent.testing.tokenizers import load_qwen3_tokenizer


class BashArgs(BaseModel):
    command: str


class NoArgs(BaseModel):
    pass


TOOLS = [
    ToolSpec(name="execute_bash", description="Run a command.", arguments=BashArgs),
    ToolSpec(name="submit", description="Submit.", arguments=NoArgs, ends_episode=True),
]
SCHEMAS = [t.openai_schema() for t in TOOLS]
PARSER = HermesParser()
MESSAGES = [
    {"role": "system", "content": "You are an agent."},
    {"role": "user", "content": "List the files."},
]
CALL_LS = '<tool_call>\n{"name": "execute_bash", "arguments": {"command": "ls"}}\n</tool_call>'


@pytest.fixture
def server() -> Iterator[ScriptedChatServer]:
    with ScriptedChatServer() as srv:
        yield srv


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return load_qwen3_tokenizer()


def make_model(server: ScriptedChatServer, **kwargs: Any) -> tuple[OpenAIChatModel, list[float]]:
    """A model whose sleeps between retries are recorded instead of waited for."""
    model = OpenAIChatModel(server.base_url, "test-model", **kwargs)
    delays: list[float] = []

    async def record(delay: float) -> None:
        delays.append(delay)

    model.sleep = record
    return model, delays


async def test_retries_429_and_500_then_structured_tool_calls(server: ScriptedChatServer) -> None:
    server.add(
        Fail(429, "slow down", headers={"Retry-After": "3"}),
        Fail(500, "boom"),
        Fail(503, "overloaded"),
        Reply("Listing.", tool_calls=[tool_call("execute_bash", {"command": "ls"}, "call_7")]),
    )
    model, delays = make_model(server, backoff=0.5, max_retries=3)
    cache = model.start_cache(MESSAGES, SCHEMAS)
    assert cache.mode == "messages"
    response = await model.generate(cache)

    assert delays == [3.0, 1.0, 2.0]  # Retry-After honoured, then 0.5 * 2**attempt
    assert len(server.requests) == 4
    assert response.finish_reason == "tool_calls"
    assert response.text == "Listing."
    assert parse_turn(response, PARSER, TOOLS, max_calls=1).tool_calls == [
        ToolCall("execute_bash", {"command": "ls"}, id="call_7")
    ]
    assert response.prompt_exact is None  # message mode: not known
    body = server.requests[-1]
    assert body["model"] == "test-model"
    assert body["messages"] == MESSAGES
    assert body["tools"] == SCHEMAS
    assert "logprobs" not in body
    assert server.headers[-1]["authorization"] == "Bearer EMPTY"
    assert cache.messages[-1] == {
        "role": "assistant",
        "content": "Listing.",
        "tool_calls": [tool_call("execute_bash", {"command": "ls"}, "call_7")],
    }
    # The next request sends the whole conversation, tool result included.
    server.add(Reply("", tool_calls=[tool_call("submit", {}, "call_8")]))
    cache.append_messages(
        [{"role": "tool", "content": "a\nb", "name": "execute_bash", "tool_call_id": "call_7"}]
    )
    response = await model.generate(cache)
    assert parse_turn(response, PARSER, TOOLS).tool_calls == [ToolCall("submit", {}, id="call_8")]
    sent = server.requests[-1]["messages"]
    assert sent[:-1] == cache.messages[:-2]
    assert sent[-1] == {"role": "tool", "content": "a\nb", "tool_call_id": "call_7"}


async def test_retries_exhausted_is_model_error(server: ScriptedChatServer) -> None:
    server.add(*[Fail(500, "down")] * 3)
    model, delays = make_model(server, backoff=1.0, max_retries=2, max_backoff=1.5)
    cache = model.start_cache(MESSAGES, SCHEMAS)
    with pytest.raises(ModelError, match="failed after 3 attempts: InternalServerError 500: down"):
        await model.generate(cache)
    assert delays == [1.0, 1.5]  # capped by max_backoff
    assert len(server.requests) == 3
    assert len(cache.messages) == len(MESSAGES)  # nothing recorded


async def test_credentials_in_the_url_stay_out_of_errors_and_logs(
    server: ScriptedChatServer, caplog: pytest.LogCaptureFixture
) -> None:
    host = server.base_url.removeprefix("http://")
    model = OpenAIChatModel(f"http://user:s3cret@{host}", "m", max_retries=1)
    model.sleep = lambda delay: asyncio.sleep(0)
    server.add(Fail(500, "down"), Fail(500, "down"))
    with caplog.at_level("WARNING"), pytest.raises(ModelError) as info:
        await model.generate(model.start_cache(MESSAGES))
    assert len(server.requests) == 2  # the credentials were used: the server was reached
    basic = "Basic " + base64.b64encode(b"user:s3cret").decode()
    assert [h["authorization"] for h in server.headers] == [basic, basic]
    assert server.base_url in str(info.value) and server.base_url in caplog.text
    assert "s3cret" not in str(info.value) and "s3cret" not in caplog.text


def test_one_model_serves_one_event_loop_after_another(server: ScriptedChatServer) -> None:
    """A model made outside any loop answers in one ``asyncio.run`` and then in another
    (its HTTP session belongs to a loop: the second loop gets its own)."""
    model = OpenAIChatModel(server.base_url, "m")
    server.add(Reply("one"), Reply("two"))

    async def turn() -> str:
        return (await model.generate(model.start_cache(MESSAGES))).text

    assert asyncio.run(turn()) == "one"

    async def turn_and_close() -> str:
        try:
            return await turn()
        finally:
            await model.aclose()

    assert asyncio.run(turn_and_close()) == "two"
    assert len(server.requests) == 2


async def test_many_requests_wait_on_one_server_at_once() -> None:
    """No cap on a model's connections: 150 episodes' requests are all at the server at once
    (a pool of 100, aiohttp's default, would hold the rest back)."""
    gate = Gate()

    def held(body: dict[str, Any]) -> Reply:
        gate.hold()
        return Reply("done")

    with ScriptedChatServer(default=held) as srv:
        model = OpenAIChatModel(srv.base_url, "m")
        turns = [
            asyncio.ensure_future(model.generate(model.start_cache(MESSAGES))) for _ in range(150)
        ]
        try:
            assert await asyncio.to_thread(gate.wait_for, 150, 120.0)
        finally:
            gate.release()
        assert [t.text for t in await asyncio.gather(*turns)] == ["done"] * 150
        await model.aclose()


async def test_the_environments_proxy_carries_the_requests_unless_no_proxy_names_the_host(
    server: ScriptedChatServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    with ScriptedChatServer() as proxy:
        proxy_url = proxy.base_url.removesuffix("/v1")
        for name in ("http_proxy", "all_proxy", "ALL_PROXY", "no_proxy", "NO_PROXY"):
            monkeypatch.delenv(name, raising=False)  # (lower case wins over upper case)
        monkeypatch.setenv("HTTP_PROXY", proxy_url)
        proxy.add(Reply("through the proxy"))
        model = OpenAIChatModel(server.base_url, "m")
        assert (await model.generate(model.start_cache(MESSAGES))).text == "through the proxy"
        await model.aclose()
        assert (len(proxy.requests), len(server.requests)) == (1, 0)
        monkeypatch.setenv("NO_PROXY", "127.0.0.1")
        server.add(Reply("direct"))
        model = OpenAIChatModel(server.base_url, "m")
        assert (await model.generate(model.start_cache(MESSAGES))).text == "direct"
        await model.aclose()
        assert (len(proxy.requests), len(server.requests)) == (1, 1)


async def test_connection_refused_is_retried_then_model_error() -> None:
    with ScriptedChatServer() as srv:
        url = srv.base_url
    model = OpenAIChatModel(url, "m", max_retries=2, backoff=0.25)
    delays: list[float] = []

    async def record(delay: float) -> None:
        delays.append(delay)

    model.sleep = record
    with pytest.raises(ModelError, match="APIConnectionError"):
        await model.generate(model.start_cache(MESSAGES))
    assert delays == [0.25, 0.5]


@pytest.mark.parametrize(
    ("fail", "error", "fragment"),
    [
        (Fail(400, "bad schema"), ModelError, "rejected the request: BadRequestError 400"),
        (Fail(401, "no key"), ModelError, "AuthenticationError 401: no key"),
        (Fail(404, "no such model"), ModelError, "NotFoundError 404"),
        (
            Fail(
                400,
                "This model's maximum context length is 32768 tokens. However, you "
                "requested 40000 tokens.",
            ),
            ContextLimitError,
            "maximum context length",
        ),
        (Fail(400, "too long", code="context_length_exceeded"), ContextLimitError, "too long"),
        # llama.cpp's server and TGI (422) say it their way; still the policy's prompt.
        (
            Fail(400, "the request exceeds the available context size, try increasing it"),
            ContextLimitError,
            "available context size",
        ),
        (
            Fail(
                422,
                "Input validation error: `inputs` tokens + `max_new_tokens` must be "
                "<= 4096. Given: 4000 `inputs` tokens and 200 `max_new_tokens`",
            ),
            ContextLimitError,
            "UnprocessableEntityError 422",
        ),
        (Fail(422, "temperature must be <= 2"), ModelError, "UnprocessableEntityError 422"),
    ],
)
async def test_client_errors_are_not_retried(
    server: ScriptedChatServer, fail: Fail, error: type[Exception], fragment: str
) -> None:
    server.add(fail)
    model, delays = make_model(server)
    with pytest.raises(error) as info:
        await model.generate(model.start_cache(MESSAGES))
    assert fragment in str(info.value)
    assert delays == [] and len(server.requests) == 1


async def test_text_reply_is_parsed_by_the_loop(server: ScriptedChatServer) -> None:
    server.add(Reply("Let me look.\n" + CALL_LS, reasoning_content="thinking..."))
    model, _ = make_model(server, send_tools=False)
    cache = model.start_cache(MESSAGES, SCHEMAS)
    response = await model.generate(cache)
    assert "tools" not in server.requests[0]
    assert response.finish_reason == "stop"
    assert response.raw_tool_calls is None
    assert response.reasoning == "thinking..."
    parsed = parse_turn(response, PARSER, TOOLS)
    assert parsed.content == "Let me look."
    assert parsed.tool_calls == [ToolCall("execute_bash", {"command": "ls"})]
    assert cache.messages[-1]["reasoning_content"] == "thinking..."
    # In message mode the reasoning is not sent back (OpenAI rejects unknown fields).
    server.add(Reply("ok"))
    cache.append_messages([{"role": "tool", "content": "a"}])
    await model.generate(cache)
    assert "reasoning_content" not in server.requests[1]["messages"][2]


async def test_invalid_structured_calls_are_format_errors(server: ScriptedChatServer) -> None:
    server.add(
        Reply("", tool_calls=[tool_call("rm_rf", {"path": "/"})]),
        Reply("", tool_calls=[tool_call("execute_bash", '{"command": ')]),
        Reply("", tool_calls=[tool_call("submit", {}, "a"), tool_call("submit", {}, "b")]),
    )
    model, _ = make_model(server)
    cache = model.start_cache(MESSAGES, SCHEMAS)
    for kind in ("unknown_tool", "invalid_json"):
        response = await model.generate(cache)
        with pytest.raises(ToolCallFormatError) as info:
            parse_turn(response, PARSER, TOOLS)
        assert info.value.kind == kind
        # The feedback speaks of function calls, the format the model used, not of text.
        assert "a function call to" in str(info.value) and "<tool_call>" not in str(info.value)
        cache.append_messages([{"role": "tool", "content": str(info.value)}])
    response = await model.generate(cache)
    assert len(response.raw_tool_calls or []) == 2
    with pytest.raises(ToolCallFormatError) as info:
        parse_turn(response, PARSER, TOOLS, max_calls=1)
    assert info.value.kind == "too_many_calls"


async def test_sampling_params_split_between_body_and_extra_body(
    server: ScriptedChatServer,
) -> None:
    server.add(Reply("hi", finish_reason="length"))
    params = {"temperature": 0.6, "max_tokens": 64, "top_k": 20, "min_p": 0.0}
    model, _ = make_model(
        server, sampling_params=params, chat_template_kwargs={"enable_thinking": False}
    )
    response = await model.generate(model.start_cache(MESSAGES))
    body = server.requests[0]
    assert (body["temperature"], body["max_tokens"], body["top_k"], body["min_p"]) == (
        0.6,
        64,
        20,
        0.0,
    )
    assert body["chat_template_kwargs"] == {"enable_thinking": False}
    assert response.finish_reason == "length"
    assert response.usage.completion_tokens == 1


async def test_the_configs_sampling_reaches_the_request_body_with_its_extra_body(
    server: ScriptedChatServer,
) -> None:
    from uniagent.config import AgentConfig

    sampling = {"temperature": 0.2, "top_k": 5, "extra_body": {"min_tokens": 3, "ignore_eos": True}}
    config = AgentConfig.from_dict({"sampling": sampling})
    server.add(Reply("hi"))
    # As `uniagent run` builds the backend: the config's sampling as a mapping.
    model, _ = make_model(server, sampling_params=dict(config.sampling), extra_body={"a": 1})
    await model.generate(model.start_cache(MESSAGES))
    body = server.requests[0]
    assert (body["temperature"], body["top_k"]) == (0.2, 5)
    assert (body["min_tokens"], body["ignore_eos"], body["a"]) == (3, True, 1)
    assert "extra_body" not in body and "top_p" not in body  # flat, and nothing unset sent


# -- token mode (vLLM) --------------------------------------------------------------------
async def test_token_mode_records_vllm_token_ids(tokenizer: Any) -> None:
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    ids1 = [*tokenizer.encode(CALL_LS, add_special_tokens=False), im_end]
    lps1 = [-0.5] * len(ids1)
    with ScriptedChatServer(tokenizer=tokenizer) as server:
        server.add(Reply(CALL_LS, token_ids=ids1, logprobs=lps1))
        model, _ = make_model(server, tokenizer=tokenizer, max_model_len=4096)
        cache = model.start_cache(MESSAGES, SCHEMAS)
        assert cache.mode == "tokens"
        response = await model.generate(cache)
        body = server.requests[0]
        assert body["logprobs"] is True and body["top_logprobs"] == 0
        assert body["return_token_ids"] is True and body["return_tokens_as_token_ids"] is True
        assert body["max_tokens"] == 4096 - len(cache.prompt_ids)
        assert response.prompt_exact is True
        assert cache.response_ids == ids1
        assert cache.response_mask == [1] * len(ids1)
        assert cache.response_logprobs == lps1
        assert parse_turn(response, PARSER, TOOLS).tool_calls == [
            ToolCall("execute_bash", {"command": "ls"})
        ]

        # Turn 2: the server renders the conversation itself and it still matches.
        cache.append_messages([{"role": "tool", "content": "a\nb"}])
        ids2 = [*tokenizer.encode("Done.", add_special_tokens=False), im_end]
        server.add(Reply("Done.", token_ids=ids2))
        response = await model.generate(cache)
        assert response.prompt_exact is True
        assert cache.response_ids[-len(ids2) :] == ids2
        assert cache.check_exactness().ok

        # Turn 3: the server returns content that differs from its tokens (as when a
        # parser rewrites it); the next prompt it renders no longer matches the cache.
        cache.append_messages([{"role": "user", "content": "again"}])
        ids3 = [*tokenizer.encode("Real text.", add_special_tokens=False), im_end]
        server.add(Reply("Other text.", token_ids=ids3), Reply("x", token_ids=ids3))
        await model.generate(cache)
        cache.append_messages([{"role": "user", "content": "more"}])
        response = await model.generate(cache)
        assert response.prompt_exact is False


async def test_token_mode_needs_token_ids(server: ScriptedChatServer, tokenizer: Any) -> None:
    server.add(Reply("no ids"))
    model, _ = make_model(server, tokenizer=tokenizer)
    cache = model.start_cache(MESSAGES, SCHEMAS)
    with pytest.raises(ModelError, match="returned no token ids"):
        await model.generate(cache)
    assert cache.response_ids == []


async def test_token_mode_context_full(server: ScriptedChatServer, tokenizer: Any) -> None:
    model, _ = make_model(server, tokenizer=tokenizer, max_model_len=10)
    with pytest.raises(ContextLimitError, match="max_model_len=10"):
        await model.generate(model.start_cache(MESSAGES, SCHEMAS))
    assert server.requests == []


def test_generated_tokens_from_logprobs_only() -> None:
    choice = {
        "logprobs": {
            "content": [
                {"token": "token_id:151657", "logprob": -0.1},
                {"token": "token_id:198", "logprob": -0.2},
            ]
        }
    }
    assert _generated_tokens(choice) == ([151657, 198], [-0.1, -0.2])
    assert _generated_tokens({"logprobs": {"content": [{"token": "hi", "logprob": -1}]}}) == (
        None,
        None,
    )
    assert _generated_tokens({"token_ids": [5, 6]}) == ([5, 6], None)
    assert _generated_tokens({}) == (None, None)


def test_chat_server_script_exhausted_and_models_route(server: ScriptedChatServer) -> None:
    import json
    import urllib.error
    import urllib.request

    with urllib.request.urlopen(server.base_url + "/models") as resp:
        assert json.load(resp)["data"][0]["id"] == "test-model"
    request = urllib.request.Request(
        server.base_url + "/chat/completions",
        data=json.dumps({"model": "m", "messages": []}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(request)
    assert info.value.code == 500
    assert "script is exhausted" in info.value.read().decode()


@pytest.mark.parametrize(
    ("server_kwargs", "key", "refused"),
    [
        ({"api_key": "k"}, "k", False),
        ({"api_key": "k"}, "wrong", True),  # 401: the key is refused, stop (status 2)
        # 403 on the model list: a restricted key that may chat; the episodes tell.
        ({"api_key": "k", "models_status": 403}, "k", False),
        ({"models_status": 404}, "k", False),  # no model list on this server
    ],
    ids=["ok", "wrong-key", "list-not-allowed", "no-list"],
)
async def test_the_preflight_stops_only_for_a_refused_key(server_kwargs, key, refused) -> None:
    from uniagent.errors import ConfigError
    from uniagent.run.preflight import check_model

    with ScriptedChatServer(**server_kwargs) as srv:
        model = OpenAIChatModel(srv.base_url, "m", api_key=key)
        if refused:
            with pytest.raises(ConfigError, match="refused the API key"):
                await check_model(model)
        else:
            await check_model(model)
        await model.aclose()
