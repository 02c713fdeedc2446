"""Harness episodes in verl batches: one sample per branch of the gateway's tree.

One batch through verl's real ``AgentLoopWorker`` (:class:`TreeAgentLoopWorker`, verl's
worker taking several outputs of one ``run``) mixes a built-in-loop episode, a
mini-swe-agent episode (the real pip harness in a bubblewrap sandbox, through a gateway
session whose backend is verl's server: ``VerlServerModel``) and two episodes of a scripted
harness that forks after its first reply (two branches sharing that reply), one with
``shared_weight: "1"`` and one with ``"1/k"``. Masks are checked against the server's own
record of what it generated, not against the tree.
"""

from __future__ import annotations

import types
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from verl_helpers import (
    AGENT,
    SCRIPTS,
    agent_field,
    make_batch,
    make_loop,
    task,
    trainer_config,
    unpad,
)

from uniagent import hookimpl
from uniagent.plugins import load_plugins, reset_plugins
from uniagent.testing.harness import HARNESS, tiny_spec
from uniagent.testing.scripted import hermes_call
from uniagent.verl.testing import ScriptedTokenServer

LOOP = "uniagent.verl.agent_loop.UniAgentLoop"
#: No private tmpfs per sandbox (``limits.disk: null``): a bubblewrap sandbox starting
#: while another episode of the batch unmounts its own can fail to start.
NO_TMPFS = {"limits": {"disk": None}}
HARNESS_ENV = {"deployment": {"type": "host", "isolation": "bwrap", "network": True, **NO_TMPFS}}
WRITE = hermes_call("bash", {"command": "echo hello > out.txt"})
TINY_PROMPT = "Write hello into out.txt."  # what the tiny harness always asks
MINI = [
    hermes_call("bash", {"command": "echo hello > out.txt && cat out.txt"}, "Writing it."),
    hermes_call("bash", {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"}),
]
BUILT_IN = {**AGENT, "env": {"deployment": {**AGENT["env"]["deployment"], **NO_TMPFS}}}
SERVER_SCRIPTS = {**SCRIPTS, "[script:mini]": MINI, TINY_PROMPT: [WRITE, "Done."]}


@pytest.fixture
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The scripted harness ``tiny`` as an agent plugin (besides the installed ones)."""
    script = tmp_path_factory.mktemp("harness") / "tiny.py"
    script.write_text(HARNESS)
    spec = tiny_spec(script)
    reset_plugins()

    @hookimpl
    def uniagent_agents() -> list[Any]:
        return [spec]

    load_plugins().register(types.SimpleNamespace(uniagent_agents=uniagent_agents), "test-agents")
    yield
    reset_plugins()


def harness_entry(name: str, agent: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "_target_": LOOP,
        "agent": agent,
        "tool_parser": "hermes",
        "env": HARNESS_ENV,
        "reward": {"name": "command", "settings": {"timeout": 30}},
        **extra,
    }


def loop_yaml(folder: Path) -> Path:
    """Four agent-loop entries: the built-in loop, mini-swe-agent, tiny forking twice."""
    (folder / "agent.yaml").write_text(yaml.safe_dump(BUILT_IN))
    fork = {"name": "tiny", "settings": {"restarts": 1, "fork": True}}
    entries = [
        {"name": "uniagent", "_target_": LOOP, "agent_config": "agent.yaml"},
        harness_entry("mini", {"name": "mini-swe-agent", "settings": {"step_limit": 5}}),
        harness_entry("tiny", fork),
        harness_entry("tiny-k", fork, shared_weight="1/k"),
    ]
    path = folder / "agent_loop.yaml"
    path.write_text(yaml.safe_dump(entries, sort_keys=False))
    return path


def hello(task_id: str, statement: str) -> dict[str, Any]:
    return {
        "instance_id": task_id,
        "problem_statement": statement,
        "test_command": "grep -qx hello out.txt",
    }


def generated(prompt: list[int], response: list[int], calls: Sequence[Any]) -> tuple[list, list]:
    """Mask and log-probs over ``response`` of what the server generated on this sequence:
    every call whose prompt is a prefix of it and whose output follows that prefix."""
    full = prompt + response
    mask, logprobs = [0] * len(full), [0.0] * len(full)
    for call in calls:
        start, end = len(call.prompt_ids), len(call.prompt_ids) + len(call.token_ids)
        if full[:start] == call.prompt_ids and full[start:end] == call.token_ids:
            mask[start:end] = [1] * len(call.token_ids)
            logprobs[start:end] = call.log_probs
    return mask[len(prompt) :], logprobs[len(prompt) :]


async def test_a_batch_of_harness_and_built_in_episodes_gives_one_sample_per_branch(
    tiny: None, tmp_path: Path, verl_model_dir: Path, qwen3_tokenizer: Any
) -> None:
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    from uniagent.verl.worker import TreeAgentLoopWorker

    config = trainer_config(
        verl_model_dir, loop_yaml(tmp_path), prompt_length=4096, response_length=1024
    )
    tasks = [
        task("fin", "[script:finish]"),
        hello("mini", "[script:mini] Put the word hello into out.txt, then submit."),
        hello("tiny", "Any task: tiny asks its own."),
        hello("tiny-k", "Any task, tiny asks its own."),
    ]
    batch = make_batch(
        tmp_path, qwen3_tokenizer, tasks, agent_names={"mini": "mini", "tiny": "tiny",
                                                       "tiny-k": "tiny-k"},
    )  # fmt: skip
    uids = ["u-fin", "u-mini", "u-tiny", "u-tiny-k"]
    batch.non_tensor_batch["uid"] = np.array(uids, dtype=object)
    server = ScriptedTokenServer(str(verl_model_dir), SERVER_SCRIPTS, global_steps=4)
    out = await TreeAgentLoopWorker(config, llm_client=server).generate_sequences(batch)

    # One row per sample, each with its dataset row's uid: the episode's GRPO group.
    assert len(out) == 6
    assert list(out.non_tensor_batch["uid"]) == [uids[i] for i in (0, 1, 2, 2, 3, 3)]
    assert list(out.non_tensor_batch["agent_name"]) == [
        "uniagent", "mini", "tiny", "tiny", "tiny-k", "tiny-k"
    ]  # fmt: skip
    assert agent_field(out, "exit_reason") == ["finished"] * 6, agent_field(out, "error")
    assert agent_field(out, "traj_masked") == [False] * 6
    assert list(zip(agent_field(out, "branch"), agent_field(out, "branches"), strict=True)) == [
        (0, 1), (0, 1), (0, 2), (1, 2), (0, 2), (1, 2)
    ]  # fmt: skip

    rows = [unpad(out, i) for i in range(len(out))]
    for i, (prompt, response, mask, logprobs, scores) in enumerate(rows):
        # The episode's reward on every sample, at its last token, and nothing else.
        assert scores[len(response) - 1] == 1.0 and sum(scores) == 1.0, i
        want_mask, want_logprobs = generated(prompt, response, server.calls)
        assert logprobs == pytest.approx(want_logprobs), i  # 0.0 on what it did not generate
        if i != 4:  # (row 4 is the "1/k" sample: below)
            assert mask == want_mask, i  # exactly the generated tokens
    # mini-swe-agent's two replies and the built-in loop's are where the server put them.
    eot = qwen3_tokenizer.convert_tokens_to_ids("<|im_end|>")

    def ids(text: str) -> list[int]:
        return [*qwen3_tokenizer.encode(text, add_special_tokens=False), eot]

    mini_ids = [i for text in MINI for i in ids(text)]
    assert [t for t, m in zip(rows[1][1], rows[1][2], strict=True) if m] == mini_ids

    # The tiny episodes: two branches sharing the first reply; the fork (served last) last.
    write_ids, done_ids = ids(WRITE), ids("Done.")
    for first, last in ((rows[2], rows[3]), (rows[4], rows[5])):
        assert first[0] == last[0]  # the same prompt: the tiny harness's first request
        assert "(fork 1)" not in qwen3_tokenizer.decode(first[1])
        assert "(fork 1)" in qwen3_tokenizer.decode(last[1])
        assert first[1][: len(write_ids)] == last[1][: len(write_ids)] == write_ids
    gen = [[t for t, m in zip(r[1], r[2], strict=True) if m] for r in rows[2:]]
    assert gen[0] == gen[1] == gen[3] == write_ids + done_ids  # "1": trained in both samples
    # "1/k": a token shared by both samples is trained once, in the last one (weight 1/2
    # in each); the first keeps its own reply only.
    assert gen[2] == done_ids
    assert rows[4][2] == [0] * len(write_ids) + rows[2][2][len(write_ids) :]
    assert rows[5][2] == rows[3][2]

    # verl's classic worker takes one output per row: there the last-served branch only.
    (tmp_path / "alone").mkdir()
    (tmp_path / "alone" / "agent.yaml").write_text(yaml.safe_dump(BUILT_IN))
    alone = make_batch(
        tmp_path / "alone", qwen3_tokenizer, tasks[2:3], agent_names={"tiny": "tiny"}
    )
    one = await AgentLoopWorker(config, llm_client=server).generate_sequences(alone)
    assert len(one) == 1 and agent_field(one, "branches") == [1]
    assert unpad(one, 0)[1] == rows[3][1] and unpad(one, 0)[2] == rows[3][2]


async def test_v1_workers_get_a_list_of_outputs_from_one_run(
    tiny: None, tmp_path: Path, verl_model_dir: Path, qwen3_tokenizer: Any
) -> None:
    """verl's v1 worker calls ``run`` with the rollout's ``session_id`` and stores output i
    as ``{uid}_{session_id}_{i}``: a branching episode gives it one output per branch."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    config = trainer_config(verl_model_dir, loop_yaml(tmp_path), response_length=1024)
    batch = make_batch(
        tmp_path, qwen3_tokenizer, [hello("tiny", "Any.")], agent_names={"tiny": "tiny-k"}
    )
    server = ScriptedTokenServer(str(verl_model_dir), SERVER_SCRIPTS)
    worker = AgentLoopWorker(config, llm_client=server)  # loads the agent-loop YAML
    loop = make_loop(worker, config, server, "tiny-k")
    kwargs = {k: v[0] for k, v in batch.non_tensor_batch.items() if k != "agent_name"}
    kwargs.update(uid="u0", session_id=0, global_steps=1)
    sampling = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": True}
    outputs = await loop.run(sampling, **kwargs)
    assert isinstance(outputs, list) and len(outputs) == 2
    rows = [o.as_dict() for o in outputs]
    assert [float(r["rm_scores"].sum()) for r in rows] == [1.0, 1.0]
    assert [r["rm_scores"][-1].item() for r in rows] == [1.0, 1.0]
    assert all(o.extra_fields["reward_extra_info"] == {"acc": 1.0} for o in outputs)
    assert "(fork 1)" in qwen3_tokenizer.decode(outputs[-1].response_ids)
    write = len(qwen3_tokenizer.encode(WRITE, add_special_tokens=False)) + 1
    assert outputs[0].response_mask[:write] == [0] * write  # "1/k": trained in the last
    assert outputs[1].response_mask[:write] == [1] * write
