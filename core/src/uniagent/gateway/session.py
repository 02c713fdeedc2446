"""Gateway sessions: render a request, call the token backend, record the turn in the tree.

A request arrives as :class:`ChatRequest` (chat messages in the internal form every wire
format converts to, see :mod:`uniagent.gateway.wire`). Its prompt ids come from the
longest earlier token prefix: the same prompt as an earlier turn (its exact ids), or an
earlier turn's exact context plus the new messages rendered incrementally with the chat
template (observations, mask 0); otherwise the whole request is rendered and the tree
branches where its ids leave the earlier ones. Generated ids are never re-tokenized.
"""

from __future__ import annotations

import contextlib
import hashlib
import secrets
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from uniagent.errors import UniAgentError
from uniagent.gateway.backend import TokenBackend
from uniagent.gateway.tree import Node, TrajectoryTree, Turn
from uniagent.parsers import ToolCallParser
from uniagent.parsers.base import ToolCallFormatError
from uniagent.rollout.template import (
    analyse_chat_template,
    decode,
    encode,
    render_text,
    suffix_text,
)

Exactness = Literal["eager", "on_close", "off"]
#: Requests one session may have waiting for the token backend at once; more are refused
#: (429): a harness's shell reaches its gateway session, and a policy that floods the
#: backend must not make it fail (a backend failure is infrastructure: its episode masked).
MAX_IN_FLIGHT = 4


class GatewayError(UniAgentError):
    """A request the gateway refuses; ``status`` and ``kind`` shape the wire error."""

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        kind: str = "invalid_request_error",
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.kind, self.param = status, kind, param


@dataclass
class ChatRequest:
    """A request in the internal form: OpenAI-style messages, tool schemas, limits."""

    wire: str
    body: dict[str, Any]
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    max_tokens: int | None = None
    stop: list[str] = field(default_factory=list)
    call_id_prefix: str = "call_"


@dataclass
class Completion:
    """The parsed model output of one request, recorded when :meth:`commit` is called."""

    content: str
    reasoning: str | None
    tool_calls: list[dict[str, Any]]  # {"id", "name", "arguments": dict}
    finish_reason: Literal["stop", "length", "tool_calls"]
    prompt_tokens: int
    completion_tokens: int
    turn: Turn
    commit: Callable[[], None] = field(repr=False)

    def assistant_message(self) -> dict[str, Any]:
        """The internal assistant message a harness sends back for this completion."""
        return assistant_message(self.content, self.reasoning, self.tool_calls)


def assistant_message(
    content: str, reasoning: str | None, tool_calls: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """An assistant message in the internal form (what every wire format converts to)."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning:
        message["reasoning_content"] = reasoning
    if tool_calls:
        message["tool_calls"] = [
            {
                "id": c["id"],
                "type": "function",
                "function": {"name": c["name"], "arguments": c["arguments"]},
            }
            for c in tool_calls
        ]
    return message


def _digest(value: Any) -> bytes:
    return hashlib.blake2b(
        orjson.dumps(value, option=orjson.OPT_SORT_KEYS), digest_size=16
    ).digest()


class Session:
    """One episode's conversation with the gateway and its :class:`TrajectoryTree`."""

    def __init__(
        self,
        session_id: str,
        key: str,
        backend: TokenBackend,
        parser: ToolCallParser,
        chat_template_kwargs: Mapping[str, Any],
        exactness: Exactness,
        max_in_flight: int = MAX_IN_FLIGHT,
    ) -> None:
        self.id, self.key = session_id, key
        self.max_in_flight = max_in_flight
        #: Requests refused because ``max_in_flight`` were waiting (the harness's doing).
        self.refused_in_flight = 0
        self.backend, self.parser = backend, parser
        self.tokenizer = backend.tokenizer
        self.kwargs = dict(chat_template_kwargs)
        self.analysis = analyse_chat_template(self.tokenizer, **self.kwargs)
        self.exactness: Exactness = exactness
        self.tree = TrajectoryTree()
        self.closed = False
        #: Completions generated but never delivered (the client went away): not in the tree.
        self.undelivered: list[dict[str, Any]] = []
        #: Why the token backend failed on a request (infrastructure, not the harness's).
        self.backend_errors: list[str] = []
        self._failure_listeners: list[Callable[[str], None]] = []
        #: Requests refused because the prompt left no room in the model's context.
        self.limit_errors: list[str] = []
        #: Seconds during which at least one request waited for the token backend (the
        #: model's time, not the harness's: a time limit must not charge it to the policy).
        self.model_seconds = 0.0
        self._waiting = 0  # requests waiting for the backend now
        self._waiting_since = 0.0
        self._prompts: dict[bytes, Node] = {}  # key of a request's messages -> its turn's end
        self._ends: dict[bytes, Node] = {}  # key of request + its reply -> the turn's end
        self._served = 0  # completions generated (for tool-call ids)
        self._turn_of: dict[int, Turn] = {}  # id(end node) + prompt key -> turn (identical)
        #: The last recorded turn's end node and its context ids (what a harness extends next).
        self._last_context: tuple[Node, list[int], list[int]] | None = None

    def backend_failed(self, reason: str) -> None:
        """Record a failure of the token backend and tell whoever listens (the harness's
        runner ends a harness whose model failed: its episode is infrastructure already)."""
        self.backend_errors.append(reason)
        for listener in list(self._failure_listeners):
            with contextlib.suppress(RuntimeError):  # its episode's loop is gone
                listener(reason)

    def on_backend_failure(self, listener: Callable[[str], None]) -> Callable[[], None]:
        """Call ``listener(reason)`` on each backend failure (from the gateway's thread);
        returns the function that stops it."""
        self._failure_listeners.append(listener)
        return lambda: self._failure_listeners.remove(listener)

    def waited(self) -> float:
        """Seconds waited for the model so far, a wait in progress included."""
        now = time.perf_counter() - self._waiting_since if self._waiting else 0.0
        return self.model_seconds + now

    @contextlib.contextmanager
    def _waiting_for_the_model(self) -> Iterator[None]:
        """Count the time with a request in the backend into :attr:`model_seconds` (once,
        however many requests overlap)."""
        if self._waiting == 0:
            self._waiting_since = time.perf_counter()
        self._waiting += 1
        try:
            yield
        finally:
            self._waiting -= 1
            if self._waiting == 0:
                self.model_seconds += time.perf_counter() - self._waiting_since

    # ------------------------------------------------------------------ the request
    def _keys(self, request: ChatRequest) -> list[bytes]:
        """keys[k]: the digest of the tools and the first k messages."""
        key = _digest([request.tools or [], self.kwargs])
        keys = [key]
        for message in request.messages:
            key = hashlib.blake2b(key + _digest(message), digest_size=16).digest()
            keys.append(key)
        return keys

    async def complete(self, request: ChatRequest) -> Completion:
        """Build the prompt, generate, parse; the turn is recorded on ``commit()``."""
        if self.closed:
            raise GatewayError(f"session {self.id!r} is closed", status=404, kind="not_found_error")
        messages = request.messages
        if not messages:
            raise GatewayError("the request has no messages", param="messages")
        if messages[-1]["role"] == "assistant":
            raise GatewayError(
                "the last message is an assistant message; continuing a partial assistant "
                "turn (prefill) is not supported",
                param="messages",
            )
        if self._waiting >= self.max_in_flight:
            self.refused_in_flight += 1
            raise GatewayError(
                f"session {self.id!r} already has {self._waiting} requests waiting for the "
                f"model (at most {self.max_in_flight} at once); retry when one is answered",
                status=429,
                kind="rate_limit_error",
            )
        keys = self._keys(request)
        n = len(messages)
        start: Node | None = None
        seq_ids: list[int]
        seq_mask: list[int]
        seq_lp: list[float]
        same = self._prompts.get(keys[n])
        if same is not None:
            source = "identical"
            earlier = self._turn_of[id(same)]
            ids, mask, lp = self.tree.context(same)
            seq_ids, seq_mask, seq_lp = (
                ids[: earlier.prompt_len],
                mask[: earlier.prompt_len],
                lp[: earlier.prompt_len],
            )
            prompt_ids = seq_ids
        else:
            k = next((k for k in range(n - 1, 0, -1) if keys[k] in self._ends), 0)
            if k:
                source = "extension"
                start = self._ends[keys[k]]
                base = self._context_ids(start)
                obs = [] if base[-1] == self.analysis.eot_id else [self.analysis.eot_id]
                text = self._render_suffix(messages[k:], request.tools)
                obs += encode(self.tokenizer, text)
                seq_ids, seq_mask, seq_lp = obs, [0] * len(obs), [0.0] * len(obs)
                prompt_ids = base
                prompt_ids += obs  # base is a new list: no second copy of the context
            else:
                source = "render"
                prompt_ids = self._render(messages, request.tools)
                seq_ids, seq_mask = list(prompt_ids), [0] * len(prompt_ids)
                seq_lp = [0.0] * len(prompt_ids)
        with self._waiting_for_the_model():
            out = await self.backend.generate(
                prompt_ids, max_tokens=request.max_tokens, stop=request.stop
            )
        if not out.token_ids:
            raise GatewayError("the token backend returned no tokens", status=502, kind="api_error")
        gen_lp = list(out.logprobs) if out.logprobs is not None else [0.0] * len(out.token_ids)
        if len(gen_lp) != len(out.token_ids):
            raise GatewayError(
                f"the token backend returned {len(gen_lp)} log-probs for {len(out.token_ids)} ids",
                status=502,
                kind="api_error",
            )
        ended = out.token_ids[-1] == self.analysis.eot_id
        body = out.token_ids[:-1] if ended else out.token_ids
        reasoning, content, calls, problem = self._parse(
            decode(self.tokenizer, body), request.tools, request.call_id_prefix
        )
        finish: Literal["stop", "length", "tool_calls"] = (
            "tool_calls" if calls else "length" if out.finish_reason == "length" else "stop"
        )
        turn = Turn(
            index=-1,
            wire=request.wire,
            request=request.body,
            prompt_len=len(prompt_ids),
            generated=len(out.token_ids),
            source=source,
            finish_reason=finish,
            parse_error=problem,
            server=out.extra.get("server"),
            messages=messages,
            tools=request.tools,
        )
        completion: Completion

        def commit() -> None:
            turn.index = len(self.tree.turns)
            end = self.tree.insert(
                seq_ids + out.token_ids,
                seq_mask + [1] * len(out.token_ids),
                seq_lp + gen_lp,
                start,
            )
            self.tree.record(end, turn)
            # A node's context never changes (a split keeps the tail as the node), and the
            # path to the end of this run spells the prompt and the generated ids.
            self._last_context = (end, prompt_ids, out.token_ids)
            if id(end) not in self._turn_of:
                self._turn_of[id(end)] = turn
            self._prompts.setdefault(keys[n], end)
            reply = completion.assistant_message()
            self._ends[hashlib.blake2b(keys[n] + _digest(reply), digest_size=16).digest()] = end
            if self.exactness == "eager":
                self._check(turn, end, prompt_ids)

        completion = Completion(
            content, reasoning, calls, finish, len(prompt_ids), len(out.token_ids), turn, commit
        )
        return completion

    def discard(self, completion: Completion) -> None:
        """Note a completion the client never received (it is not added to the tree)."""
        self.undelivered.append(
            {"wire": completion.turn.wire, "generated": completion.completion_tokens}
        )

    def _context_ids(self, node: Node) -> list[int]:
        """Ids from the root to the end of ``node``, a new list (the last turn's end: its
        prompt and generated ids, without walking the tree)."""
        last = self._last_context
        if last is None or last[0] is not node:
            return self.tree.context_ids(node)
        ids = list(last[1])
        ids += last[2]
        return ids

    # ------------------------------------------------------------------ rendering
    def _render(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> list[int]:
        try:
            text = render_text(
                self.tokenizer,
                messages,
                tools=tools,
                add_generation_prompt=True,
                chat_template_kwargs=self.kwargs,
            )
        except Exception as exc:
            raise GatewayError(
                f"the chat template cannot render this request: {exc}", param="messages"
            ) from None
        return encode(self.tokenizer, text)

    def _render_suffix(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> str:
        try:
            return suffix_text(
                self.tokenizer,
                self.analysis,
                messages,
                tools=tools,
                chat_template_kwargs=self.kwargs,
            )
        except Exception as exc:
            raise GatewayError(
                f"the chat template cannot render the new messages: {exc}", param="messages"
            ) from None

    def _parse(
        self, text: str, tools: list[dict[str, Any]] | None, prefix: str
    ) -> tuple[str | None, str, list[dict[str, Any]], str | None]:
        """(reasoning, content, calls, problem) of the model's text."""
        reasoning, rest = split_thinking(text)
        try:
            content, raw = extract_calls(self.parser, rest, tools)
        except ToolCallFormatError as exc:
            return reasoning, rest.strip(), [], f"{exc.kind}: {exc}"
        self._served += 1
        calls = [
            {"id": f"{prefix}{self._call_id(i)}", "name": name, "arguments": args}
            for i, (name, args) in enumerate(raw)
        ]
        return reasoning, content, calls, None

    def _call_id(self, i: int) -> str:
        """A tool-call id, unique in the session and reproducible from its id and order."""
        seed = f"{self.id}/{self._served}/{i}".encode()
        return hashlib.blake2b(seed, digest_size=12).hexdigest()

    # ------------------------------------------------------------------ exactness
    def _check(self, turn: Turn, end: Node, prompt_ids: list[int] | None = None) -> None:
        fresh = self._render(turn.messages, turn.tools)
        if prompt_ids is None:
            prompt_ids = self.tree.context_ids(end)[: turn.prompt_len]
        turn.exact = fresh == prompt_ids
        served = (turn.server or {}).get("prompt_ids_differ")
        if turn.exact and served:  # the server did not generate from the ids it was sent
            turn.exact = False
            turn.drift = {"server_prompt": served}
            return
        if turn.exact:
            turn.drift = None
            return
        at = next(
            (i for i, (a, b) in enumerate(zip(prompt_ids, fresh, strict=False)) if a != b),
            min(len(prompt_ids), len(fresh)),
        )
        turn.drift = {
            "first_difference": at,
            "prompt_len": len(prompt_ids),
            "render_len": len(fresh),
            "prompt_text": decode(self.tokenizer, prompt_ids[at : at + 24]),
            "render_text": decode(self.tokenizer, fresh[at : at + 24]),
        }

    def check_exactness(self) -> None:
        """Compare every unchecked turn's prompt ids with a fresh render of its request."""
        for node in self.tree.nodes():
            for turn in node.turns:
                if turn.exact is None:
                    self._check(turn, node)

    def state(self) -> dict[str, Any]:
        """A summary for inspection: turns, branches, tokens."""
        nodes = list(self.tree.nodes())
        return {
            "id": self.id,
            "closed": self.closed,
            "turns": len(self.tree.turns),
            "branches": len(self.tree.leaves()),
            "nodes": len(nodes),
            "tokens": sum(len(n.ids) for n in nodes),
            "generated_tokens": sum(sum(n.mask) for n in nodes),
            "undelivered": list(self.undelivered),
            "backend_errors": list(self.backend_errors),
            "limit_errors": list(self.limit_errors),
            "refused_in_flight": self.refused_in_flight,
            "model_seconds": round(self.model_seconds, 3),
        }

    def close(self) -> dict[str, Any]:
        """Close the session and return its tree (exactness checked unless ``off``)."""
        self.closed = True
        if self.exactness != "off":
            self.check_exactness()
        return {"session": self.state(), "tree": self.tree.to_dict()}


def split_thinking(
    text: str, tags: tuple[str, str] = ("<think>", "</think>")
) -> tuple[str | None, str]:
    """(reasoning, rest): a leading think block, or text up to a ``</think>`` the prompt opened."""
    opening, closing = tags
    stripped = text.lstrip()
    if stripped.startswith(opening):
        end = stripped.find(closing)
        if end < 0:
            return stripped[len(opening) :].strip("\n"), ""
        return stripped[len(opening) : end].strip("\n"), stripped[end + len(closing) :].lstrip("\n")
    end = text.find(closing)
    if end >= 0 and opening not in text[:end]:
        return text[:end].strip("\n"), text[end + len(closing) :].lstrip("\n")
    return None, text


def extract_calls(
    parser: ToolCallParser, text: str, tools: list[dict[str, Any]] | None
) -> tuple[str, list[tuple[str, dict[str, Any]]]]:
    """The content outside tool calls and each call's (name, arguments), unvalidated, as
    the parser reads them for a client (:class:`~uniagent.parsers.base.CallReader`).

    The harness validates calls against its own tools; the gateway only reads them.
    Raises :class:`ToolCallFormatError` for a malformed block.
    """
    # getattr, not isinstance(parser, CallReader): a protocol check costs microseconds
    read_calls = getattr(parser, "read_calls", None)
    if read_calls is None:
        raise GatewayError(
            f"tool parser {parser.name!r} cannot serve the gateway: it has no read_calls()",
            status=500,
            kind="api_error",
        )
    calls: tuple[str, list[tuple[str, dict[str, Any]]]] = read_calls(text, tools)
    return calls


def new_session_id() -> str:
    """A fresh session id."""
    return uuid.uuid4().hex[:16]


def new_key() -> str:
    """A fresh API key for a session."""
    return "ua-" + secrets.token_urlsafe(24)
