"""``uniagent gateway``: serve the gateway in front of a token backend."""

from __future__ import annotations

import argparse
import json
import threading
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
    if args.scripted:
        if not args.tokenizer:
            raise ConfigError("--scripted needs --tokenizer PATH (the chat template to render)")
        from transformers import AutoTokenizer

        replies = _json_arg(Path(args.scripted).read_text(), "--scripted")
        if not isinstance(replies, list) or not all(isinstance(r, str) for r in replies):
            raise ConfigError("--scripted must name a JSON file holding an array of reply texts")
        backend = ScriptedBackend(
            AutoTokenizer.from_pretrained(args.tokenizer),
            replies[:-1],
            default=replies[-1] if replies else None,
        )
    elif args.model:
        if not args.model.startswith("hf:"):
            raise ConfigError(
                f"--model {args.model!r}: the gateway needs a backend that continues token ids "
                "(hf:PATH); openai: servers are sent chat messages, not ids"
            )
        from uniagent.models.spec import from_spec

        backend = TokenModelBackend(from_spec(args.model))  # type: ignore[arg-type]
    else:
        raise ConfigError("give --model hf:PATH or --scripted REPLIES.json --tokenizer PATH")
    gateway = Gateway(
        backend,
        parser=args.parser,
        chat_template_kwargs=kwargs,
        exactness=args.exactness,
        open_sessions=True,
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
    p.add_argument("--model", help="token backend: hf:PATH")
    p.add_argument("--scripted", metavar="JSON", help="replay reply texts (the last repeats)")
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
