"""Gateway overhead per request, beside calling the token backend directly.

    python bench/gateway.py [--turns 30] [--tokens 32000] [--repeats 3]

One session of ``--turns`` chat-completions turns whose context grows to about
``--tokens`` tokens (a tool output per turn, the real Qwen3 tokenizer, a scripted
backend). For every request the time spent inside the backend is measured, so the
gateway's overhead is the rest of the request: in process (wire parse, prompt build,
parse of the output, tree insert, wire response) and over HTTP on 127.0.0.1 (a
keep-alive connection, request bodies prepared before timing). Prints medians and
ratios, and the memory one finished session holds (tracemalloc). Needs
``uniagent[gateway,tokenizers]``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import http.client
import statistics
import time
import tracemalloc
from collections.abc import Sequence
from typing import Any

import orjson

from uniagent.gateway import Gateway, ScriptedBackend
from uniagent.gateway.backend import Generation
from uniagent.gateway.server import start
from uniagent.gateway.wire import openai_chat
from uniagent.testing import load_qwen3_tokenizer
from uniagent.testing.scripted import hermes_call

TOOLS = [{"type": "function", "function": {
    "name": "bash", "description": "Run a shell command.",
    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}}]  # fmt: skip


class Timed:
    """A backend wrapper that adds up the seconds spent inside ``generate``."""

    def __init__(self, inner: ScriptedBackend) -> None:
        self.inner, self.tokenizer, self.spent = inner, inner.tokenizer, 0.0

    async def generate(
        self, prompt_ids: list[int], *, max_tokens: int | None, stop: Sequence[str] = ()
    ) -> Generation:
        t0 = time.perf_counter()
        try:
            return await self.inner.generate(prompt_ids, max_tokens=max_tokens, stop=stop)
        finally:
            self.spent += time.perf_counter() - t0


def conversation(turns: int, tokens: int, tokenizer: Any) -> tuple[list[str], list[str]]:
    """Reply texts and tool outputs sized so the session reaches about ``tokens`` tokens."""
    replies = [hermes_call("bash", {"cmd": f"cat part{i}.txt"}, f"Reading part {i}.")
               for i in range(turns - 1)] + ["All parts read."]  # fmt: skip
    words = " ".join(f"line{i} of the file says value {i * 7 % 101}" for i in range(4000))
    per_turn = tokens // turns
    ids = tokenizer.encode(words, add_special_tokens=False)
    outputs = [tokenizer.decode(ids[i * 11 : i * 11 + per_turn]) for i in range(turns)]
    return replies, outputs


def requests(
    replies: list[str], outputs: list[str], backend: ScriptedBackend
) -> list[dict[str, Any]]:
    """The request bodies a harness sends, built by running the session once (ids included)."""
    gateway = Gateway(backend)
    session = gateway.open_session("bench")
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You read files."},
                                      {"role": "user", "content": "Read every part."}]  # fmt: skip
    bodies = []
    backend.script.extend(replies)

    async def run() -> None:
        for output in outputs:
            body = {"model": "m", "messages": [dict(m) for m in messages], "tools": TOOLS}
            bodies.append(body)
            c = await session.complete(openai_chat.parse(body))
            c.commit()
            reply = openai_chat.response(c, "m")["choices"][0]["message"]
            messages.append(reply)
            for call in reply.get("tool_calls") or ():
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": output})

    asyncio.run(run())
    return bodies


class Tokenizing:
    """Adds up the seconds the gateway spends tokenizing rendered text (its ``encode``)."""

    def __init__(self) -> None:
        import uniagent.gateway.session as module

        self.module, self.inner, self.spent = module, module.encode, 0.0

    def __call__(self, tokenizer: Any, text: str) -> list[int]:
        t0 = time.perf_counter()
        try:
            return self.inner(tokenizer, text)
        finally:
            self.spent += time.perf_counter() - t0

    def __enter__(self) -> Tokenizing:
        self.module.encode = self  # type: ignore[assignment]
        return self

    def __exit__(self, *exc: object) -> None:
        self.module.encode = self.inner


def in_process(
    bodies: list[dict[str, Any]], replies: list[str], tokenizer: Any
) -> tuple[list[float], list[float], list[float], int]:
    """(overhead, backend time, tokenizing time) per request in process, and the tree's tokens."""
    timed = Timed(ScriptedBackend(tokenizer, replies))
    session = Gateway(timed).open_session("bench")  # type: ignore[arg-type]
    raw = [orjson.dumps(b) for b in bodies]
    overhead, inside, tokenizing = [], [], []

    async def run() -> None:
        with Tokenizing() as tok:
            for data in raw:
                before, encoded, t0 = timed.spent, tok.spent, time.perf_counter()
                c = await session.complete(openai_chat.parse(orjson.loads(data)))
                c.commit()
                orjson.dumps(openai_chat.response(c, "m"))
                total = time.perf_counter() - t0
                inside.append(timed.spent - before)
                tokenizing.append(tok.spent - encoded)
                overhead.append(total - inside[-1])

    asyncio.run(run())
    return overhead, inside, tokenizing, session.state()["tokens"]


def direct(
    bodies: list[dict[str, Any]], replies: list[str], tokenizer: Any, prompts: list[list[int]]
) -> list[float]:
    """Seconds per call of the backend alone, on the same prompt ids."""
    backend = ScriptedBackend(tokenizer, replies)
    out = []

    async def run() -> None:
        for prompt in prompts:
            t0 = time.perf_counter()
            await backend.generate(prompt, max_tokens=None)
            out.append(time.perf_counter() - t0)

    asyncio.run(run())
    return out


def over_http(bodies: list[dict[str, Any]], replies: list[str], tokenizer: Any) -> list[float]:
    """Overhead per request over HTTP on 127.0.0.1 (round trip minus backend time)."""
    timed = Timed(ScriptedBackend(tokenizer, replies))
    gateway = Gateway(timed)  # type: ignore[arg-type]
    session = gateway.open_session("bench")
    raw = [orjson.dumps(b) for b in bodies]
    overhead = []
    with start(gateway) as running:
        conn = http.client.HTTPConnection(running.host, running.port)
        for data in raw:
            before, t0 = timed.spent, time.perf_counter()
            conn.request("POST", f"/s/{session.id}/v1/chat/completions", data,
                         {"Content-Type": "application/json"})  # fmt: skip
            response = conn.getresponse()
            response.read()
            assert response.status == 200, response.status
            overhead.append(time.perf_counter() - t0 - (timed.spent - before))
        conn.close()
    return overhead


def memory(bodies: list[dict[str, Any]], replies: list[str], tokenizer: Any) -> int:
    """Bytes one finished session holds (tree, turns with their wire requests, indexes)."""
    gateway = Gateway(ScriptedBackend(tokenizer, replies))
    raw = [orjson.dumps(b) for b in bodies]
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.take_snapshot()
    session = gateway.open_session("bench")

    async def run() -> None:
        for data in raw:
            (await session.complete(openai_chat.parse(orjson.loads(data)))).commit()

    asyncio.run(run())
    gc.collect()
    held = sum(s.size_diff for s in tracemalloc.take_snapshot().compare_to(base, "filename"))
    tracemalloc.stop()
    return held


def main() -> None:
    """Run the measurements and print medians and ratios."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--turns", type=int, default=30)
    ap.add_argument("--tokens", type=int, default=32000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    tokenizer = load_qwen3_tokenizer()
    replies, outputs = conversation(args.turns, args.tokens, tokenizer)
    recorder = ScriptedBackend(tokenizer)
    bodies = requests(replies, outputs, recorder)
    prompts = [c.prompt_ids for c in recorder.calls]
    ms = lambda xs: 1000 * statistics.median(xs)  # noqa: E731
    for r in range(args.repeats):
        overhead, inside, tokenizing, tokens = in_process(bodies, replies, tokenizer)
        rest = [o - t for o, t in zip(overhead, tokenizing, strict=True)]
        alone = direct(bodies, replies, tokenizer, prompts)
        http_over = over_http(bodies, replies, tokenizer)
        print(f"run {r + 1}: {len(bodies)} requests, {tokens} tokens in the tree, "
              f"last prompt {len(prompts[-1])} ids")  # fmt: skip
        print(f"  backend alone      median {ms(alone):7.3f} ms/request")
        print(f"  backend in gateway median {ms(inside):7.3f} ms/request")
        print(
            f"  gateway overhead   median {ms(overhead):7.3f} ms/request in process "
            f"({ms(overhead) / ms(alone):.2f}x the backend call), "
            f"{ms(http_over):7.3f} ms over HTTP ({ms(http_over) / ms(alone):.2f}x)"
        )
        new = statistics.median(len(b["messages"][-1]["content"]) for b in bodies[1:])
        print(f"    of which tokenizing the new observations (~{new:.0f} characters each) "
              f"median {ms(tokenizing):7.3f} ms; everything else {ms(rest):7.3f} ms")  # fmt: skip
    held = memory(bodies, replies, tokenizer)
    print(f"memory per finished session: {held / 2**20:.2f} MiB "
          f"({held / max(1, tokens):.0f} bytes per token in the tree)")  # fmt: skip


if __name__ == "__main__":
    main()
