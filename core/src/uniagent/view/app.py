"""The web app of ``uniagent view``: a JSON API over run folders, live events, the page.

Read-only by construction: there are only GET routes, and every file is reached through
:class:`~uniagent.view.rundir.RunFolder`, which refuses paths outside its folder.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from sse_starlette.sse import EventSourceResponse
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from uniagent.errors import ConfigError
from uniagent.view import index
from uniagent.view.rundir import (
    INFRA_EXITS,
    MESSAGES,
    ROLLOUT,
    NotFound,
    OutsideRunFolder,
    RunFolder,
)
from uniagent.view.tokens import Tokenizers, exactness, token_page

STATIC = Path(__file__).parent / "static"
LOG_TAIL_BYTES = 512 * 1024
_FRESH_S = 0.5  # a request older than this refreshes its run first (without live events too)


class Watcher:
    """Polls the run folders while someone listens and wakes the event streams on a change.

    Polling, not inotify: it works on network filesystems (a cluster's shared disk), costs
    a few ``stat`` calls per run per tick, and needs no watch per episode folder.
    """

    def __init__(self, runs: list[RunFolder], interval: float) -> None:
        """Watch ``runs`` every ``interval`` seconds."""
        self.runs = runs
        self.interval = interval
        self.listeners = 0
        self.changed = asyncio.Event()

    async def loop(self) -> None:
        """Refresh every run each tick while a stream is open."""
        while True:
            await asyncio.sleep(self.interval)
            if self.listeners:
                for run in self.runs:
                    self.refresh(run)

    def refresh(self, run: RunFolder) -> None:
        """Refresh ``run`` (for a tick or a request) and wake the streams if it changed."""
        if run.refresh():
            self.changed.set()
            self.changed = asyncio.Event()

    async def stream(self, run: RunFolder) -> AsyncIterator[dict[str, Any]]:
        """Server-sent events for one run: ``update`` whenever its rows change, with the
        keys of the rows that changed (``null``: too many versions ago to list)."""
        self.listeners += 1
        try:
            seen: int | None = None
            while True:
                if run.version != seen:
                    changed = None if seen is None else run.changes_since(seen)
                    seen = run.version
                    yield {
                        "event": "update",
                        "data": json.dumps({**_brief(run), "changed": changed}),
                    }
                await self.changed.wait()
        finally:
            self.listeners -= 1


def _brief(run: RunFolder) -> dict[str, Any]:
    rows = list(run.rows.values())
    counts: dict[str, int] = {}
    for row in rows:
        counts[row.status] = counts.get(row.status, 0) + 1
    return {**run.info(), "status": counts}


class _FileCache:
    """The last few values computed from files, keyed by path and modification time
    (a rewritten file is read again); used from worker threads."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: OrderedDict[tuple[str, int], Any] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, path: Path, compute: Callable[[], Any]) -> Any:
        try:
            key = (str(path), path.stat().st_mtime_ns)
        except OSError:
            return None
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
        value = compute()  # outside the lock: a re-render can take a second
        with self._lock:
            self._items[key] = value
            while len(self._items) > self.size:
                self._items.popitem(last=False)
        return value


def create_app(
    runs: list[RunFolder],
    *,
    tokenizer: str | None = None,
    poll_interval: float = 0.5,
    allowed_hosts: list[str] | None = None,
) -> Starlette:
    """The Starlette app serving ``runs`` (their order gives their ids: 0, 1, ...)."""
    if not runs:
        raise ConfigError("uniagent view needs at least one run folder")
    watcher = Watcher(runs, poll_interval)
    tokenizers = Tokenizers(tokenizer)
    rollouts = _FileCache(8)
    reports = _FileCache(64)

    def get_run(request: Request) -> RunFolder:
        value = request.path_params.get("run", request.query_params.get("run", "0"))
        if not str(value).isdigit() or int(value) >= len(runs):
            raise NotFound(f"no run {value!r}; there are {len(runs)} (ids 0 to {len(runs) - 1})")
        run = runs[int(value)]
        if _stale(run):
            watcher.refresh(run)
        return run

    def number(request: Request, name: str, default: int) -> int:
        value = request.query_params.get(name)
        if value is None or value == "":
            return default
        if not value.lstrip("-").isdigit():
            raise ConfigError(f"{name}: expected a whole number, got {value!r}")
        return int(value)

    def key_of(request: Request) -> str:
        key = request.query_params.get("key")
        if not key:
            raise ConfigError("key: the episode folder, as the runs table gives it")
        return key

    def load_rollout(run: RunFolder, key: str) -> dict[str, Any] | None:
        path = run.path(key, ROLLOUT)
        value = rollouts.get(path, lambda: run.read_json(key, ROLLOUT))
        return value if isinstance(value, dict) else None

    async def home(request: Request) -> Response:
        return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})

    async def list_runs(request: Request) -> Response:
        for run in runs:
            if _stale(run):
                watcher.refresh(run)
        return JSONResponse(
            {
                "runs": [{"id": i, **_brief(run)} for i, run in enumerate(runs)],
                "infra_exits": sorted(INFRA_EXITS),
            }
        )

    async def episodes(request: Request) -> Response:
        run = get_run(request)
        result = index.page(
            run.rows.values(),
            index.Filters.from_params(request.query_params),
            sort=request.query_params.get("sort") or "order",
            descending=request.query_params.get("order") == "desc",
            offset=number(request, "offset", 0),
            limit=number(request, "limit", 50),
        )
        return JSONResponse({**result, "run": run.info()})

    async def summary(request: Request) -> Response:
        run = get_run(request)
        filters = index.Filters.from_params(request.query_params)
        rows = [r for r in run.rows.values() if filters.match(r)]
        return JSONResponse(
            {**index.stats(rows, n=run.samples_per_task), "run": run.info(), "saved": run.summary}
        )

    async def episode(request: Request) -> Response:
        run = get_run(request)
        key = key_of(request)
        row = run.row(key)
        messages = run.read_json(key, MESSAGES)
        rollout = None
        if not isinstance(messages, list):
            rollout = load_rollout(run, key)
            messages = (rollout or {}).get("messages") if rollout else None
        return JSONResponse(
            {
                "row": row.to_json(),
                "record": run.record(key),
                "messages": messages if isinstance(messages, list) else None,
                "files": run.files(key),
                "run": run.info(),
            }
        )

    async def tokens(request: Request) -> Response:
        run = get_run(request)
        key = key_of(request)
        run.row(key)
        rollout = await run_in_threadpool(load_rollout, run, key)
        if rollout is None:
            return JSONResponse({"available": False, "reason": "this episode has no rollout.json"})
        decoder, why = (None, "")
        if rollout.get("mode") == "tokens":
            decoder, why = await run_in_threadpool(tokenizers.get, rollout.get("tokenizer"))
        page = await run_in_threadpool(
            token_page,
            rollout,
            decoder,
            offset=number(request, "offset", 0),
            limit=number(request, "limit", 4000),
        )
        page["tokenizer_note"] = None if decoder is not None else why
        return JSONResponse(page)

    async def exactness_report(request: Request) -> Response:
        run = get_run(request)
        key = key_of(request)
        run.row(key)
        rollout = await run_in_threadpool(load_rollout, run, key)
        if rollout is None or rollout.get("mode") != "tokens":
            return JSONResponse({"available": False, "reason": "no token-mode rollout"})
        decoder, why = await run_in_threadpool(tokenizers.get, rollout.get("tokenizer"))
        if decoder is None:
            return JSONResponse({"available": False, "reason": why})

        def check() -> dict[str, Any]:
            try:
                return {"available": True, **exactness(rollout, decoder)}
            except Exception as exc:  # a wrong tokenizer, a malformed snapshot: say so
                return {
                    "available": False,
                    "reason": f"the check failed: {type(exc).__name__}: {exc}",
                }

        path = run.path(key, ROLLOUT)
        report = await run_in_threadpool(reports.get, path, check)
        return JSONResponse(report or {"available": False, "reason": "rollout.json is gone"})

    async def log(request: Request) -> Response:
        run = get_run(request)
        key = key_of(request)
        name = request.query_params.get("name") or "log.txt"
        text, size = run.read_text(key, name, tail=LOG_TAIL_BYTES)
        return JSONResponse(
            {"name": name, "text": text, "size": size, "truncated": size > LOG_TAIL_BYTES}
        )

    async def events(request: Request) -> Response:
        run = get_run(request)
        return EventSourceResponse(watcher.stream(run), ping=15)

    async def compare(request: Request) -> Response:
        a = get_run_by(request, "a")
        b = get_run_by(request, "b")
        result = index.compare(
            a.rows.values(),
            b.rows.values(),
            q=request.query_params.get("q") or "",
            change=request.query_params.get("change") or "",
            offset=number(request, "offset", 0),
            limit=number(request, "limit", 50),
        )
        return JSONResponse({**result, "a": a.info(), "b": b.info()})

    def get_run_by(request: Request, name: str) -> RunFolder:
        value = request.query_params.get(name)
        if value is None or not value.isdigit() or int(value) >= len(runs):
            raise NotFound(f"{name}: no run {value!r}; there are {len(runs)}")
        run = runs[int(value)]
        if _stale(run):
            watcher.refresh(run)
        return run

    async def not_found(request: Request, exc: Exception) -> Response:
        return JSONResponse({"error": str(exc)}, status_code=404)

    async def forbidden(request: Request, exc: Exception) -> Response:
        return JSONResponse({"error": str(exc)}, status_code=403)

    async def bad_request(request: Request, exc: Exception) -> Response:
        return JSONResponse({"error": str(exc)}, status_code=400)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        task = asyncio.create_task(watcher.loop())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    routes = [
        Route("/", home),
        Route("/api/runs", list_runs),
        Route("/api/runs/{run}/episodes", episodes),
        Route("/api/runs/{run}/summary", summary),
        Route("/api/runs/{run}/episode", episode),
        Route("/api/runs/{run}/episode/tokens", tokens),
        Route("/api/runs/{run}/episode/exactness", exactness_report),
        Route("/api/runs/{run}/episode/log", log),
        Route("/api/runs/{run}/events", events),
        Route("/api/compare", compare),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    middleware = [Middleware(TrustedHostMiddleware, allowed_hosts=allowed_hosts or ["*"])]
    app = Starlette(
        routes=routes,
        middleware=middleware,
        lifespan=lifespan,
        exception_handlers={
            OutsideRunFolder: forbidden,
            NotFound: not_found,
            ConfigError: bad_request,
        },
    )
    app.state.runs = runs
    app.state.watcher = watcher
    return app


def _stale(run: RunFolder) -> bool:
    return time.monotonic() - run.refreshed_at > _FRESH_S
