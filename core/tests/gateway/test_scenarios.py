"""Scripted harnesses whose history is not append-only: compaction, dropped thinking, a
retried turn, a subagent. Each gives the documented branches; no generated token is lost
and every sample's mask marks exactly the generated tokens (conftest.check_tree)."""

from __future__ import annotations

from typing import Any

import openai
import pytest
from conftest import TOOLS, check_tree

from uniagent.gateway import TrajectoryTree
from uniagent.models.base import ModelError
from uniagent.testing.scripted import hermes_call

SYSTEM = "You are a careful agent."


def call(step: int) -> str:
    return f"<think>\nstep {step}\n</think>\n\n" + hermes_call("bash", {"cmd": f"echo {step}"})


class Harness:
    """An OpenAI-chat harness that keeps its own message list."""

    def __init__(self, base: str, system: str = SYSTEM, task: str = "Do the task.") -> None:
        self.client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
        self.messages: list[dict[str, Any]] = [
            {"role": "system", "content": system},
            {"role": "user", "content": task},
        ]

    def turn(self, *, keep_thinking: bool = True, output: str = "ok") -> Any:
        r = self.client.chat.completions.create(model="m", messages=self.messages, tools=TOOLS)  # type: ignore[arg-type]
        msg = r.choices[0].message
        reply: dict[str, Any] = {"role": "assistant", "content": msg.content or ""}
        if keep_thinking and (msg.model_extra or {}).get("reasoning_content"):
            reply["reasoning_content"] = msg.model_extra["reasoning_content"]  # type: ignore[index]
        if msg.tool_calls:
            reply["tool_calls"] = [c.model_dump() for c in msg.tool_calls]
        self.messages.append(reply)
        for c in msg.tool_calls or ():
            self.messages.append({"role": "tool", "tool_call_id": c.id, "content": output})
        return msg


def shape(tree: TrajectoryTree) -> list[tuple[int, list[int]]]:
    """(node id, child ids) for every node with more than one child: the branch points."""
    return [(n.id, [c.id for c in n.children]) for n in tree.nodes() if len(n.children) > 1]


def test_a_linear_episode_is_one_branch_and_one_sample(served, backend) -> None:
    backend.script.extend([call(1), call(2), "Done."])
    session = served.gateway.open_session()
    h = Harness(served.base_url(session))
    for _ in range(3):
        h.turn()
    tree = session.tree
    assert [t.source for t in tree.turns] == ["render", "extension", "extension"]
    assert len(tree.leaves()) == 1 and shape(tree) == []
    check_tree(tree, backend)
    (sample,) = tree.samples()
    assert sample.prompt_ids == backend.calls[0].prompt_ids
    assert sum(sample.response_mask) == sum(len(c.token_ids) for c in backend.calls)
    assert set(sample.response_weights) == {1.0}
    again = TrajectoryTree.from_dict(tree.to_dict())
    assert again.to_dict() == tree.to_dict()


def test_compaction_branches_after_the_shared_system_prompt(served, backend) -> None:
    backend.script.extend([call(1), call(2), call(3), "Done."])
    session = served.gateway.open_session()
    h = Harness(served.base_url(session))
    h.turn(), h.turn()
    # The harness compacts: the history becomes a summary, then work continues.
    h.messages = [h.messages[0], {"role": "user", "content": "Summary: ran echo 1 and 2. Go on."}]
    h.turn(), h.turn()
    tree = session.tree
    assert [t.source for t in tree.turns] == ["render", "extension", "render", "extension"]
    assert len(tree.leaves()) == 2
    (point,) = tree.root.children  # one shared trunk: the system prompt with the tools
    trunk = point.ids
    assert all(m == 0 for m in point.mask)
    text = backend.tokenizer.decode(trunk)
    assert text.startswith("<|im_start|>system\nYou are a careful agent.") and "bash" in text
    assert "<|im_start|>user\n" in text and "Do the task" not in text and "Summary" not in text
    check_tree(tree, backend)
    session.check_exactness()
    assert all(t.exact for t in tree.turns)
    shared = tree.samples(shared_weight="1/k")
    assert [w for w in shared[0].response_weights] == [1.0] * len(shared[0].response_ids)
    assert all(s.prompt_ids[: len(trunk)] == trunk for s in shared)


def test_dropped_thinking_branches_where_the_first_generation_began(served, backend) -> None:
    backend.script.extend([call(1), call(2), "Done."])
    session = served.gateway.open_session()
    h = Harness(served.base_url(session))
    h.turn(keep_thinking=False)  # the harness sends the reply back without its reasoning
    h.turn(keep_thinking=False)
    h.turn()
    tree = session.tree
    assert [t.source for t in tree.turns] == ["render", "render", "render"]
    first = tree.turns[0].prompt_len
    points = [n for n in tree.nodes() if len(n.children) > 1]
    assert points and points[0].path()[0] is points[0]
    assert len(points[0].ids) == first  # branch exactly at the end of the first prompt
    assert len(tree.leaves()) == 3
    check_tree(tree, backend)


def test_a_retried_request_after_a_backend_error_does_not_branch(served, backend) -> None:
    backend.script.extend([call(1), ModelError("server overloaded"), call(2), "Done."])
    session = served.gateway.open_session()
    h = Harness(served.base_url(session))
    h.turn()
    with pytest.raises(openai.InternalServerError, match="server overloaded"):
        h.turn()
    assert len(session.tree.turns) == 1  # nothing recorded for the failed request
    h.turn(), h.turn()
    tree = session.tree
    assert len(tree.leaves()) == 1 and [t.source for t in tree.turns][1:] == ["extension"] * 2
    check_tree(tree, backend)


async def test_an_undelivered_stream_is_noted_and_not_recorded(tokenizer, backend) -> None:
    from uniagent.gateway import Gateway
    from uniagent.gateway.server import _delivered
    from uniagent.gateway.wire import openai_chat

    backend.script.extend([call(1), call(1)])
    session = Gateway(backend).open_session()
    body = {"messages": [{"role": "user", "content": "go"}], "tools": TOOLS}
    completion = await session.complete(openai_chat.parse(body))
    events = _delivered(openai_chat.stream(completion, "m", body), completion, session)
    await events.__anext__()
    await events.aclose()  # what sse-starlette does when the client goes away
    assert session.undelivered == [{"wire": "chat", "generated": len(backend.calls[0].token_ids)}]
    assert list(session.tree.nodes()) == []
    retry = await session.complete(openai_chat.parse(body))  # nothing to branch from
    assert retry.turn.source == "render"


def test_a_parallel_fork_shares_its_trunk_and_weighs_it_1_over_k(served, backend) -> None:
    backend.script.extend([call(1), "First.", "Second."])
    session = served.gateway.open_session()
    h = Harness(served.base_url(session))
    h.turn()
    fork = Harness(served.base_url(session))
    fork.messages = list(h.messages)
    h.turn(), fork.turn()
    tree = session.tree
    assert [t.source for t in tree.turns] == ["render", "extension", "identical"]
    assert len(tree.leaves()) == 2
    check_tree(tree, backend)
    plain, weighted = tree.samples(), tree.samples(shared_weight="1/k")
    gen1 = len(backend.calls[0].token_ids)
    for a, b in zip(plain, weighted, strict=True):
        assert a.response_ids == b.response_ids and set(a.response_weights) == {1.0}
        assert b.response_weights[:gen1] == [0.5] * gen1  # the shared first generation
        assert b.response_weights[-1] == 1.0  # each branch's own reply


def test_a_subagent_branches_and_the_main_agent_extends_its_own_path(served, backend) -> None:
    backend.script.extend([call(1), call(10), "Sub done.", "Main done."])
    session = served.gateway.open_session()
    main = Harness(served.base_url(session))
    main.turn(output="placeholder")
    sub = Harness(served.base_url(session), system="You are a subagent.", task="Look around.")
    sub.turn(), sub.turn()
    main.messages[-1]["content"] = "Sub done."
    main.turn()
    tree = session.tree
    assert [t.source for t in tree.turns] == ["render", "render", "extension", "extension"]
    assert len(tree.leaves()) == 2
    (trunk,) = tree.root.children
    assert backend.tokenizer.decode(trunk.ids) == "<|im_start|>system\nYou are a"
    check_tree(tree, backend)
    session.check_exactness()
    assert all(t.exact for t in tree.turns)
    shared = tree.samples(shared_weight="1/k")
    assert all(w == 1.0 for s in shared for w in s.response_weights)  # the trunk is prompt


def test_a_session_flooding_the_model_gets_429_and_no_backend_failure(tokenizer) -> None:
    """A harness (or the policy through its shell) with more requests waiting than the
    session allows is answered 429 (its own doing), never a backend failure (which would
    mask its episode as infrastructure); once one is answered, a new one is taken."""
    import threading

    from uniagent.gateway import Gateway, ScriptedBackend
    from uniagent.gateway.server import start
    from uniagent.gateway.session import MAX_IN_FLIGHT

    class Gated(ScriptedBackend):
        """Holds every generation until the gate opens; counts the ones waiting."""

        def __init__(self) -> None:
            super().__init__(tokenizer, default="Done.")
            self.gate = threading.Event()
            self.waiting = threading.Semaphore(0)

        async def generate(self, prompt_ids: list[int], **kwargs: Any) -> Any:
            import asyncio

            self.waiting.release()
            await asyncio.to_thread(self.gate.wait)
            return await super().generate(prompt_ids, **kwargs)

    backend = Gated()
    with start(Gateway(backend)) as served:
        session = served.gateway.open_session()
        answers: list[str] = []
        held = [
            threading.Thread(
                target=lambda: answers.append(Harness(served.base_url(session)).turn().content)
            )
            for _ in range(MAX_IN_FLIGHT)
        ]
        for thread in held:
            thread.start()
        for _ in held:  # every held request is waiting for the model
            assert backend.waiting.acquire(timeout=60)
        with pytest.raises(openai.RateLimitError, match="at most 4 at once"):
            Harness(served.base_url(session)).turn()
        backend.gate.set()
        for thread in held:
            thread.join(timeout=60)
        assert answers == ["Done."] * MAX_IN_FLIGHT
        assert Harness(served.base_url(session)).turn().content == "Done."
        state = session.state()
        assert state["refused_in_flight"] == 1 and state["backend_errors"] == []
