"""UniAgentLoop inside verl 0.9.1's real AgentLoopWorker, on the CPU, with real sandboxes.

The batch comes from the real data path: ``uniagent data prepare`` → Parquet → verl's
``RLHFDataset`` → ``collate_fn`` → ``DataProto``. The loop is registered through the
agent-loop YAML exactly as a user does it. A scripted token server plays the model.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from verl_helpers import trainer_config, write_loop_yaml

from uniagent.verl.output import EXTRA_FIELD_KEYS
from uniagent.verl.testing import ScriptedTokenServer, hermes_call

AGENT = {
    "tool_parser": "hermes",
    "tools": ["execute_bash", "finish"],
    "system_prompt": "You are a test agent in a sandbox. Use the tools.",
    "instance_template": "{problem_statement}",
    "interaction": {"max_turns": 3, "action_timeout": 30, "max_format_errors": 2},
    "env": {"deployment": {"type": "host"}},
    "reward": {"name": "command", "config": {"timeout": 30}},
    "concurrency": 8,
}

SCRIPTS = {
    "[script:finish]": [
        hermes_call("execute_bash", {"command": "echo done > marker.txt"}),
        hermes_call("finish", {"answer": "done"}),
    ],
    "[script:loop]": [hermes_call("execute_bash", {"command": "echo again"})],
    "[script:garbage]": ["I would rather not call any tool."],
    "[script:long]": [hermes_call("execute_bash", {"command": "seq 1 3000"})],
}


def task(task_id: str, script: str, **extra: Any) -> dict[str, Any]:
    """A task whose problem statement selects the server's script."""
    return {
        "instance_id": task_id,
        "problem_statement": f"{script} Task {task_id}: create marker.txt, then finish.",
        "test_command": "test -f marker.txt",
        **extra,
    }


def make_batch(tmp_path: Path, tokenizer: Any, tasks: Sequence[Mapping[str, Any]]) -> Any:
    """Tasks → ``uniagent data prepare`` → RLHFDataset → collate_fn → DataProto."""
    from omegaconf import OmegaConf
    from verl.protocol import DataProto
    from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn

    from uniagent.cli import main

    tasks_file = tmp_path / "tasks.jsonl"
    tasks_file.write_text("".join(json.dumps(t) + "\n" for t in tasks))
    out = tmp_path / "train.parquet"
    code = main(
        [
            "data",
            "prepare",
            str(tasks_file),
            "--out",
            str(out),
            "--config",
            str(tmp_path / "agent.yaml"),
            "--data-source",
            "unit",
        ]
    )
    assert code == 0
    dataset = RLHFDataset(
        str(out),
        tokenizer,
        OmegaConf.create(
            {
                "max_prompt_length": 2048,
                "filter_overlong_prompts": False,
                "cache_dir": str(tmp_path / "verl-cache"),
            }
        ),
    )
    return DataProto.from_single_dict(collate_fn([dataset[i] for i in range(len(dataset))]))


def make_worker(config: Any, server: ScriptedTokenServer) -> Any:
    """verl's real AgentLoopWorker, in this process."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    return AgentLoopWorker(config, llm_client=server)


def unpad(out: Any, i: int) -> tuple[list[int], list[int], list[int], list[float], list[float]]:
    """Sample ``i`` without padding: prompt, response, mask, log-probs, rm_scores."""
    prompt_len = out.batch["prompts"].shape[1]
    attention = out.batch["attention_mask"][i]
    prompt = out.batch["prompts"][i][attention[:prompt_len].bool()].tolist()
    n = int(attention[prompt_len:].sum())
    return (
        prompt,
        out.batch["responses"][i][:n].tolist(),
        out.batch["response_mask"][i][:n].tolist(),
        out.batch["rollout_log_probs"][i][:n].tolist(),
        out.batch["rm_scores"][i].tolist(),
    )


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

    assert field(out, "exit_reason") == [
        "finished",
        "max_step_limit",
        "format_error",
        "env_error",
        "unknown_error",
    ]
    assert field(out, "traj_masked") == [False, False, False, True, True]
    rewards = [1.0, 0.0, 0.0, 0.0, 0.0]

    turns = {0: 2, 1: 3, 2: 2}  # model calls per trained episode
    for i in (0, 1, 2):
        calls = check_token_exact(out, i, server, qwen3_tokenizer)
        assert len(calls) == turns[i]
        _, response, mask, _, scores = unpad(out, i)
        assert sum(mask) > 0
        assert scores[len(response) - 1] == rewards[i]
        assert sum(scores) == rewards[i]
    assert field(out, "agent_tool_calls")[0] == {"execute_bash": 1, "finish": 1}
    assert field(out, "agent_format_errors")[2] == 2
    assert field(out, "agent_turns")[1] == 3
    assert all(field(out, "agent_setup_seconds")[i] > 0 for i in (0, 1, 2, 3))

    for i in (3, 4):  # masked placeholders: one token, mask 0, log-prob 0.0, reward 0.0
        prompt, response, mask, logprobs, scores = unpad(out, i)
        assert len(response) == 1 and mask == [0] and logprobs == [0.0]
        assert scores == [0.0] * response_length
        assert not any(c.prompt_ids == prompt for c in server.calls)
    assert "setup command 'false'" in field(out, "agent_error")[3]
    assert "max_turns" in field(out, "agent_error")[4]

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
    assert field(out, "agent_truncated") == [True, False]
    assert field(out, "exit_reason")[0] == "token_limit"
    assert field(out, "traj_masked") == [False, False]
    calls = check_token_exact(out, 0, server, qwen3_tokenizer)
    assert len(calls) == 1 and sum(mask) == len(calls[0].token_ids)
    assert scores[255] == 0.0 and sum(scores) == 0.0
    check_token_exact(out, 1, server, qwen3_tokenizer)
    assert unpad(out, 1)[4][len(unpad(out, 1)[1]) - 1] == 1.0
    assert torch.equal(out.batch["input_ids"][0, 2048:], out.batch["responses"][0])


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

    loop_yaml = write_loop_yaml(tmp_path, {**AGENT, "concurrency": 4})
    tasks = [task(f"t{i}", "[script:finish]") for i in range(5)]
    batch = make_batch(tmp_path, qwen3_tokenizer, tasks)
    server = ScriptedTokenServer(str(verl_model_dir), SCRIPTS)
    config = trainer_config(verl_model_dir, loop_yaml, num_workers=2)
    out = await make_worker(config, server).generate_sequences(batch)

    assert field(out, "exit_reason") == ["finished"] * 5
    assert open_now["max"] == 2
    kinds = [kind for kind, _ in events]
    assert kinds.count("start") == 5 and kinds.count("close") == 5
    third_start = [i for i, k in enumerate(kinds) if k == "start"][2]
    assert "close" in kinds[:third_start]


async def test_v1_trainer_contract(
    tmp_path: Path, verl_model_dir: Path, qwen3_tokenizer: Any
) -> None:
    """verl 0.9.1's default trainer (use_v1) takes ``output.as_dict()`` unpadded, with
    ``uid``/``session_id``/``global_steps`` among run()'s kwargs and integer weight versions."""
    import hydra
    from verl.experimental.agent_loop.agent_loop import (
        DictConfigWrap,
        ToolListWrap,
        _agent_loop_registry,
    )

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
        loop = hydra.utils.instantiate(
            _agent_loop_registry["uniagent"],
            trainer_config=DictConfigWrap(config=config),
            server_manager=server,
            tokenizer=worker.tokenizer,
            processor=worker.processor,
            hf_model_type=worker.hf_model_type,
            dataset_cls=worker.dataset_cls,
            data_config=DictConfigWrap(config.data),
            tools=ToolListWrap(worker.tools),
        )
        kwargs = {k: v[i] for k, v in batch.non_tensor_batch.items()}
        kwargs.update(uid=f"u{i}", session_id=0, global_steps=3)
        outputs.append((await loop.run(sampling, **kwargs)).as_dict())

    done, failed = outputs
    n = done["responses"].shape[0]
    assert done["response_mask"].shape == done["rollout_log_probs"].shape == (n,)
    assert done["rm_scores"][-1] == 1.0 and done["rm_scores"].sum() == 1.0
    assert done["extra_fields"]["exit_reason"] == "finished"
    assert (done["extra_fields"]["min_global_steps"], done["extra_fields"]["max_global_steps"]) == (
        9,
        9,
    )
    assert failed["responses"].shape == (1,) and failed["response_mask"].tolist() == [0]
    assert failed["rm_scores"].tolist() == [0.0]
    assert failed["extra_fields"]["exit_reason"] == "env_error"
    assert failed["extra_fields"]["traj_masked"] is True
    tags = [o["extra_fields"][k] for o in outputs for k in ("min_global_steps", "max_global_steps")]
    np.array(tags, dtype=int)  # what verl's v1 trainer does with them


@pytest.mark.slow
def test_through_ray_agent_loop_manager(
    tmp_path: Path, verl_model_dir: Path, qwen3_tokenizer: Any
) -> None:
    """Once through Ray: verl's AgentLoopManager with two remote AgentLoopWorkers."""
    import ray
    from verl.experimental.agent_loop.agent_loop import AgentLoopManager

    loop_yaml = write_loop_yaml(tmp_path, AGENT)
    tasks = [task("fin", "[script:finish]"), task("loop", "[script:loop]")]
    batch = make_batch(tmp_path, qwen3_tokenizer, tasks)
    server = ScriptedTokenServer(str(verl_model_dir), SCRIPTS)
    config = trainer_config(verl_model_dir, loop_yaml, num_workers=2)
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        manager = AgentLoopManager.create(config, llm_client=server)
        out = manager.generate_sequences(batch)
    finally:
        ray.shutdown()
    assert field(out, "exit_reason") == ["finished", "max_step_limit"]
    assert field(out, "traj_masked") == [False, False]
    scores = out.batch["rm_scores"]
    assert scores.sum(dim=1).tolist() == [1.0, 0.0]
    mask = out.batch["response_mask"]
    assert (mask.sum(dim=1) > 0).all()
    assert np.isfinite(out.batch["rollout_log_probs"].numpy()).all()
    assert "agent_loop/tool_calls/mean" in out.meta_info["timing"]
