"""UniAgentLoop inside verl 0.9.1's real AgentLoopWorker, on the CPU, with real sandboxes.

The batch comes from the real data path: ``uniagent data prepare`` → Parquet → verl's
``RLHFDataset`` → ``collate_fn`` → ``DataProto``. The loop is registered through the
agent-loop YAML exactly as a user does it. A scripted token server plays the model.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from verl_helpers import (
    AGENT,
    SCRIPTS,
    agent_field,
    make_batch,
    make_loop,
    make_worker,
    task,
    trainer_config,
    unpad,
    write_loop_yaml,
)

from uniagent.verl.output import EXTRA_FIELD_KEYS, UNIAGENT_FIELDS, extras_record
from uniagent.verl.testing import ScriptedTokenServer


def episode_calls(server: ScriptedTokenServer, prompt: list[int]) -> list[Any]:
    """The server calls of the episode whose first call was given exactly ``prompt``."""
    firsts = [c for c in server.calls if c.prompt_ids == prompt]
    assert len(firsts) == 1, "each episode starts with its own prompt, once"
    return [c for c in server.calls if c.request_id == firsts[0].request_id]


def expected_spans(
    prompt: list[int], calls: Sequence[Any], length: int
) -> tuple[list[int], list[float], list[int]]:
    """Mask and log-probs the calls imply, and the ids the model produced, cut to ``length``."""
    mask, logprobs, generated = [0] * length, [0.0] * length, []
    for call in calls:
        start = len(call.prompt_ids) - len(prompt)
        for j, (token, lp) in enumerate(zip(call.token_ids, call.log_probs, strict=True)):
            if start + j < length:
                mask[start + j], logprobs[start + j] = 1, lp
                generated.append(token)
    return mask, logprobs, generated


def check_token_exact(out: Any, i: int, server: ScriptedTokenServer, tokenizer: Any) -> list[Any]:
    """Sample ``i`` is exactly what the model saw and produced; returns its server calls."""
    prompt, response, mask, logprobs, _ = unpad(out, i)
    calls = episode_calls(server, prompt)
    full = prompt + response
    for call in calls:  # every context the model got is a prefix of the final ids ...
        seen = len(call.prompt_ids)
        assert full[:seen] == call.prompt_ids
        produced = full[seen : seen + len(call.token_ids)]  # ... followed by its own output
        assert produced == call.token_ids[: len(produced)]
    exp_mask, exp_logprobs, generated = expected_spans(prompt, calls, len(response))
    assert mask == exp_mask
    assert logprobs == pytest.approx(exp_logprobs)
    model_ids = [t for t, m in zip(response, mask, strict=True) if m]
    assert tokenizer.decode(model_ids) == tokenizer.decode(generated)
    return calls


def field(out: Any, key: str) -> list[Any]:
    """A non-tensor column as a list."""
    return list(out.non_tensor_batch[key])


async def test_mixed_batch_through_agent_loop_worker(
    tmp_path: Path, verl_model_dir: Path, qwen3_tokenizer: Any
) -> None:
    """Finished, max-turn, format-error, failed-sandbox and bad-override episodes in one batch."""
    loop_yaml = write_loop_yaml(tmp_path, AGENT)
    tasks = [
        task("fin", "[script:finish]"),
        task("loop", "[script:loop]"),
        task("garbage", "[script:garbage]"),
        task("broken", "[script:finish]", tools_kwargs={"env": {"post_setup": ["false"]}}),
        task("badcfg", "[script:finish]"),
    ]
    batch = make_batch(tmp_path, qwen3_tokenizer, tasks)
    # A row whose override is invalid (data prepare refuses those; hand-made data may not).
    batch.non_tensor_batch["tools_kwargs"][4] = json.dumps({"interaction": {"max_turns": 0}})
    server = ScriptedTokenServer(str(verl_model_dir), SCRIPTS, global_steps=5)
    config = trainer_config(verl_model_dir, loop_yaml, response_length=512)
    out = await make_worker(config, server).generate_sequences(batch)

    size, prompt_length, response_length = len(tasks), 2048, 512
    assert out.batch["prompts"].shape == (size, prompt_length)
    for key in ("responses", "response_mask", "rollout_log_probs", "rm_scores"):
        assert out.batch[key].shape == (size, response_length), key
    assert out.batch["input_ids"].shape == (size, prompt_length + response_length)
    for key in EXTRA_FIELD_KEYS:
        assert key in out.non_tensor_batch, key
    for record in out.non_tensor_batch["extras"]:
        assert set(extras_record(record) or {}) == set(UNIAGENT_FIELDS)
    assert field(out, "turn_scores") == [[]] * size
    assert field(out, "tool_rewards") == [[]] * size
    assert field(out, "reward_extra_info") == [{"acc": r} for r in [1.0, 0.0, 0.0, 0.0, 0.0]]

    assert agent_field(out, "exit_reason") == [
        "finished",
        "max_step_limit",
        "format_error",
        "env_error",
        "unknown_error",
    ]
    assert agent_field(out, "traj_masked") == [False, False, False, True, True]
    rewards = [1.0, 0.0, 0.0, 0.0, 0.0]

    turns = {0: 2, 1: 3, 2: 2}  # model calls per trained episode
    for i in (0, 1, 2):
        calls = check_token_exact(out, i, server, qwen3_tokenizer)
        assert len(calls) == turns[i]
        _, response, mask, _, scores = unpad(out, i)
        assert sum(mask) > 0
        assert scores[len(response) - 1] == rewards[i]
        assert sum(scores) == rewards[i]
    assert agent_field(out, "tool_calls")[0] == {"execute_bash": 1, "finish": 1}
    assert agent_field(out, "format_errors")[2] == 2
    assert agent_field(out, "turns")[1] == 3
    assert all(agent_field(out, "setup_seconds")[i] > 0 for i in (0, 1, 2, 3))

    for i in (3, 4):  # masked placeholders: one token, mask 0, log-prob 0.0, reward 0.0
        prompt, response, mask, logprobs, scores = unpad(out, i)
        assert len(response) == 1 and mask == [0] and logprobs == [0.0]
        assert scores == [0.0] * response_length
        assert not any(c.prompt_ids == prompt for c in server.calls)
    assert "setup command 'false'" in agent_field(out, "error")[3]
    assert "max_turns" in agent_field(out, "error")[4]

    assert out.non_tensor_batch["__num_turns__"].tolist()[:3] == [4, 7, 4]
    # Weight versions as verl's trainers read them: integers, for every sample.
    assert field(out, "min_global_steps")[:3] == [5, 5, 5]
    assert field(out, "max_global_steps")[:3] == [5, 5, 5]
    np.array(field(out, "min_global_steps") + field(out, "max_global_steps"), dtype=int)
    metrics = out.meta_info["metrics"]
    assert len(metrics) == size
    assert all(m["generate_sequences"] >= 0 and m["tool_calls"] >= 0 for m in metrics)
    assert metrics[0]["tool_calls"] > 0


async def test_episode_longer_than_response_length_stays_aligned(
    tmp_path: Path, verl_model_dir: Path, qwen3_tokenizer: Any
) -> None:
    """A huge observation overflows response_length: cut, aligned, batch intact."""
    loop_yaml = write_loop_yaml(tmp_path, AGENT)
    tasks = [task("long", "[script:long]"), task("fin", "[script:finish]")]
    batch = make_batch(tmp_path, qwen3_tokenizer, tasks)
    server = ScriptedTokenServer(str(verl_model_dir), SCRIPTS)
    config = trainer_config(verl_model_dir, loop_yaml, response_length=256)
    out = await make_worker(config, server).generate_sequences(batch)

    assert out.batch["responses"].shape == (2, 256)
    _, response, mask, _, scores = unpad(out, 0)
    assert len(response) == 256  # filled to the brim, not beyond
    assert agent_field(out, "truncated") == [True, False]
    assert agent_field(out, "exit_reason")[0] == "token_limit"
    assert agent_field(out, "traj_masked") == [False, False]
    calls = check_token_exact(out, 0, server, qwen3_tokenizer)
    assert len(calls) == 1 and sum(mask) == len(calls[0].token_ids)
    assert scores[255] == 0.0 and sum(scores) == 0.0
    check_token_exact(out, 1, server, qwen3_tokenizer)
    assert unpad(out, 1)[4][len(unpad(out, 1)[1]) - 1] == 1.0
    assert torch.equal(out.batch["input_ids"][0, 2048:], out.batch["responses"][0])


async def five_finishing_episodes(
    tmp_path: Path, model_dir: Path, tokenizer: Any, keys: dict[str, Any], num_workers: int
) -> Any:
    """A batch of five tasks that finish at once, generated by a worker whose agent config
    has ``keys`` besides the usual ones."""
    loop_yaml = write_loop_yaml(tmp_path, {**AGENT, **keys})
    tasks = [task(f"t{i}", "[script:finish]") for i in range(5)]
    batch = make_batch(tmp_path, tokenizer, tasks)
    server = ScriptedTokenServer(str(model_dir), SCRIPTS)
    config = trainer_config(model_dir, loop_yaml, num_workers=num_workers)
    return await make_worker(config, server).generate_sequences(batch)


async def test_semaphore_bounds_open_sandboxes_per_worker(
    tmp_path: Path, verl_model_dir: Path, qwen3_tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """concurrency 4 over 2 workers: at most 2 sandboxes open at once in one worker."""
    from uniagent.env import AgentEnv

    events: list[tuple[str, int]] = []
    open_now = {"n": 0, "max": 0}
    real_start, real_close = AgentEnv.start, AgentEnv.close

    async def start(self: Any, *args: Any, **kwargs: Any) -> Any:
        open_now["n"] += 1
        open_now["max"] = max(open_now["max"], open_now["n"])
        events.append(("start", id(self)))
        return await real_start(self, *args, **kwargs)

    async def close(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return await real_close(self, *args, **kwargs)
        finally:
            if ("close", id(self)) not in events:
                open_now["n"] -= 1
                events.append(("close", id(self)))

    monkeypatch.setattr(AgentEnv, "start", start)
    monkeypatch.setattr(AgentEnv, "close", close)

    out = await five_finishing_episodes(
        tmp_path, verl_model_dir, qwen3_tokenizer, {"concurrency": 4}, num_workers=2
    )

    assert agent_field(out, "exit_reason") == ["finished"] * 5
    assert open_now["max"] == 2
    kinds = [kind for kind, _ in events]
    assert kinds.count("start") == 5 and kinds.count("close") == 5
    third_start = [i for i, k in enumerate(kinds) if k == "start"][2]
    assert "close" in kinds[:third_start]


async def test_warm_sets_up_sandboxes_ahead_of_the_agent_slots(
    tmp_path: Path, verl_model_dir: Path, qwen3_tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """concurrency 2 and warm 2 over 2 workers: a worker keeps 2 sandboxes open, 1 agent
    runs; the other sandbox is set up meanwhile and waits in phase `ready`."""
    from uniagent.env import AgentEnv
    from uniagent.interaction.agent import ReactAgent

    now = {"open": 0, "agents": 0}
    most = {"open": 0, "agents": 0}
    real_start, real_close, real_run = AgentEnv.start, AgentEnv.close, ReactAgent.run
    closed: set[int] = set()

    def count(key: str, step: int) -> None:
        now[key] += step
        most[key] = max(most[key], now[key])

    async def start(self: Any, *args: Any, **kwargs: Any) -> Any:
        count("open", 1)
        return await real_start(self, *args, **kwargs)

    async def close(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return await real_close(self, *args, **kwargs)
        finally:
            if id(self) not in closed:
                closed.add(id(self))
                count("open", -1)

    async def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        count("agents", 1)
        try:
            return await real_run(self, *args, **kwargs)
        finally:
            count("agents", -1)

    monkeypatch.setattr(AgentEnv, "start", start)
    monkeypatch.setattr(AgentEnv, "close", close)
    monkeypatch.setattr(ReactAgent, "run", run)

    out = await five_finishing_episodes(
        tmp_path, verl_model_dir, qwen3_tokenizer, {"concurrency": 2, "warm": 2}, num_workers=2
    )

    assert agent_field(out, "exit_reason") == ["finished"] * 5
    assert most == {"open": 2, "agents": 1}, most
    assert len(closed) == 5


async def test_v1_trainer_contract(
    tmp_path: Path, verl_model_dir: Path, qwen3_tokenizer: Any
) -> None:
    """verl 0.9.1's default trainer (use_v1) takes ``output.as_dict()`` unpadded, with
    ``uid``/``session_id``/``global_steps`` among run()'s kwargs and integer weight versions."""
    loop_yaml = write_loop_yaml(tmp_path, AGENT)
    tasks = [
        task("fin", "[script:finish]"),
        task("broken", "[script:finish]", tools_kwargs={"env": {"post_setup": ["false"]}}),
    ]
    batch = make_batch(tmp_path, qwen3_tokenizer, tasks)
    server = ScriptedTokenServer(str(verl_model_dir), SCRIPTS, global_steps=9)
    config = trainer_config(verl_model_dir, loop_yaml, response_length=512)
    worker = make_worker(config, server)  # loads the agent-loop YAML into verl's registry
    sampling = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": True}
    outputs = []
    for i in range(len(tasks)):
        loop = make_loop(worker, config, server)
        kwargs = {k: v[i] for k, v in batch.non_tensor_batch.items()}
        kwargs.update(uid=f"u{i}", session_id=0, global_steps=3)
        outputs.append((await loop.run(sampling, **kwargs)).as_dict())

    done, failed = outputs
    n = done["responses"].shape[0]
    assert done["response_mask"].shape == done["rollout_log_probs"].shape == (n,)
    assert done["rm_scores"][-1] == 1.0 and done["rm_scores"].sum() == 1.0
    assert extras_record(done["extra_fields"]["extras"])["exit_reason"] == "finished"
    assert (done["extra_fields"]["min_global_steps"], done["extra_fields"]["max_global_steps"]) == (
        9,
        9,
    )
    assert failed["responses"].shape == (1,) and failed["response_mask"].tolist() == [0]
    assert failed["rm_scores"].tolist() == [0.0]
    failed_record = extras_record(failed["extra_fields"]["extras"])
    assert failed_record is not None
    assert failed_record["exit_reason"] == "env_error"
    assert failed_record["traj_masked"] is True
    tags = [o["extra_fields"][k] for o in outputs for k in ("min_global_steps", "max_global_steps")]
    np.array(tags, dtype=int)  # what verl's v1 trainer does with them


async def test_sampling_extra_body_is_flattened_into_the_servers_sampling_params(
    tmp_path: Path, verl_model_dir: Path, qwen3_tokenizer: Any
) -> None:
    """The agent config's ``sampling.extra_body`` (and a row's override of it) reaches the
    server as top-level sampling params beside the named keys; verl's own keys win over
    both, and ``max_tokens`` is what remains of the budgets, at most the config's."""
    agent = {
        **AGENT,
        "sampling": {
            "max_tokens": 48,
            "min_p": 0.05,
            "seed": 7,
            "extra_body": {
                "skip_special_tokens": False,
                "min_p": 0.1,  # extra_body wins over the named key: passed on as it is
                "top_k": 3,  # verl sets top_k: verl wins
                "repetition_penalty": 1.7,  # verl sets it too (1.0)
            },
        },
    }
    loop_yaml = write_loop_yaml(tmp_path, agent)
    override = {"sampling": {"extra_body": {"ignore_eos": False, "skip_special_tokens": True}}}
    rows = [
        task("plain", "[script:finish]"),
        task("over", "[script:finish]", tools_kwargs=override),
    ]
    batch = make_batch(tmp_path, qwen3_tokenizer, rows)
    server = ScriptedTokenServer(str(verl_model_dir), SCRIPTS)
    overrides = {"actor_rollout_ref.rollout.top_k": 20}
    config = trainer_config(verl_model_dir, loop_yaml, overrides=overrides)
    out = await make_worker(config, server).generate_sequences(batch)
    assert agent_field(out, "exit_reason") == ["finished", "finished"]

    verl_keys = {"temperature", "top_p", "top_k", "repetition_penalty", "logprobs"}
    by_row: dict[str, list[dict[str, Any]]] = {}
    for call in server.calls:
        text = qwen3_tokenizer.decode(call.prompt_ids)
        row = "plain" if "Task plain" in text else "over"
        by_row.setdefault(row, []).append(call.sampling_params)
    assert {row: len(calls) for row, calls in by_row.items()} == {"plain": 2, "over": 2}
    for row, calls in by_row.items():
        for params in calls:
            assert "extra_body" not in params
            assert params["top_k"] == 20 and params["repetition_penalty"] == 1.0  # verl's
            assert params["logprobs"] is True
            assert params["min_p"] == 0.1 and params["seed"] == 7
            assert 0 < params["max_tokens"] <= 48
            extra = {k: v for k, v in params.items() if k not in verl_keys}
            expected = {"min_p", "seed", "max_tokens", "skip_special_tokens"}
            if row == "over":  # the row's extra_body is merged into the config's
                assert params["ignore_eos"] is False and params["skip_special_tokens"] is True
                expected.add("ignore_eos")
            else:
                assert params["skip_special_tokens"] is False
            assert set(extra) == expected
