"""``uniagent gateway``: serve the gateway in front of a token backend."""

from __future__ import annotations

import argparse
import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from uniagent.errors import ConfigError


def cmd_gateway(args: argparse.Namespace) -> int:
    """Serve the gateway until interrupted; sessions are opened with ``POST /sessions``."""
    try:
        from uniagent.gateway.backend import ScriptedBackend, TokenBackend, TokenModelBackend
        from uniagent.gateway.manager import Gateway
        from uniagent.gateway.server import start
    except ImportError as exc:
        raise ConfigError(
            f"uniagent gateway needs its extra ({exc.name} is missing): "
            "pip install 'uniagent[gateway]'"
        ) from None
    kwargs = _json_arg(args.chat_template_kwargs, "--chat-template-kwargs")
    backend: TokenBackend
    session_backend: Callable[[], TokenBackend] | None = None
    if args.scripted:
        if not args.tokenizer:
            raise ConfigError("--scripted needs --tokenizer PATH (the chat template to render)")
        from transformers import AutoTokenizer

        replies = _json_arg(Path(args.scripted).read_text(), "--scripted")
        if not isinstance(replies, list) or not all(isinstance(r, str) for r in replies):
            raise ConfigError("--scripted must name a JSON file holding an array of reply texts")
        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)

        def fresh_script() -> TokenBackend:  # each session replays the script from the start
            return ScriptedBackend(
                tokenizer, replies[:-1], default=replies[-1] if replies else None
            )

        backend, session_backend = fresh_script(), fresh_script
    elif args.model:
        from uniagent.models.spec import GUIDED_REASON, check_spec, from_spec, is_guided

        if is_guided(args.model):  # refused before the model loads
            raise ConfigError(f"--model {args.model!r}: {GUIDED_REASON}")
        check_spec(args.model, None)
        model = from_spec(args.model, token_backend=True)
        backend = TokenModelBackend(model)  # type: ignore[arg-type]
    else:
        raise ConfigError(
            "give --model hf:PATH or openai:BASE_URL#MODEL?tokenizer=PATH, or --scripted "
            "REPLIES.json --tokenizer PATH"
        )
    gateway = Gateway(
        backend,
        parser=args.parser,
        chat_template_kwargs=kwargs,
        exactness=args.exactness,
        open_sessions=True,
        session_backend=session_backend,
    )
    running = start(gateway, host=args.host, port=args.port)
    print(
        f"uniagent gateway: {running.url} (POST {running.url}/sessions opens a session)", flush=True
    )
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        running.stop()
    return 0


def _json_arg(text: str | None, name: str) -> Any:
    if not text:
        return {}
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{name} is not valid JSON: {exc}") from None


def add_gateway_parser(sub: Any) -> None:
    """The ``uniagent gateway`` sub-command."""
    p = sub.add_parser(
        "gateway",
        help="serve OpenAI/Anthropic-compatible APIs that record token-exact trajectory trees",
        description="An HTTP gateway (Chat Completions, Responses, Messages; streaming or not) "
        "in front of a token backend; each session records every token as a trajectory tree. "
        "Needs pip install 'uniagent[gateway]'. See docs/gateway.md.",
    )
    p.add_argument(
        "--model",
        help="token backend: hf:PATH (in process; not ?guided=) or "
        "openai:BASE_URL#MODEL?tokenizer=PATH (a server that continues token ids and returns "
        "them: vLLM)",
    )
    p.add_argument(
        "--scripted",
        metavar="JSON",
        help="replay a JSON array of reply texts: each session from the first, the last repeats",
    )
    p.add_argument("--tokenizer", metavar="PATH", help="tokenizer folder (with --scripted)")
    p.add_argument(
        "--parser",
        default="hermes",
        help="tool-call format: an installed tool parser (hermes, qwen3_coder, a plugin's)",
    )
    p.add_argument("--chat-template-kwargs", metavar="JSON", help='e.g. {"enable_thinking": false}')
    p.add_argument(
        "--exactness",
        default="on_close",
        choices=["eager", "on_close", "off"],
        help="when prompts are compared with a fresh render",
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8400, help="port (0: any free one)")
    p.set_defaults(func=cmd_gateway)
