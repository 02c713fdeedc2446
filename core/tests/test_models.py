"""Token backends (VerlServerModel) against a scripted token server and the real Qwen3 tokenizer."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from typing import Any

import pytest
from pydantic import BaseModel

from uniagent import ToolSpec
from uniagent.errors import ConfigError
from uniagent.interaction.loop import parse_turn
from uniagent.models import (
    ChatModel,
    ContextLimitError,
    ModelError,
    VerlServerModel,
    check_spec,
    from_spec,
)
from uniagent.parsers import HermesParser, Qwen3CoderParser, ToolCall, ToolCallFormatError
from uniagent.testing.tokenizers import load_qwen3_tokenizer


class BashArgs(BaseModel):
    command: str


TOOLS = [ToolSpec(name="execute_bash", description="Run a command.", arguments=BashArgs)]
SCHEMAS = [t.openai_schema() for t in TOOLS]
PARSER = HermesParser()
MESSAGES = [
    {"role": "system", "content": "You are an agent."},
    {"role": "user", "content": "List the files."},
]


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return load_qwen3_tokenizer()


@dataclass
class TokenOutput:
    """The shape of verl 0.9.1's ``TokenOutput`` (only what the model reads)."""

    token_ids: list[int]
    log_probs: list[float] | None = None
    routed_experts: Any = None
    stop_reason: str | None = "completed"
    num_preempted: int | None = None
    extra_fields: dict[str, Any] = field(default_factory=dict)


class ScriptedTokenServer:
    """Duck-types verl's server manager: returns scripted outputs, records every call."""

    def __init__(self, outputs: list[TokenOutput | Exception]) -> None:
        self.outputs = list(outputs)
        self.calls: list[dict[str, Any]] = []

    async def generate(
        self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any], **kw: Any
    ) -> TokenOutput:
        call = {"request_id": request_id, "prompt_ids": list(prompt_ids)}
        self.calls.append({**call, "params": dict(sampling_params)})
        out = self.outputs.pop(0)
        if isinstance(out, Exception):
            raise out
        return out


def gen(tokenizer: Any, text: str, *, eot: bool = True, logprob: float = -0.25) -> TokenOutput:
    """What a server returns for ``text`` (canonical tokens, plus ``<|im_end|>``)."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    if eot:
        ids.append(tokenizer.convert_tokens_to_ids("<|im_end|>"))
    return TokenOutput(token_ids=ids, log_probs=[logprob - i / 1000 for i in range(len(ids))])


CALL_LS = '<tool_call>\n{"name": "execute_bash", "arguments": {"command": "ls"}}\n</tool_call>'
CALL_CAT = '<tool_call>\n{"name": "execute_bash", "arguments": {"command": "cat a"}}\n</tool_call>'


async def test_verl_model_two_turns_token_exact(tokenizer: Any) -> None:
    first = gen(tokenizer, "<think>\nLook first.\n</think>\n\n" + CALL_LS)
    second = gen(tokenizer, CALL_CAT)
    server = ScriptedTokenServer([first, second])
    params = {"temperature": 1.0, "top_p": 1.0, "logprobs": True}
    model = VerlServerModel(server, tokenizer, params, max_model_len=4096, response_length=2048)
    assert isinstance(model, ChatModel)

    cache = model.start_cache(MESSAGES, SCHEMAS)
    response = await model.generate(cache)
    assert server.calls[0]["prompt_ids"] == cache.prompt_ids
    assert response.finish_reason == "stop"
    assert response.prompt_exact is True
    assert response.text == "<think>\nLook first.\n</think>\n\n" + CALL_LS  # no <|im_end|>
    assert response.raw_tool_calls is None  # text: the loop parses it
    assert parse_turn(response, PARSER, TOOLS, max_calls=1).tool_calls == [
        ToolCall("execute_bash", {"command": "ls"})
    ]
    assert response.usage.prompt_tokens == len(cache.prompt_ids)
    assert response.usage.completion_tokens == len(first.token_ids)
    assert cache.response_ids == first.token_ids
    assert cache.response_mask == [1] * len(first.token_ids)
    assert cache.response_logprobs == first.log_probs

    cache.append_messages([{"role": "tool", "content": "a\nb"}])
    context_before = cache.context_ids
    response2 = await model.generate(cache)
    assert server.calls[1]["prompt_ids"] == context_before
    assert parse_turn(response2, PARSER, TOOLS).tool_calls == [
        ToolCall("execute_bash", {"command": "cat a"})
    ]
    # One request id per episode (sticky session); the caller's params untouched.
    assert server.calls[0]["request_id"] == server.calls[1]["request_id"] == model.request_id
    assert params == {"temperature": 1.0, "top_p": 1.0, "logprobs": True}
    assert server.calls[0]["params"]["temperature"] == 1.0
    # max_tokens is what remains of the budgets.
    assert server.calls[0]["params"]["max_tokens"] == min(4096 - len(cache.prompt_ids), 2048)
    assert server.calls[1]["params"]["max_tokens"] == min(
        4096 - len(context_before), 2048 - (len(context_before) - len(cache.prompt_ids))
    )
    ids = cache.context_ids
    assert ids[: len(context_before)] == context_before
    assert cache.response_ids[-len(second.token_ids) :] == second.token_ids
    report = cache.check_exactness()
    assert report.prefix_ok and report.ok, report.summary()


async def test_verl_model_response_budget_spent_raises_context_limit(tokenizer: Any) -> None:
    first = gen(tokenizer, CALL_LS)
    server = ScriptedTokenServer([first])
    model = VerlServerModel(server, tokenizer, {}, response_length=len(first.token_ids) + 3)
    cache = model.start_cache(MESSAGES, SCHEMAS)
    await model.generate(cache)
    cache.append_messages([{"role": "tool", "content": "a long observation " * 3}])
    with pytest.raises(ContextLimitError, match="response_length="):
        await model.generate(cache)
    assert len(server.calls) == 1  # no call was made without room


async def test_verl_model_cut_by_budget_is_length_then_context_limit(tokenizer: Any) -> None:
    cache_probe = VerlServerModel(None, tokenizer).start_cache(MESSAGES, SCHEMAS)
    room = 5
    ids = tokenizer.encode("I will think about this for a very long time", add_special_tokens=False)
    server = ScriptedTokenServer([TokenOutput(token_ids=ids[:room], log_probs=[-1.0] * room)])
    model = VerlServerModel(server, tokenizer, {}, max_model_len=len(cache_probe.prompt_ids) + room)
    cache = model.start_cache(MESSAGES, SCHEMAS)
    with pytest.raises(ContextLimitError):
        await model.generate(cache)
    assert server.calls[0]["params"]["max_tokens"] == room
    assert cache.response_ids == ids[:room]  # the cut generation is kept


async def test_verl_model_per_turn_max_tokens_is_length_not_limit(tokenizer: Any) -> None:
    ids = tokenizer.encode("Hmm, let me think about it", add_special_tokens=False)[:4]
    server = ScriptedTokenServer([TokenOutput(token_ids=ids, log_probs=None)])
    model = VerlServerModel(server, tokenizer, {"max_tokens": 4}, max_model_len=8192)
    cache = model.start_cache(MESSAGES, SCHEMAS)
    response = await model.generate(cache)
    assert response.finish_reason == "length"
    assert server.calls[0]["params"]["max_tokens"] == 4
    assert not cache.has_logprobs
    with pytest.raises(ToolCallFormatError) as info:
        parse_turn(response, PARSER, TOOLS)
    assert info.value.kind == "no_tool_call"


async def test_verl_model_server_stop_reason_length(tokenizer: Any) -> None:
    out = gen(tokenizer, "partial", eot=False)
    out.stop_reason = "length"
    model = VerlServerModel(ScriptedTokenServer([out]), tokenizer, {})
    response = await model.generate(model.start_cache(MESSAGES, SCHEMAS))
    assert response.finish_reason == "length"


@pytest.mark.parametrize(
    ("output", "message"),
    [
        (TokenOutput(token_ids=[], stop_reason="aborted"), "aborted"),
        (TokenOutput(token_ids=[]), "no tokens"),
        (TokenOutput(token_ids=[1, 2], log_probs=[0.0]), "1 log-probs for 2 tokens"),
        (RuntimeError("replica down"), "RuntimeError: replica down"),
    ],
)
async def test_verl_model_failures_are_model_errors(
    tokenizer: Any, output: Any, message: str
) -> None:
    model = VerlServerModel(ScriptedTokenServer([output]), tokenizer, {})
    cache = model.start_cache(MESSAGES, SCHEMAS)
    with pytest.raises(ModelError, match=message):
        await model.generate(cache)
    assert cache.response_ids == []


async def test_verl_model_rejects_message_cache(tokenizer: Any) -> None:
    from uniagent.rollout import Rollout

    model = VerlServerModel(ScriptedTokenServer([]), tokenizer, {})
    with pytest.raises(ModelError, match="token-mode cache"):
        await model.generate(Rollout.messages_only(MESSAGES))


def test_each_model_gets_its_own_request_id(tokenizer: Any) -> None:
    a = VerlServerModel(None, tokenizer)
    b = VerlServerModel(None, tokenizer)
    assert a.request_id != b.request_id
    assert VerlServerModel(None, tokenizer, request_id="ep-1").request_id == "ep-1"


# -- from_spec ----------------------------------------------------------------------------
def test_from_spec_openai() -> None:
    from uniagent.models.openai_chat import OpenAIChatModel

    model = from_spec("openai:http://127.0.0.1:9/v1#Qwen/Qwen3-8B", max_retries=1)
    assert isinstance(model, OpenAIChatModel)
    assert (model.base_url, model.model, model.max_retries) == (
        "http://127.0.0.1:9/v1",
        "Qwen/Qwen3-8B",
        1,
    )
    assert isinstance(model, ChatModel)


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ("gpt-4", "is not of the form"),
        ("openai:", "is not of the form"),
        ("openai:http://127.0.0.1:8000/v1", "name the model after '#'"),
        ("openai:http://127.0.0.1:8000/v1#", "name the model after '#'"),
        ("openai:127.0.0.1:8000#m", "must start with http(s)://"),
        ("vllm:http://x#m", "unknown model kind 'vllm'"),
    ],
)
def test_from_spec_errors(spec: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        from_spec(spec)
    assert fragment in str(info.value)
    with pytest.raises(ConfigError) as checked:  # the check says the same, loading nothing
        check_spec(spec, PARSER)
    assert str(checked.value) == str(info.value)


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ("llama:x", "unknown model kind 'llama'"),
        ("hf:?guided=tool_call", "name a model before the options"),
        ("hf:{dir}?guided=bogus", "unknown mode 'bogus'; available: tool_call"),
        ("hf:{dir}?guided=", "unknown mode ''"),
        ("hf:{dir}?guide=tool_call", "unknown option 'guide'; allowed: guided"),
        ("hf:{dir}?guided=tool_call&guided=tool_call", "option 'guided' is given twice"),
        ("hf:{dir}?thought=10", "thought applies only with guided=tool_call"),
        ("hf:{dir}?guided=tool_call&thought=lots", "thought must be a number of characters"),
        ("hf:{dir}?guided=tool_call&thought=-1", "from 0 to 4000, got -1"),
        ("hf:{dir}?guided=tool_call&thought=100000", "from 0 to 4000, got 100000"),
        ("hf:/nonexistent/model?guided=tool_call", "/nonexistent/model does not exist"),
        ("hf:./missing.gguf", "./missing.gguf does not exist"),
        ("openai:http://127.0.0.1:8000/v1#m?tokenizer=x&guided=tool_call", "unknown option"),
    ],
)
def test_check_spec_rejects_a_bad_spec_in_one_line(tmp_path, spec: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        check_spec(spec.format(dir=tmp_path), PARSER)
    message = str(info.value)
    assert fragment in message
    assert "\n" not in message


def test_check_spec_accepts_good_specs(tmp_path) -> None:
    (tmp_path / "m.gguf").write_bytes(b"")
    sampling = {"temperature": 0.7, "num_beams": 1}
    for spec in (
        f"hf:{tmp_path}",
        "openai:http://127.0.0.1:8000/v1#Qwen/Qwen3-8B?tokenizer=Qwen/Qwen3-8B",
    ):
        check_spec(spec, PARSER, sampling=sampling)
    # Guided decoding needs the hf extra's llguidance (the core suite runs without it).
    has_llguidance = importlib.util.find_spec("llguidance") is not None
    for spec in (
        f"hf:{tmp_path}?guided=tool_call",  # the path is checked without its options
        f"hf:{tmp_path}/m.gguf?guided=tool_call&thought=0",
        f"hf:{tmp_path}?guided=tool_call&thought=4000",
    ):
        if has_llguidance:
            check_spec(spec, PARSER, sampling=sampling)
        else:
            with pytest.raises(ConfigError, match="guided decoding needs llguidance"):
                check_spec(spec, PARSER, sampling=sampling)


def test_hf_refuses_sampling_it_would_ignore_and_checks_extra_body(tmp_path) -> None:
    from uniagent.models.hf import HFLocalModel

    for key, value in (("stop", ["x"]), ("min_p", 0.1), ("presence_penalty", 0.5)):
        with pytest.raises(ConfigError) as info:
            check_spec(f"hf:{tmp_path}", PARSER, sampling={key: value})
        assert f"sampling.{key} is not applied by hf: models" in str(info.value)
        assert "\n" not in str(info.value)
        with pytest.raises(ConfigError, match=f"sampling.{key} is not applied"):
            HFLocalModel(object(), tokenizer=object(), sampling_params={key: value})
    # extra_body is transformers' generate() options: checked against guided decoding.
    sampling = {"extra_body": {"num_beams": 4}}
    check_spec(f"hf:{tmp_path}", PARSER, sampling=sampling)  # unguided: beams are fine
    with pytest.raises(ConfigError, match=r"sampling\.extra_body\.num_beams=4 cannot"):
        check_spec(f"hf:{tmp_path}?guided=tool_call", PARSER, sampling=sampling)


def test_check_spec_rejects_guided_options_that_do_not_fit(tmp_path) -> None:
    spec = f"hf:{tmp_path}?guided=tool_call"
    with pytest.raises(ConfigError, match="supports the hermes tool parser, not 'qwen3_coder'"):
        check_spec(spec, Qwen3CoderParser())
    check_spec(f"hf:{tmp_path}", Qwen3CoderParser())  # unguided: any parser
    for sampling, key in (
        ({"num_beams": 4}, "sampling.num_beams=4"),
        ({"prompt_lookup_num_tokens": 3}, "sampling.prompt_lookup_num_tokens=3"),
        ({"assistant_model": "HuggingFaceTB/SmolLM2-135M"}, "sampling.assistant_model="),
        ({"num_return_sequences": 2}, "sampling.num_return_sequences=2"),
    ):
        with pytest.raises(ConfigError) as info:
            check_spec(spec, PARSER, sampling=sampling)
        assert key in str(info.value) and "cannot be used with guided decoding" in str(info.value)
        assert "\n" not in str(info.value)
        check_spec(f"hf:{tmp_path}", PARSER, sampling=sampling)  # unguided: not refused here
