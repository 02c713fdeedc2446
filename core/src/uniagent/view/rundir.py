"""The index of a run folder: which episodes it has and what state each is in.

What ``uniagent run`` writes, and where, is :mod:`uniagent.run.layout`'s to say; what the
manifest, results and summary hold (read here)::

    manifest.json   at each start: run_id, started_at (resumed_at: later starts), n,
                    pid and pid_start, host, jobs [[task_id, sample], ...]
    results.jsonl   one record per finished episode, appended as it finishes
    summary.json    written at the end of each invocation (failed_tasks among it)
    .lock           held while a run uses the folder (from before its model loads)

Everything is optional and read tolerantly: a folder without a manifest (an older run),
unknown files and fields, a half-written last line. A folder with none of these is read
as a tree of episode folders (any folder holding ``result.json``, ``messages.json`` or
``rollout.json``), which is how training dumps lay them out.

Nothing here writes, and every file read is a regular file inside the run folder after
symlinks are resolved (see :mod:`uniagent.view.files`); reading an episode's own files
for a page is :mod:`uniagent.view.access`.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from uniagent.errors import UniAgentError
from uniagent.run.layout import (
    EPISODE_MARKERS,
    EPISODES,
    LOCK,
    MANIFEST,
    RESULT,
    RESULTS,
    SUMMARY,
    TASK_ERROR,
    attempt_log,
    episode_key,
    is_run_folder,
    key_of_episode_dir,
)
from uniagent.view import liveness
from uniagent.view.files import (
    OutsideFolder,
    ResultsTail,
    contained,
    inside,
    loads,
    read_json_object,
    signature,
)
from uniagent.view.row import (
    ERROR_CHARS,
    Row,
    as_int,
    as_str,
    row_from_record,
    tree_row,
)

RunState = Literal["live", "finished", "interrupted", "unknown"]

_TREE_DEPTH = 8  # how deep a tree of episode folders is searched
_TREE_RESCAN_S = 2.0  # a tree has no results file to tail: rescan it at most this often
_CHANGES_KEPT = 64  # versions whose changed rows are remembered, for the live events


class ViewError(UniAgentError):
    """A request ``uniagent view`` cannot answer (the message says why)."""


class NotFound(ViewError, LookupError):
    """No such run, episode or file."""


def job_key(task_id: str, sample: int) -> str:
    """Where ``uniagent run`` puts a job's folder, relative to the run folder."""
    return episode_key(task_id, sample)


def record_key(record: dict[str, Any]) -> str:
    """The episode folder of a results record, relative to the run folder."""
    key = key_of_episode_dir(str(record.get("episode_dir") or ""))
    return key or job_key(str(record.get("task_id")), as_int(record.get("sample")) or 0)


class RunFolder:
    """One run folder (or tree of episode folders), indexed and kept current by :meth:`refresh`."""

    def __init__(self, root: Path, name: str | None = None) -> None:
        """Index ``root``; raises :class:`NotFound` if it is not a folder."""
        if not root.is_dir():
            raise NotFound(f"{root} is not a folder")
        self.root = root.resolve()
        self.name = name or self.root.name
        self.kind: Literal["run", "tree"] = "run" if is_run_folder(self.root) else "tree"
        self.manifest: dict[str, Any] | None = None
        self.summary: dict[str, Any] | None = None
        self.rows: dict[str, Row] = {}
        self.version = 0  # bumped whenever a row changes
        self.state: RunState = "unknown"
        self.refreshed_at = 0.0
        self._lock = threading.Lock()  # refreshes come from worker threads
        self._sigs: dict[str, tuple[int, ...] | None] = {}
        self._done: dict[str, Row] = {}
        self._results = ResultsTail()
        self._dirs: set[str] = set()
        self._jobs: list[tuple[str, int, str]] = []
        self._since_ns: int | None = None  # when the invocation that is (or was) running began
        self._manifest_since: int | None = None  # when the one that wrote the manifest began
        self._lock_seen: tuple[int, ...] | None = None  # the lock file as last looked at
        self._lock_held = False  # whether a run held it then
        self._task_errors: dict[str, str | None] = {}  # started jobs whose task cannot start
        self._reruns_seen: set[str] = set()
        self._failed: dict[str, int] = {}  # infrastructure failures on record: their attempt
        self._planned: set[str] = set()
        self.unreadable_lines = 0  # results lines that are not a JSON record
        self._tree_scanned = 0.0
        self._changes: dict[int, list[str]] = {}
        self.refresh()

    # ----------------------------------------------------------------- reading

    def refresh(self) -> bool:
        """Pick up what changed on disk since the last call; True when a row changed."""
        with self._lock:
            self.refreshed_at = time.monotonic()
            old = self.rows
            if self.kind == "tree" and not self.rows and is_run_folder(self.root):
                self.kind = "run"  # an empty folder a run has started writing into
            changed = self._refresh_tree() if self.kind == "tree" else self._refresh_run()
            if changed:
                keys = [k for k, r in self.rows.items() if _differs(old.get(k), r)]
                keys += [k for k in old if k not in self.rows]
                self._changes[self.version + 1] = keys
                self._changes.pop(self.version + 1 - _CHANGES_KEPT, None)
                self.version += 1  # last: a reader that sees the version sees its changes
            return changed

    def changes_since(self, version: int) -> list[str] | None:
        """Keys of the rows that changed after ``version``; None when too long ago to tell."""
        current = self.version
        if version >= current:
            return []
        keys: set[str] = set()
        for v in range(version + 1, current + 1):
            if v not in self._changes:
                return None
            keys.update(self._changes[v])
        return sorted(keys)

    def _top(self, name: str) -> Path | None:
        """A file at the top of the run folder, unless it is a link out of it."""
        return contained(self.root, self.root / name)

    def _refresh_run(self) -> bool:
        dirty = self.version == 0  # the first look builds the rows, even if there are none
        if self._changed(MANIFEST):
            dirty = True
            path = self._top(MANIFEST)
            self.manifest = read_json_object(path) if path else None
            self._jobs = []
            for job in (self.manifest or {}).get("jobs") or []:
                if isinstance(job, list | tuple) and len(job) >= 2 and as_int(job[1]) is not None:
                    task_id, sample = str(job[0]), int(job[1])
                    self._jobs.append((task_id, sample, job_key(task_id, sample)))
            self._planned = {key for _, _, key in self._jobs}
            self._manifest_since = liveness.started_ns(self.manifest, self._sigs.get(MANIFEST))
        if self._changed(SUMMARY):
            dirty = True
            path = self._top(SUMMARY)
            self.summary = read_json_object(path) if path else None
        dirty = self._read_results() or dirty
        taken = self._lock_taken()
        # A run that holds the lock but has not written its manifest yet (it is loading its
        # model) began when it took the lock; otherwise the manifest's invocation is the one.
        since = self._manifest_since
        if taken is not None and (since is None or taken > since):
            since = taken
        if since != self._since_ns or self.version == 0:
            # A new invocation (a resume) decides afresh which of its jobs have started.
            self._since_ns = since
            self._dirs = set()
            self._task_errors = {}
            dirty = True
        state = self._run_state(held=taken is not None)
        dirty = dirty or state != self.state
        self.state = state
        if self.manifest is None:
            # Without a manifest (an older run folder, or one whose manifest is not
            # written yet) the episode folders are the plan; new ones may still appear.
            if dirty or state == "unknown":
                found = set(self._scan_episode_dirs()) - self._dirs
                dirty = dirty or bool(found)
                self._dirs |= found
        elif dirty or state in ("live", "unknown"):
            started = self._started_jobs()
            dirty = dirty or bool(started)
            self._dirs |= started
            dirty = self._find_task_errors() or dirty
            reruns = self._reruns() if state in ("live", "unknown") else set()
            dirty = dirty or reruns != self._reruns_seen
            self._reruns_seen = reruns
        elif self._reruns_seen:  # the run ended: its rows are the results again
            self._reruns_seen = set()
            dirty = True
        if dirty:
            self._merge()
        return dirty

    def _lock_taken(self) -> int | None:
        """When the run that holds the folder's lock took it (ns), None when none holds it.

        ``/proc/locks`` is read only while the lock is held, or after the lock file changed
        (a run that takes it rewrites it): a finished run costs one ``stat``.
        """
        path = self._top(LOCK)
        sig = signature(path)
        if sig is None or path is None:
            self._lock_seen, self._lock_held = sig, False
            return None
        if sig != self._lock_seen or self._lock_held:
            self._lock_seen, self._lock_held = sig, liveness.lock_held(path)
        return sig[2] if self._lock_held else None

    def _find_task_errors(self) -> bool:
        """Started jobs without a result whose task could not start: True if new ones."""
        found = False
        for key in self._dirs:
            if key in self._done or key in self._task_errors:
                continue
            if not os.path.lexists(self.root / key / TASK_ERROR):
                continue
            try:  # the episode folder may be a link: read only what stays in the run folder
                path = inside(self.root, f"{key}/{TASK_ERROR}")
            except OutsideFolder:
                continue
            error = (read_json_object(path) or {}).get("error")
            self._task_errors[key] = as_str(error) or "the task could not start"
            found = True
        return found

    def _reruns(self) -> set[str]:
        """Planned jobs with an infrastructure failure on record that a later attempt is
        running (a retry or a resume): their recorded attempt's log was moved aside."""
        found = set()
        for key, attempt in self._failed.items():  # a stat per failure, not per job
            if key in self._planned and os.path.lexists(self.root / key / attempt_log(attempt)):
                found.add(key)
        return found

    def _started_jobs(self) -> set[str]:
        """Planned jobs that this invocation started since the last look (queued -> running).

        A folder left by an earlier invocation that was interrupted (the run is being
        resumed) counts only once this one writes into it.
        """
        waiting: dict[str, list[str]] = {}
        for _, _, key in self._jobs:
            if key not in self._done and key not in self._dirs:
                _, task, sample = key.split("/")
                waiting.setdefault(task, []).append(sample)
        if not waiting:
            return set()
        # One listing of episodes/ and one per task folder, not a stat per job.
        found: set[str] = set()
        for task in {e.name for e in _scandir(self.root / EPISODES)} & waiting.keys():
            samples = {e.name for e in _scandir(self.root / EPISODES / task)}
            for sample in waiting[task]:
                key = f"{EPISODES}/{task}/{sample}"
                if sample in samples and liveness.touched_since(self.root / key, self._since_ns):
                    found.add(key)
        return found

    def _changed(self, name: str) -> bool:
        sig = signature(self._top(name))
        if self._sigs.get(name, ()) == sig:
            return False
        self._sigs[name] = sig
        return True

    def _read_results(self) -> bool:
        """Read what was appended to results.jsonl; reread it whole if it was replaced."""
        batch = self._results.poll(self._top(RESULTS))
        if batch is None:
            return False
        if batch.reset:
            self._done = {}
            self.unreadable_lines = 0
        for offset, line in batch.lines:
            try:
                record = loads(line)
            except ValueError:
                self.unreadable_lines += 1  # no key to show it under: counted instead
                continue
            if isinstance(record, dict) and "task_id" in record:
                key = record_key(record)
                try:
                    row = row_from_record(record, key, len(self._done), offset)
                except Exception as exc:  # a record of the wrong shape: its row says so
                    row = Row(
                        key=key,
                        task_id=str(record.get("task_id")),
                        sample=as_int(record.get("sample")),
                        order=len(self._done),
                        status="failed",
                        error=f"its results record could not be read: {type(exc).__name__}",
                        offset=offset,
                    )
                self._done[key] = self._with_leaf(self._done.get(key), row, record)
            elif line.strip():
                self.unreadable_lines += 1
        self._failed = {
            k: r.attempt for k, r in self._done.items() if r.status == "failed" and r.attempt
        }
        return True

    @staticmethod
    def _with_leaf(before: Row | None, row: Row, record: dict[str, Any]) -> Row:
        """The row of ``key`` after the line that made ``row``: a tree rollout writes a line
        per leaf (``leaf_index`` 0, 1, ...): the first starts its row, the next ones join
        it (the same attempt's); any other line replaces what was there."""
        index = as_int(record.get("leaf_index"))
        if index is None:
            return row
        if index > 0 and before is not None and before.leaves and before.attempt == row.attempt:
            return tree_row((*before.leaves, row))
        return tree_row((row,))

    def _run_state(self, *, held: bool) -> RunState:
        if held:  # a run uses the folder now (perhaps still loading its model)
            return "live"
        manifest_sig = self._sigs.get(MANIFEST)
        summary_sig = self._sigs.get(SUMMARY)
        if self.manifest is None:
            return "finished" if summary_sig else "unknown"
        if summary_sig and manifest_sig and summary_sig[2] >= manifest_sig[2]:
            # The summary is written however the run ends: Ctrl-C and the circuit
            # breaker leave episodes unrun, which a resume runs.
            status = (self.summary or {}).get("status")
            return "interrupted" if status in ("interrupted", "stopped") else "finished"
        pid, host = as_int(self.manifest.get("pid")), self.manifest.get("host")
        if pid is None or host != socket.gethostname():
            return "unknown"  # another machine's run: assume it goes on
        alive = liveness.owner_alive(pid, self.manifest.get("pid_start"))
        return "live" if alive else "interrupted"

    def _merge(self) -> None:
        """Rebuild the rows: the plan in order, then episodes the plan does not name."""
        ended = self.state in ("finished", "interrupted")
        failed: dict[str, str | None] = {}
        if ended and self.summary:  # tasks that could not even start
            for item in self.summary.get("failed_tasks") or []:
                if isinstance(item, dict):
                    key = job_key(str(item.get("task_id")), as_int(item.get("sample")) or 0)
                    failed[key] = as_str(item.get("error"))
        plan = list(self._jobs)
        planned = {key for _, _, key in plan}
        extra = sorted(
            (self._dirs | set(self._done)) - planned,
            key=lambda k: (self._done[k].order if k in self._done else len(self._done), k),
        )
        for key in extra:
            if key in self._done:
                plan.append((self._done[key].task_id, self._done[key].sample or 0, key))
            else:
                task, _, number = key.removeprefix(EPISODES + "/").rpartition("/")
                plan.append((task or key, as_int(number) or 0, key))
        rows: dict[str, Row] = {}
        for task_id, sample, key in plan:
            if key in rows:
                continue
            row = self._done.get(key)
            if row is not None and key in self._reruns_seen:
                row = dataclasses.replace(row, status="running")
            if row is None:
                row = Row(key=key, task_id=task_id, sample=sample, order=0)
                if key in self._task_errors or key in failed:
                    row.status = "failed"
                    error = self._task_errors.get(key) or failed.get(key)
                    row.error = (error or "")[:ERROR_CHARS] or None
                elif key in self._dirs:
                    row.status = "interrupted" if ended else "running"
            row.order = len(rows)
            rows[key] = row
        self.rows = rows

    def _scan_episode_dirs(self) -> Iterator[str]:
        """Folders ``episodes/<task>/<sample>`` (for run folders without a manifest)."""
        base = self.root / EPISODES
        for task in _subdirs(base):
            for sample in _subdirs(task):
                yield f"{EPISODES}/{task.name}/{sample.name}"

    def _refresh_tree(self) -> bool:
        now = time.monotonic()
        if self._tree_scanned and now - self._tree_scanned < _TREE_RESCAN_S:
            return False
        self._tree_scanned = now
        changed = False
        rows: dict[str, Row] = {}
        for directory in _episode_folders(self.root):
            key = directory.relative_to(self.root).as_posix() or "."
            result = contained(self.root, directory / RESULT)
            sig = signature(result)
            old = self.rows.get(key)
            if old is not None and self._sigs.get(f"tree:{key}") == sig:
                rows[key] = old
                old.order = len(rows) - 1
                continue
            self._sigs[f"tree:{key}"] = sig
            changed = True
            record = read_json_object(result) if result and sig else None
            parent = directory.parent.relative_to(self.root).as_posix()
            if record is not None:
                row = row_from_record(record, key, len(rows), None)
                if "task_id" not in record:
                    row.task_id = parent if parent != "." else key
                leaf_rows = record.get("leaf_rows")
                if isinstance(leaf_rows, list) and leaf_rows:  # a tree rollout's leaves
                    leaves = tuple(
                        dataclasses.replace(
                            row_from_record(r, key, len(rows), None), task_id=row.task_id
                        )
                        for r in leaf_rows
                        if isinstance(r, dict)
                    )
                    row = tree_row(leaves) if leaves else row
            else:
                row = Row(
                    key=key,
                    task_id=parent if parent != "." else key,
                    sample=as_int(directory.name),
                    order=len(rows),
                    status="running",
                )
            rows[key] = row
        changed = changed or rows.keys() != self.rows.keys()
        self.rows = rows
        return changed

    # ----------------------------------------------------------------- look-ups

    def row(self, key: str) -> Row:
        """The row of episode ``key``; :class:`NotFound` for a key the index does not hold."""
        row = self.rows.get(key)
        if row is None:
            raise NotFound(f"no episode {key!r} in run {self.name!r}")
        return row

    @property
    def samples_per_task(self) -> int:
        """``n`` of the run: from the manifest or summary, else the largest sample + 1."""
        for source in (self.manifest, self.summary):
            key = "n" if source is self.manifest else "samples_per_task"
            value = as_int((source or {}).get(key))
            if value:
                return value
        return max((r.sample + 1 for r in self.rows.values() if r.sample is not None), default=1)

    def info(self) -> dict[str, Any]:
        """What the page header shows about the run."""
        manifest = self.manifest or {}
        return {
            "name": self.name,
            "root": str(self.root),
            "kind": self.kind,
            "state": self.state,
            "run_id": manifest.get("run_id"),
            "started_at": manifest.get("started_at"),
            "resumed_at": [str(t) for t in _list(manifest.get("resumed_at"))],
            "n": self.samples_per_task,
            "episodes": len(self.rows),
            "wall_seconds": (self.summary or {}).get("wall_seconds"),
            "version": self.version,
            "unreadable_lines": self.unreadable_lines,
        }


def _episode_folders(root: Path) -> Iterator[Path]:
    """Folders under ``root`` holding an episode's files, in name order, not following links."""
    stack = [(root, 0)]
    while stack:
        directory, depth = stack.pop()
        try:
            entries = sorted(os.scandir(directory), key=lambda e: e.name)
        except OSError:
            continue
        names = {e.name for e in entries if e.is_file(follow_symlinks=False)}
        if names & set(EPISODE_MARKERS):
            yield directory
            continue
        if depth < _TREE_DEPTH:
            subdirs = [e for e in entries if e.is_dir(follow_symlinks=False)]
            stack.extend(
                (Path(e.path), depth + 1) for e in reversed(subdirs) if not e.name.startswith(".")
            )


def _differs(old: Row | None, new: Row) -> bool:
    return old is None or (old.status, old.exit_reason, old.reward, len(old.leaves)) != (
        new.status,
        new.exit_reason,
        new.reward,
        len(new.leaves),
    )


def _scandir(path: Path) -> list[os.DirEntry[str]]:
    try:
        return [e for e in os.scandir(path) if e.is_dir()]
    except OSError:
        return []


def _subdirs(path: Path, follow: bool = False) -> list[Path]:
    try:
        return sorted(Path(e.path) for e in os.scandir(path) if e.is_dir(follow_symlinks=follow))
    except OSError:
        return []


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []
