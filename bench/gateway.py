"""Gateway overhead per request, beside calling the token backend directly.

    python bench/gateway.py [--turns 30] [--tokens 32000] [--repeats 3]

One session of ``--turns`` chat-completions turns whose context grows to about
``--tokens`` tokens (a tool output per turn, the real Qwen3 tokenizer, a scripted
backend), three ways:

- **direct**: a client of the token backend itself, as uniagent's own loop is one: it
  holds its context ids, renders and tokenizes each turn's new messages (the tool
  output) with the chat template, and calls ``generate``;
- **gateway in process**: the same requests as wire bodies through a gateway session
  (JSON parse, wire parse, prefix match, the same render and tokenizing, output parse,
  tree insert, wire response);
- **gateway over HTTP**: the same, from a client in another process (a harness is one)
  over a keep-alive connection on 127.0.0.1, request bodies prepared before timing.

The gateway's overhead is its time per request beyond the direct client's (the time
inside the backend is measured in both and taken out). Tokenizing the new tool output
is work both do (about a thousand tokens a turn here); it is printed on its own, and so
is the overhead over a bare ``generate`` call on ready prompt ids. Prints medians and
ratios, and the memory one finished session holds (tracemalloc). Needs
``uniagent[gateway,tokenizers]`` (and ``httptools``, which the extra installs, for
uvicorn's fast HTTP parser).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Sequence
from typing import Any

import orjson

from uniagent.gateway import Gateway, ScriptedBackend
from uniagent.gateway.backend import Generation
from uniagent.gateway.server import start
from uniagent.gateway.wire import openai_chat
from uniagent.rollout.template import analyse_chat_template, encode, render_text, suffix_text
from uniagent.testing import load_qwen3_tokenizer
from uniagent.testing.scripted import hermes_call

TOOLS = [{"type": "function", "function": {
    "name": "bash", "description": "Run a shell command.",
    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}}]  # fmt: skip


class Timed:
    """A backend wrapper that adds up the seconds spent inside ``generate`` (``spent``; each
    call's in ``calls``)."""

    def __init__(self, inner: ScriptedBackend) -> None:
        self.inner, self.tokenizer, self.spent = inner, inner.tokenizer, 0.0
        self.calls: list[float] = []

    async def generate(
        self, prompt_ids: list[int], *, max_tokens: int | None, stop: Sequence[str] = ()
    ) -> Generation:
        t0 = time.perf_counter()
        try:
            return await self.inner.generate(prompt_ids, max_tokens=max_tokens, stop=stop)
        finally:
            self.calls.append(time.perf_counter() - t0)
            self.spent += self.calls[-1]


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


def bare(replies: list[str], tokenizer: Any, prompts: list[list[int]]) -> list[float]:
    """Seconds per call of the backend alone, on ready prompt ids."""
    backend = ScriptedBackend(tokenizer, replies)
    out = []

    async def run() -> None:
        for prompt in prompts:
            t0 = time.perf_counter()
            await backend.generate(prompt, max_tokens=None)
            out.append(time.perf_counter() - t0)

    asyncio.run(run())
    return out


def direct(
    bodies: list[dict[str, Any]], replies: list[str], tokenizer: Any
) -> tuple[list[float], list[float]]:
    """(seconds per turn outside the backend, seconds tokenizing) of a direct client.

    It keeps its context ids and, after the first turn, renders and tokenizes only the
    messages after its own reply (the way uniagent's loop builds its prompts).
    """
    timed = Timed(ScriptedBackend(tokenizer, replies))
    analysis = analyse_chat_template(tokenizer)
    eot = analysis.eot_id
    outside, tokenizing = [], []

    async def run() -> None:
        context: list[int] = []
        for i, body in enumerate(bodies):
            before, t0 = timed.spent, time.perf_counter()
            if i == 0:
                text = render_text(tokenizer, body["messages"], tools=body["tools"],
                                   add_generation_prompt=True, chat_template_kwargs={})  # fmt: skip
                t1 = time.perf_counter()
                context = encode(tokenizer, text)
            else:
                new = body["messages"][len(bodies[i - 1]["messages"]) + 1 :]
                text = suffix_text(tokenizer, analysis, new, tools=body["tools"],
                                   chat_template_kwargs={})  # fmt: skip
                t1 = time.perf_counter()
                if context[-1] != eot:
                    context.append(eot)
                context += encode(tokenizer, text)
            t2 = time.perf_counter()
            out = await timed.generate(list(context), max_tokens=None)
            context += out.token_ids
            outside.append(time.perf_counter() - t0 - (timed.spent - before))
            tokenizing.append(t2 - t1)

    asyncio.run(run())
    return outside, tokenizing


#: The HTTP client, in a process of its own: the round trip of each request, in seconds.
_CLIENT = r"""
import http.client, json, socket, sys, time
host, port, path, bodies = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
raw = open(bodies, "rb").read().split(b"\n")
conn = http.client.HTTPConnection(host, port)
conn.connect()
conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
out = []
for data in raw:
    t0 = time.perf_counter()
    conn.request("POST", path, data, {"Content-Type": "application/json"})
    response = conn.getresponse()
    response.read()
    assert response.status == 200, response.status
    out.append(time.perf_counter() - t0)
print(json.dumps(out))
"""


def over_http(bodies: list[dict[str, Any]], replies: list[str], tokenizer: Any) -> list[float]:
    """Seconds per request over HTTP on 127.0.0.1 outside the backend, the client in a
    process of its own."""
    timed = Timed(ScriptedBackend(tokenizer, replies))
    gateway = Gateway(timed)  # type: ignore[arg-type]
    session = gateway.open_session("bench")
    with tempfile.NamedTemporaryFile(suffix=".jsonl") as f:
        f.write(b"\n".join(orjson.dumps(b) for b in bodies))
        f.flush()
        with start(gateway) as running:
            path = f"/s/{session.id}/v1/chat/completions"
            argv = [sys.executable, "-c", _CLIENT, running.host, str(running.port), path, f.name]
            done = subprocess.run(argv, capture_output=True, text=True, check=True)
    trips = json.loads(done.stdout)
    return [t - s for t, s in zip(trips, timed.calls, strict=True)]


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
        overhead, _, tokenizing, tokens = in_process(bodies, replies, tokenizer)
        alone = bare(replies, tokenizer, prompts)
        client, client_tok = direct(bodies, replies, tokenizer)
        http_out = over_http(bodies, replies, tokenizer)
        over = [o - c for o, c in zip(overhead, client, strict=True)]
        over_h = [h - c for h, c in zip(http_out, client, strict=True)]
        print(f"run {r + 1}: {len(bodies)} requests, {tokens} tokens in the tree, "
              f"last prompt {len(prompts[-1])} ids")  # fmt: skip
        print(f"  backend generate   median {ms(alone):7.3f} ms/request (ready prompt ids)")
        print(f"  direct client      median {ms(client):7.3f} ms/request outside the backend, "
              f"of which tokenizing the new messages {ms(client_tok):7.3f} ms")  # fmt: skip
        print(
            f"  gateway            median {ms(overhead):7.3f} ms/request outside the backend "
            f"in process (tokenizing {ms(tokenizing):.3f} ms), {ms(http_out):7.3f} ms over HTTP"
        )
        print(
            f"  gateway overhead   median {ms(over):7.3f} ms/request in process, "
            f"{ms(over_h):7.3f} ms over HTTP, beyond the direct client "
            f"({ms(overhead) / ms(client):.2f}x, {ms(http_out) / ms(client):.2f}x its time)"
        )
    held = memory(bodies, replies, tokenizer)
    print(f"memory per finished session: {held / 2**20:.2f} MiB "
          f"({held / max(1, tokens):.0f} bytes per token in the tree)")  # fmt: skip


if __name__ == "__main__":
    main()
