"""The web app of ``uniagent view``: a JSON API over run folders, live events, the page.

Read-only by construction: there are only GET routes, and every episode file is reached
through :class:`~uniagent.view.access.EpisodeFiles`, which refuses paths outside its folder.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
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
from starlette.requests import Request
from starlette.responses import FileResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from uniagent.errors import ConfigError
from uniagent.run.layout import LOG, MESSAGES, RESULT, ROLLOUT
from uniagent.view import index
from uniagent.view.access import EpisodeFiles, OutsideRunFolder, StaleIndex
from uniagent.view.branches import branch_rollout, branches, tree_leaves, tree_shape
from uniagent.view.catalog import Catalog
from uniagent.view.files import Unreadable
from uniagent.view.row import INFRA_EXITS
from uniagent.view.rundir import NotFound, RunFolder
from uniagent.view.security import Guard, host_names
from uniagent.view.tokens import Tokenizers, exactness, token_page

try:  # NaN-safe and faster; the view extra brings it
    import orjson
except ImportError:  # pragma: no cover
    orjson = None  # type: ignore[assignment]

STATIC = Path(__file__).parent / "static"
LOG_TAIL_BYTES = 512 * 1024
_FRESH_S = 0.5  # a request older than this refreshes its run first (without live events too)


class Watcher:
    """Polls the run folders while someone listens and wakes the event streams on a change.

    Polling, not inotify: it works on network filesystems (a cluster's shared disk), costs
    a few ``stat`` calls per run per tick, and needs no watch per episode folder. Runs are
    refreshed, and folders of runs looked into for new ones, in worker threads (their file
    reads never block the event loop); the wake-up comes back to the loop.
    """

    def __init__(self, runs: list[RunFolder] | Catalog, interval: float) -> None:
        """Watch ``runs`` every ``interval`` seconds."""
        self.catalog = runs if isinstance(runs, Catalog) else Catalog.of(runs)
        self.interval = interval
        self.listeners = 0
        self._changed = asyncio.Event()  # set, then replaced, at every change
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def runs(self) -> list[RunFolder]:
        """The runs on show (their ids are their positions)."""
        return self.catalog.runs

    async def loop(self) -> None:
        """Look for new runs and refresh every run each tick while a stream is open."""
        self._loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.interval)
            if self.listeners:
                await run_in_threadpool(self.rescan)
                for run in list(self.runs):
                    await run_in_threadpool(self.refresh, run)

    def refresh(self, run: RunFolder) -> bool:
        """Refresh ``run`` (from any thread) and wake the streams if it changed."""
        changed = run.refresh()
        if changed:
            self._wake_soon()
        return changed

    def rescan(self) -> bool:
        """Look for new runs (from any thread) and wake the streams if one appeared."""
        added = self.catalog.rescan()
        if added:
            self._wake_soon()
        return added

    def _wake_soon(self) -> None:
        loop = self._loop
        if loop is None:
            return  # no stream has started: none is waiting
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            self._wake()
        else:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                loop.call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def stream(self, run: RunFolder) -> AsyncIterator[dict[str, Any]]:
        """Server-sent events for one run: ``update`` whenever its rows change, with the
        keys of the rows that changed (``null``: too many versions ago to list), or when
        the runs on show change (a new run appeared: ``runs_version`` tells)."""
        self._loop = asyncio.get_running_loop()
        self.listeners += 1
        try:
            seen: tuple[int, int] | None = None
            while True:
                # Taken before the versions are read, and nothing is awaited in between: a
                # change after the read wakes this very event, so none is missed (also
                # one made while the last update was being sent).
                waiter = self._changed
                current = (run.version, self.catalog.version)
                if current != seen:
                    changed = None if seen is None else run.changes_since(seen[0])
                    seen = current
                    info = {**_brief(run), "changed": changed, "runs_version": current[1]}
                    yield {"event": "update", "data": json.dumps(info)}
                    continue
                await waiter.wait()
        finally:
            self.listeners -= 1


def _brief(run: RunFolder) -> dict[str, Any]:
    rows = list(run.rows.values())
    counts: dict[str, int] = {}
    for row in rows:
        counts[row.status] = counts.get(row.status, 0) + 1
    return {**run.info(), "status": counts}


class _FileCache:
    """The last few values computed from files, keyed by path, inode, size and modification
    time (a file rewritten in place is read again); used from worker threads."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: OrderedDict[tuple[str, int, int, int], Any] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, path: Path, compute: Callable[[], Any]) -> Any:
        try:
            st = path.stat()
        except OSError:
            return compute()  # gone: let the reader say what is (not) there
        key = (str(path), st.st_ino, st.st_size, st.st_mtime_ns)
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


class JSON(Response):
    """A JSON response, by orjson where it is installed: NaN and infinities (which a
    results file may hold) become ``null`` instead of failing the request."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        """``content`` as JSON bytes."""
        if orjson is not None:
            try:
                return orjson.dumps(content, option=orjson.OPT_NON_STR_KEYS, default=str)
            except TypeError:  # an integer past 64 bits: json writes those
                pass
        return json.dumps(
            _finite(content), ensure_ascii=False, separators=(",", ":"), default=str
        ).encode("utf-8")


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def create_app(
    runs: list[RunFolder] | Catalog,
    *,
    tokenizer: str | None = None,
    poll_interval: float = 0.5,
    host: str = "127.0.0.1",
) -> Starlette:
    """The Starlette app serving ``runs`` (their order gives their ids: 0, 1, ...; a
    catalog adds the runs that start later in its folders of runs), bound to ``host``
    (which decides the ``Host`` names it answers, see :mod:`.security`).

    The handlers that read files are plain functions: Starlette runs them in its thread
    pool, so a large file or a slow disk never holds up the event loop.
    """
    watcher = Watcher(runs, poll_interval)
    catalog = watcher.catalog
    if not catalog.runs:
        raise ConfigError("uniagent view needs at least one run folder")
    tokenizers = Tokenizers(tokenizer)
    rollouts = _FileCache(8)
    reports = _FileCache(64)

    def run_by_id(value: Any, name: str = "run") -> RunFolder:
        text = str(value)
        shown = catalog.runs
        if not (text.isascii() and text.isdigit()) or int(text) >= len(shown):
            raise NotFound(
                f"{name}: no run {value!r}; there are {len(shown)} (ids 0 to {len(shown) - 1})"
            )
        return shown[int(text)]

    def get_run(request: Request) -> RunFolder:
        run = run_by_id(request.path_params.get("run", request.query_params.get("run", "0")))
        if _stale(run):
            watcher.refresh(run)
        return run

    def number(request: Request, name: str, default: int) -> int:
        value = request.query_params.get(name)
        if value is None or value == "":
            return default
        try:
            if not value.isascii():
                raise ValueError(value)
            return int(value)
        except ValueError:
            raise ConfigError(f"{name}: expected a whole number, got {value!r}") from None

    def key_of(request: Request) -> str:
        key = request.query_params.get("key")
        if not key:
            raise ConfigError("key: the episode folder, as the runs table gives it")
        return key

    def load_rollout(run: RunFolder, key: str) -> tuple[dict[str, Any] | None, str]:
        """The episode's rollout, or None and why there is none."""
        episode_files = EpisodeFiles(run)
        path = episode_files.path(key, ROLLOUT)

        def load() -> tuple[dict[str, Any] | None, str]:
            try:
                value = episode_files.load_json(key, ROLLOUT)
            except Unreadable as exc:
                return None, str(exc)
            if value is None:
                return None, "this episode has no rollout.json"
            if not isinstance(value, dict):
                return None, "rollout.json does not hold an object"
            return value, ""

        return rollouts.get(path, load)

    async def home(request: Request) -> Response:
        return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})

    def list_runs(request: Request) -> Response:
        if time.monotonic() - catalog.scanned_at > _FRESH_S:
            watcher.rescan()
        shown = list(catalog.runs)
        for run in shown:
            if _stale(run):
                watcher.refresh(run)
        return JSON(
            {
                "runs": [{"id": i, **_brief(run)} for i, run in enumerate(shown)],
                "runs_version": catalog.version,
                "infra_exits": sorted(INFRA_EXITS),
            }
        )

    def episodes(request: Request) -> Response:
        run = get_run(request)
        result = index.page(
            run.rows.values(),
            index.Filters.from_params(request.query_params),
            sort=request.query_params.get("sort") or "order",
            descending=request.query_params.get("order") == "desc",
            offset=number(request, "offset", 0),
            limit=number(request, "limit", 50),
        )
        return JSON({**result, "run": run.info()})

    def summary(request: Request) -> Response:
        run = get_run(request)
        filters = index.Filters.from_params(request.query_params)
        rows = [r for r in run.rows.values() if filters.match(r)]
        return JSON(
            {**index.stats(rows, n=run.samples_per_task), "run": run.info(), "saved": run.summary}
        )

    def episode(request: Request) -> Response:
        run = get_run(request)
        episode_files = EpisodeFiles(run)
        key = key_of(request)
        errors: dict[str, str] = {}  # files that are there but cannot be shown, and why

        def load(name: str) -> Any:
            try:
                return episode_files.load_json(key, name)
            except Unreadable as exc:
                errors[name] = str(exc)
                return None

        row = run.row(key)
        messages = load(MESSAGES)
        if messages is not None and not isinstance(messages, list):
            errors[MESSAGES] = "messages.json does not hold a list of messages"
        if not isinstance(messages, list):
            rollout, why = load_rollout(run, key)
            if rollout is not None:
                messages = rollout.get("messages")
            elif why and not why.startswith("this episode has no"):
                errors[ROLLOUT] = why
        record = load(RESULT)
        if not isinstance(record, dict):
            try:
                record = episode_files.results_record(key)
            except StaleIndex:  # the results file changed under the index: look again
                watcher.refresh(run)
                record = episode_files.results_record(key) if key in run.rows else None
        rollout, _ = load_rollout(run, key)
        return JSON(
            {
                "row": run.row(key).to_json() if key in run.rows else row.to_json(),
                "record": record,
                "messages": messages if isinstance(messages, list) else None,
                "tools": _tools(rollout, record),
                "tree": _tree(rollout, record),
                "files": episode_files.listing(key),
                "errors": errors,
                "run": run.info(),
            }
        )

    def tokens(request: Request) -> Response:
        run = get_run(request)
        key = key_of(request)
        run.row(key)
        offset = number(request, "offset", 0)
        limit = number(request, "limit", 4000)
        rollout, why = load_rollout(run, key)
        if rollout is None:
            return JSON({"available": False, "reason": why})
        branch = request.query_params.get("branch")
        decoder, note = (None, "")
        if rollout.get("mode") == "tokens":
            decoder, note = tokenizers.get(_str_or_none(rollout.get("tokenizer")))
        try:
            listed = branches(rollout)
            shown = (
                rollout if branch is None else branch_rollout(rollout, number(request, "branch", 0))
            )
            page = token_page(shown, decoder, offset=offset, limit=limit)
        except ConfigError:
            raise
        except Exception as exc:  # a malformed rollout: say so for this episode
            return JSON({"available": False, "reason": _broken(exc)})
        page["tokenizer_note"] = None if decoder is not None else note
        # A harness episode's tree: its branches (the default view is the main one).
        page["branches"] = listed
        page["branch"] = None if branch is None else number(request, "branch", 0)
        return JSON(page)

    def exactness_report(request: Request) -> Response:
        run = get_run(request)
        key = key_of(request)
        run.row(key)
        rollout, why = load_rollout(run, key)
        if rollout is None or rollout.get("mode") != "tokens":
            return JSON({"available": False, "reason": why or "no token-mode rollout"})
        decoder, why = tokenizers.get(_str_or_none(rollout.get("tokenizer")))
        if decoder is None:
            return JSON({"available": False, "reason": why})

        def check() -> dict[str, Any]:
            try:
                return {"available": True, **exactness(rollout, decoder)}
            except Exception as exc:  # a wrong tokenizer, a malformed snapshot: say so
                return {"available": False, "reason": f"the check failed: {_broken(exc)}"}

        report = reports.get(EpisodeFiles(run).path(key, ROLLOUT), check)
        return JSON(report or {"available": False, "reason": "rollout.json is gone"})

    def log(request: Request) -> Response:
        run = get_run(request)
        key = key_of(request)
        name = request.query_params.get("name") or LOG
        text, size = EpisodeFiles(run).read_text(key, name, tail=LOG_TAIL_BYTES)
        return JSON({"name": name, "text": text, "size": size, "truncated": size > LOG_TAIL_BYTES})

    async def events(request: Request) -> Response:
        run = run_by_id(request.path_params.get("run"))
        if _stale(run):
            await run_in_threadpool(watcher.refresh, run)
        return EventSourceResponse(watcher.stream(run), ping=15)

    def compare(request: Request) -> Response:
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
        return JSON({**result, "a": a.info(), "b": b.info()})

    def get_run_by(request: Request, name: str) -> RunFolder:
        run = run_by_id(request.query_params.get(name), name)
        if _stale(run):
            watcher.refresh(run)
        return run

    def error(status: int) -> Callable[[Request, Exception], Any]:
        async def handler(request: Request, exc: Exception) -> Response:
            return JSON({"error": str(exc)}, status_code=status)

        return handler

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
    app = Starlette(
        routes=routes,
        middleware=[Middleware(Guard, names=host_names(host))],
        lifespan=lifespan,
        exception_handlers={
            OutsideRunFolder: error(403),
            NotFound: error(404),
            ConfigError: error(400),
            StaleIndex: error(409),
        },
    )
    app.state.runs = catalog.runs
    app.state.catalog = catalog
    app.state.watcher = watcher
    return app


def _tools(rollout: dict[str, Any] | None, record: Any) -> list[dict[str, Any]] | None:
    """The tools the model saw (the rollout's schemas), each with its MCP server or None."""
    listed = rollout.get("tools") if rollout is not None else None
    if not isinstance(listed, list):
        return None
    servers = record.get("tool_servers") if isinstance(record, dict) else None
    servers = servers if isinstance(servers, dict) else {}
    tools = []
    for entry in listed:
        function = entry.get("function") if isinstance(entry, dict) else None
        if not isinstance(function, dict):
            continue
        name = str(function.get("name", ""))
        tools.append(
            {
                "name": name,
                "description": function.get("description") or "",
                "parameters": function.get("parameters") or {},
                "server": servers.get(name),
            }
        )
    return tools


def _tree(rollout: dict[str, Any] | None, record: Any) -> dict[str, Any] | None:
    """A tree rollout's shape for the Tree tab (None for any other episode): its leaves and
    splits as ``rollout.json`` saves them, else its leaves as ``result.json`` lists them
    (without the splits' turns); each leaf with its grader's score reason, if any."""
    try:
        leaves = tree_leaves(rollout) if rollout is not None else None
        rows = record.get("leaf_rows") if isinstance(record, dict) else None
        rows = [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []
        splits: list[Any] = []
        if leaves is not None:
            splits = (rollout or {})["tree"].get("splits") or []
        elif rows:
            leaves = [
                {
                    "leaf": r.get("leaf"),
                    "branch": r.get("branch"),
                    "node": None,
                    "exit_reason": r.get("exit_reason"),
                    "traj_masked": r.get("traj_masked"),
                    "reward": r.get("reward"),
                    "turns": (r.get("metrics") or {}).get("turns"),
                }
                for r in rows
            ]
        else:
            return None
        reasons = {
            str(r.get("leaf")): (r.get("reward_info") or {}).get("score_reason") for r in rows
        }
        leaves = [{**leaf, "score_reason": reasons.get(str(leaf.get("leaf")))} for leaf in leaves]
        return {
            "leaves": len(leaves),
            "splits": splits if isinstance(splits, list) else [],
            "tokens": any(isinstance(leaf.get("node"), int) for leaf in leaves),
            "root": tree_shape(leaves, splits if isinstance(splits, list) else []),
        }
    except (TypeError, ValueError, AttributeError, KeyError):  # a malformed record: no tree
        return None


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _broken(exc: Exception) -> str:
    return f"rollout.json is malformed ({type(exc).__name__}: {str(exc)[:200]})"


def _stale(run: RunFolder) -> bool:
    return time.monotonic() - run.refreshed_at > _FRESH_S
