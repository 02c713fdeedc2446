"""Fixtures for the gateway's tests: the real Qwen3 tokenizer and a served gateway."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from uniagent.gateway import Gateway, ScriptedBackend, Session, TrajectoryTree
from uniagent.gateway.server import RunningGateway, start
from uniagent.testing import load_qwen3_tokenizer

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command.",
            "parameters": {
                "type": "object",
                "properties": {"cmd": {"type": "string"}},
                "required": ["cmd"],
            },
        },
    }
]


@pytest.fixture(scope="session")
def tokenizer() -> Any:
    return load_qwen3_tokenizer()


@pytest.fixture
def backend(tokenizer: Any) -> ScriptedBackend:
    return ScriptedBackend(tokenizer)


@pytest.fixture
def served(backend: ScriptedBackend) -> Iterator[RunningGateway]:
    with start(Gateway(backend)) as running:
        yield running


def check_tree(tree: TrajectoryTree, backend: ScriptedBackend) -> None:
    """No generated token lost; each sample's mask marks exactly its path's generations."""
    assert len(tree.turns) == len(backend.calls)
    generated = {id(t): c.token_ids for t, c in zip(tree.turns, backend.calls, strict=True)}
    logprobs = {id(t): c.logprobs for t, c in zip(tree.turns, backend.calls, strict=True)}
    for turn, call in zip(tree.turns, backend.calls, strict=True):
        ids, mask, lps = tree.context(tree.end_of(turn))
        n = len(call.token_ids)
        assert ids[-n:] == call.token_ids and mask[-n:] == [1] * n and lps[-n:] == call.logprobs
        assert ids[: turn.prompt_len] == call.prompt_ids and len(ids) == turn.prompt_len + n
    samples = tree.samples()
    assert len(samples) == len(tree.leaves())
    for sample, leaf in zip(samples, tree.leaves(), strict=True):
        turns = [t for node in leaf.path() for t in node.turns]
        want = [i for t in turns for i in generated[id(t)]]
        want_lp = [x for t in turns for x in logprobs[id(t)]]
        got = [i for i, m in zip(sample.response_ids, sample.response_mask, strict=True) if m]
        got_lp = [
            x for x, m in zip(sample.response_logprobs, sample.response_mask, strict=True) if m
        ]
        assert got == want and got_lp == want_lp
        assert sample.response_mask[0] == 1 and set(sample.response_mask) <= {0, 1}
        assert sample.prompt_ids == tree.context(leaf)[0][: len(sample.prompt_ids)]


def open_session(served: RunningGateway) -> Session:
    return served.gateway.open_session()
