"""A real HTTP server speaking OpenAI chat completions, with scripted replies, for tests.

Runs ``http.server`` in a thread on 127.0.0.1 (any free port). Each request takes
the next scripted item: a :class:`Reply` (an assistant message, optionally with
``tool_calls``, token ids and log-probs the vLLM way), a :class:`Fail` (an HTTP
error such as 429 or 500, with headers like ``Retry-After``), or a callable that
gets the request body and returns either. Every request body is kept in
``requests``::

    with ScriptedChatServer([Fail(429), Reply("hi")]) as server:
        model = OpenAIChatModel(server.base_url, "test-model")

With ``api_key``, every request must carry ``Authorization: Bearer <key>`` (else
401, as hosted APIs answer); ``models_status`` makes ``GET /models`` fail with that
status (a key without the permission to list models). A :class:`Gate` holds requests until the test
releases it, so a test knows exactly which episodes are waiting on the model.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Reply:
    """A successful chat completion.

    With ``token_ids``, a request asking for ``logprobs`` gets one entry per token
    (``"token_id:N"`` strings when it sets ``return_tokens_as_token_ids``, as vLLM
    does), and one setting ``return_token_ids`` gets ``choices[0].token_ids`` plus
    ``prompt_token_ids`` (rendered with ``tokenizer`` when the server has one).
    """

    content: str | None = ""
    tool_calls: list[dict[str, Any]] | None = None
    finish_reason: str | None = None
    reasoning_content: str | None = None
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    usage: dict[str, int] | None = None


@dataclass
class Fail:
    """An HTTP error response in OpenAI's error format."""

    status: int = 500
    message: str = "scripted failure"
    headers: dict[str, str] = field(default_factory=dict)
    code: str | None = None


Script = Reply | Fail | Callable[[dict[str, Any]], "Reply | Fail"]


class Gate:
    """Holds the requests that call :meth:`hold` until :meth:`release`; counts them.

    A script calls ``gate.hold()`` before answering; the test waits with
    :meth:`wait_for` until that many requests are held (an event, not a sleep),
    acts, then releases them.
    """

    def __init__(self) -> None:
        self.held = 0
        self._changed = threading.Condition()
        self._open = threading.Event()

    def hold(self) -> None:
        """Count this request as held and block until the gate is released."""
        with self._changed:
            self.held += 1
            self._changed.notify_all()
        self._open.wait()

    def wait_for(self, count: int, timeout: float = 300.0) -> bool:
        """Block until ``count`` requests have been held; False if ``timeout`` passed first."""
        with self._changed:
            return self._changed.wait_for(lambda: self.held >= count, timeout)

    def release(self) -> None:
        """Let every held request (and every later one) through."""
        self._open.set()


def tool_call(name: str, arguments: Mapping[str, Any] | str, call_id: str = "call_0") -> dict:
    """An OpenAI ``tool_calls`` entry (arguments JSON-encoded unless already a string)."""
    args = arguments if isinstance(arguments, str) else json.dumps(dict(arguments))
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}


def shell_policy(
    commands_for: Callable[[list[dict[str, Any]]], list[str]],
) -> Callable[[dict[str, Any]], Reply]:
    """A policy that runs, one per turn, the ``execute_bash`` commands ``commands_for`` gives
    for a conversation (its messages), then calls ``submit``."""

    def reply(body: dict[str, Any]) -> Reply:
        messages = body["messages"]
        commands = commands_for(messages)
        turn = sum(1 for m in messages if m["role"] == "assistant")
        if turn < len(commands):
            call = tool_call("execute_bash", {"command": commands[turn]}, f"call_{turn}")
            return Reply("", tool_calls=[call])
        return Reply("", tool_calls=[tool_call("submit", {}, f"call_{turn}")])

    return reply


class ScriptedChatServer:
    """``/v1/chat/completions``, ``/v1/completions`` (token prompts, vLLM's token ids)
    and ``/v1/models`` on 127.0.0.1, answering from a script."""

    def __init__(
        self,
        script: Iterable[Script] = (),
        *,
        tokenizer: Any = None,
        default: Script | None = None,
        model: str = "test-model",
        api_key: str | None = None,
        models_status: int = 200,
        max_model_len: int | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.api_key = api_key
        #: What ``GET /models`` answers: 200 with the model, or this error status.
        self.models_status = models_status
        #: The context length ``GET /models`` lists with the model (as vLLM does), if any.
        self.max_model_len = max_model_len
        self.default = default
        self.model = model
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self._script: deque[Script] = deque(script)
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @classmethod
    def completing(
        cls, tokenizer: Any, texts: Iterable[str], *, end_of_turn: str = "<|im_end|>"
    ) -> ScriptedChatServer:
        """A server continuing token prompts (``/v1/completions``, vLLM's ids) with
        ``texts`` in order, each as the ids ``tokenizer`` gives it plus ``end_of_turn``:
        what a served model behind the gateway (a harness's) is scripted with."""
        eot = int(tokenizer.convert_tokens_to_ids(end_of_turn))
        replies = deque(texts)

        def next_reply(body: dict[str, Any]) -> Reply | Fail:
            if not replies:
                return Fail(500, "ScriptedChatServer: the script is exhausted")
            text = replies.popleft()
            ids = [*tokenizer.encode(text, add_special_tokens=False), eot]
            return Reply(text, token_ids=ids, logprobs=[-0.01] * len(ids))

        return cls(default=next_reply, tokenizer=tokenizer)

    # -- lifecycle ----------------------------------------------------------------------
    def start(self) -> ScriptedChatServer:
        """Bind a free port and serve in a daemon thread."""
        handler = type("Handler", (_Handler,), {"owner": self})
        self._server = _Server(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Shut the server down and wait for its thread."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def __enter__(self) -> ScriptedChatServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT/v1``, for OpenAI clients."""
        if self._server is None:
            raise RuntimeError("the server is not running; call start() or use it as a context")
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    # -- script -------------------------------------------------------------------------
    def add(self, *items: Script) -> None:
        """Append replies to the script."""
        with self._lock:
            self._script.extend(items)

    @property
    def pending(self) -> int:
        """Scripted items not used yet."""
        with self._lock:
            return len(self._script)

    def _next(self, body: dict[str, Any], headers: dict[str, str]) -> Reply | Fail:
        with self._lock:
            self.requests.append(body)
            self.headers.append(headers)
            item = self._script.popleft() if self._script else self.default
        if item is None:
            return Fail(500, "ScriptedChatServer: the script is exhausted")
        return item(body) if callable(item) else item

    # -- responses ------------------------------------------------------------------------
    def completion(self, body: dict[str, Any], reply: Reply) -> dict[str, Any]:
        """The chat-completion JSON for ``reply`` as asked for by ``body``."""
        message: dict[str, Any] = {"role": "assistant", "content": reply.content}
        if reply.tool_calls:
            message["tool_calls"] = reply.tool_calls
        if reply.reasoning_content is not None:
            message["reasoning_content"] = reply.reasoning_content
        finish = reply.finish_reason or ("tool_calls" if reply.tool_calls else "stop")
        choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": finish}
        ids = reply.token_ids
        if ids is not None and body.get("logprobs"):
            lps = reply.logprobs if reply.logprobs is not None else [0.0] * len(ids)
            as_ids = bool(body.get("return_tokens_as_token_ids"))
            choice["logprobs"] = {
                "content": [
                    {
                        "token": self._token_text(t, as_ids),
                        "logprob": lp,
                        "bytes": None,
                        "top_logprobs": [],
                    }
                    for t, lp in zip(ids, lps, strict=True)
                ]
            }
        prompt_ids = self._prompt_ids(body)
        result: dict[str, Any] = {
            "id": f"chatcmpl-{len(self.requests)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", self.model),
            "choices": [choice],
        }
        if body.get("return_token_ids") and ids is not None:
            choice["token_ids"] = list(ids)
            result["prompt_token_ids"] = prompt_ids
        completion_tokens = len(ids) if ids is not None else len((reply.content or "").split())
        prompt_tokens = len(prompt_ids) if prompt_ids is not None else 0
        result["usage"] = reply.usage or {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }
        return result

    def text_completion(self, body: dict[str, Any], reply: Reply) -> dict[str, Any]:
        """vLLM's ``/completions`` JSON for ``reply``: a prompt of token ids continued by
        ``reply.token_ids`` (the reply's ``content`` is the text the server decoded)."""
        prompt = body.get("prompt")
        if not (isinstance(prompt, list) and all(isinstance(i, int) for i in prompt)):
            raise ValueError("this server continues token prompts only (a list of ids)")
        ids = reply.token_ids
        if ids is None:
            raise ValueError("a /completions reply needs token_ids")
        lps = reply.logprobs if reply.logprobs is not None else [0.0] * len(ids)
        choice: dict[str, Any] = {
            "index": 0,
            "text": reply.content or "",
            "finish_reason": reply.finish_reason or "stop",
        }
        if body.get("logprobs") is not None:
            as_ids = bool(body.get("return_tokens_as_token_ids"))
            choice["logprobs"] = {
                "tokens": [self._token_text(t, as_ids) for t in ids],
                "token_logprobs": list(lps),
                "top_logprobs": None,
                "text_offset": [0] * len(ids),
            }
        if body.get("return_token_ids"):
            choice["token_ids"] = list(ids)
            choice["prompt_token_ids"] = list(prompt)
        return {
            "id": f"cmpl-{len(self.requests)}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": body.get("model", self.model),
            "choices": [choice],
            "usage": reply.usage
            or {
                "prompt_tokens": len(prompt),
                "completion_tokens": len(ids),
                "total_tokens": len(prompt) + len(ids),
            },
        }

    def _token_text(self, token_id: int, as_ids: bool) -> str:
        if as_ids or self.tokenizer is None:
            return f"token_id:{token_id}"
        return str(self.tokenizer.decode([token_id]))

    def _prompt_ids(self, body: dict[str, Any]) -> list[int] | None:
        if self.tokenizer is None:
            return None
        kwargs = dict(body.get("chat_template_kwargs") or {})
        return list(
            self.tokenizer.apply_chat_template(
                body.get("messages", []),
                tools=body.get("tools") or None,
                add_generation_prompt=True,
                tokenize=True,
                return_dict=False,
                **kwargs,
            )
        )


class _Server(ThreadingHTTPServer):
    request_queue_size = 1024  # hundreds of clients may connect at once (benchmarks)

    def handle_error(self, request: Any, client_address: Any) -> None:
        import sys

        if isinstance(sys.exc_info()[1], ConnectionError):
            return  # the client went away (a killed run): nothing to report
        super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    owner: ScriptedChatServer
    protocol_version = "HTTP/1.1"
    # Headers and body go out in two writes: with Nagle's algorithm the body waits for
    # the client's delayed ACK of the headers (~40 ms per reply on Linux).
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _authorized(self) -> bool:
        key = self.owner.api_key
        if key is None or self.headers.get("Authorization") == f"Bearer {key}":
            return True
        if self.command == "POST":  # keep the connection usable: read the body first
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
        message = "Incorrect API key provided."
        self._send(401, _error(401, message, "invalid_api_key"))
        return False

    def do_GET(self) -> None:
        if not self._authorized():
            return
        if self.path.rstrip("/").endswith("/models"):
            status = self.owner.models_status
            if status != 200:
                self._send(status, _error(status, "listing models is not allowed"))
                return
            entry: dict[str, Any] = {"id": self.owner.model, "object": "model"}
            if self.owner.max_model_len is not None:
                entry["max_model_len"] = self.owner.max_model_len
            data = {"object": "list", "data": [entry]}
            self._send(200, data)
        else:
            self._send(404, _error(404, f"no route {self.path}"))

    def do_POST(self) -> None:
        if not self._authorized():
            return
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        route = self.path.rstrip("/")
        chat = route.endswith("/chat/completions")
        if not chat and not route.endswith("/completions"):
            self._send(404, _error(404, f"no route {self.path}"))
            return
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            self._send(400, _error(400, "request body is not JSON"))
            return
        item = self.owner._next(body, {k.lower(): v for k, v in self.headers.items()})
        if isinstance(item, Fail):
            self._send(item.status, _error(item.status, item.message, item.code), item.headers)
            return
        try:
            data = (self.owner.completion if chat else self.owner.text_completion)(body, item)
        except Exception as exc:
            self._send(500, _error(500, f"ScriptedChatServer failed: {exc!r}"))
            return
        self._send(200, data)

    def _send(self, status: int, data: Any, headers: Mapping[str, str] | None = None) -> None:
        payload = json.dumps(data).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(payload)


def _error(status: int, message: str, code: str | None = None) -> dict[str, Any]:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}
