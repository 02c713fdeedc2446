"""Reading a run folder: the one module of ``uniagent view`` that knows its layout.

What ``uniagent run`` writes (see ``uniagent.run.runner``)::

    manifest.json   at each start: run_id, started_at (resumed_at: later starts), n,
                    pid and pid_start, host, jobs [[task_id, sample], ...]
    results.jsonl   one record per finished episode, appended as it finishes
    summary.json    written at the end of each invocation
    episodes/<task>/<sample>/  messages.json, rollout.json, result.json, log.txt (the
                    latest attempt's), attempt-<n>.log (earlier attempts')

Everything is optional and read tolerantly: a folder without a manifest (an older run),
unknown files and fields, a half-written last line. A folder with none of these is read
as a tree of episode folders (any folder holding ``result.json``, ``messages.json`` or
``rollout.json``), which is how training dumps lay them out.

Nothing here writes: every file is opened for reading, only regular files are read, and
every path read or handed out is checked to lie inside the run folder after symlinks are
resolved (see :mod:`uniagent.view.files`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from uniagent.errors import UniAgentError
from uniagent.exit import DEFAULT_EXIT_POLICY
from uniagent.run.runner import MANIFEST, RESULTS, SUMMARY, task_dirname
from uniagent.view import files, liveness
from uniagent.view.files import (
    OutsideFolder,
    ResultsTail,
    contained,
    read_json_object,
    signature,
)
from uniagent.view.row import TIME_KEYS, Row

try:  # twice as fast on a results file of many megabytes; json does the same job
    import orjson

    def _loads(data: bytes) -> Any:
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:  # NaN, integers past 64 bits: json takes them
            return json.loads(data)

except ImportError:  # pragma: no cover - orjson comes with the view extra

    def _loads(data: bytes) -> Any:
        return json.loads(data)


RunState = Literal["live", "finished", "interrupted", "unknown"]

#: Exit reasons of infrastructure failures (masked by default): such an episode "failed";
#: any other exit reason is the policy's own outcome, so the episode "finished".
INFRA_EXITS = frozenset(r.value for r, t in DEFAULT_EXIT_POLICY.items() if t == "mask")

EPISODES = "episodes"
RESULT = "result.json"
MESSAGES = "messages.json"
ROLLOUT = "rollout.json"
EPISODE_MARKERS = (RESULT, MESSAGES, ROLLOUT)
# log.txt is the latest attempt's; attempt-<n>.log earlier ones (log.<name>.txt: older runs)
_LOG = re.compile(r"log(\.[A-Za-z0-9_-]{1,64})?\.txt|attempt-[0-9]{1,9}\.log")
_TREE_DEPTH = 8  # how deep a tree of episode folders is searched
_TREE_RESCAN_S = 2.0  # a tree has no results file to tail: rescan it at most this often
_ERROR_CHARS = 300
_CHANGES_KEPT = 64  # versions whose changed rows are remembered, for the live events


class ViewError(UniAgentError):
    """A request ``uniagent view`` cannot answer (the message says why)."""


class NotFound(ViewError, LookupError):
    """No such run, episode or file."""


class OutsideRunFolder(ViewError, OutsideFolder):
    """A path that would leave the run folder (``..``, an absolute path, a symlink out)."""


class StaleIndex(ViewError):
    """The results file changed under the index (its line for an episode moved): refresh."""


def row_from_record(record: dict[str, Any], key: str, order: int, offset: int | None) -> Row:
    """A finished episode's row from its results record (unknown fields ignored)."""
    metrics = _mapping(record.get("metrics"))
    exit_reason = _str(record.get("exit_reason"))
    tool_calls = metrics.get("tool_calls")
    error = _str(record.get("error"))
    info = _mapping(record.get("reward_info"))
    tampered = _mapping(info.get("integrity")).get("tampered")
    return Row(
        key=key,
        task_id=str(record.get("task_id", key)),
        sample=_int(record.get("sample")),
        order=order,
        status="failed" if exit_reason in INFRA_EXITS else "finished",
        exit_reason=exit_reason,
        reward=_float(record.get("reward")),
        masked=bool(record.get("traj_masked")),
        turns=_int(metrics.get("turns")),
        tool_calls={str(k): int(v) for k, v in tool_calls.items() if _int(v) is not None}
        if isinstance(tool_calls, dict)
        else {},
        format_errors=_int(metrics.get("format_errors")) or 0,
        syntax_errors=_int(metrics.get("syntax_errors")) or 0,
        timeouts=_int(metrics.get("timeouts")) or 0,
        inexact_turns=_int(metrics.get("inexact_turns")) or 0,
        **{k: _float(metrics.get(k)) for k in TIME_KEYS},
        error=error[:_ERROR_CHARS] if error else None,
        score_reason=_str(info.get("score_reason")),
        tampered=len(tampered) if isinstance(tampered, list) else 0,
        offset=offset,
        attempt=_int(record.get("attempt")),
    )


def job_key(task_id: str, sample: int) -> str:
    """Where ``uniagent run`` puts a job's folder, relative to the run folder."""
    return f"{EPISODES}/{task_dirname(task_id)}/{sample}"


def record_key(record: dict[str, Any]) -> str:
    """The episode folder of a results record, relative to the run folder."""
    # episode_dir is as the runner saw it (relative to its working directory, or
    # absolute); its last three parts are the same wherever the folder was moved.
    parts = str(record.get("episode_dir") or "").replace("\\", "/").rstrip("/").split("/")
    if len(parts) >= 3 and parts[-3] == EPISODES and parts[-2] not in ("", ".", ".."):
        return "/".join(parts[-3:])
    return job_key(str(record.get("task_id")), _int(record.get("sample")) or 0)


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
        self._since_ns: int | None = None  # when the invocation that wrote the manifest began
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
                if isinstance(job, list | tuple) and len(job) >= 2 and _int(job[1]) is not None:
                    task_id, sample = str(job[0]), int(job[1])
                    self._jobs.append((task_id, sample, job_key(task_id, sample)))
            self._planned = {key for _, _, key in self._jobs}
            # A new invocation (a resume) decides afresh which of its jobs have started.
            self._since_ns = liveness.started_ns(self.manifest, self._sigs.get(MANIFEST))
            self._dirs = set()
        if self._changed(SUMMARY):
            dirty = True
            path = self._top(SUMMARY)
            self.summary = read_json_object(path) if path else None
        dirty = self._read_results() or dirty
        state = self._run_state()
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
            reruns = self._reruns() if state in ("live", "unknown") else set()
            dirty = dirty or reruns != self._reruns_seen
            self._reruns_seen = reruns
        elif self._reruns_seen:  # the run ended: its rows are the results again
            self._reruns_seen = set()
            dirty = True
        if dirty:
            self._merge()
        return dirty

    def _reruns(self) -> set[str]:
        """Planned jobs with an infrastructure failure on record that a later attempt is
        running (a retry or a resume): their recorded attempt's log was moved aside."""
        found = set()
        for key, attempt in self._failed.items():  # a stat per failure, not per job
            if key in self._planned and os.path.lexists(self.root / key / f"attempt-{attempt}.log"):
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
                record = _loads(line)
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
                        sample=_int(record.get("sample")),
                        order=len(self._done),
                        status="failed",
                        error=f"its results record could not be read: {type(exc).__name__}",
                        offset=offset,
                    )
                self._done[key] = row
            elif line.strip():
                self.unreadable_lines += 1
        self._failed = {
            k: r.attempt for k, r in self._done.items() if r.status == "failed" and r.attempt
        }
        return True

    def _run_state(self) -> RunState:
        manifest_sig = self._sigs.get(MANIFEST)
        summary_sig = self._sigs.get(SUMMARY)
        if self.manifest is None:
            return "finished" if summary_sig else "unknown"
        if summary_sig and manifest_sig and summary_sig[2] >= manifest_sig[2]:
            # The summary is written however the run ends: Ctrl-C and the circuit
            # breaker leave episodes unrun, which a resume runs.
            status = (self.summary or {}).get("status")
            return "interrupted" if status in ("interrupted", "stopped") else "finished"
        pid, host = _int(self.manifest.get("pid")), self.manifest.get("host")
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
                    key = job_key(str(item.get("task_id")), _int(item.get("sample")) or 0)
                    failed[key] = _str(item.get("error"))
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
                plan.append((task or key, _int(number) or 0, key))
        rows: dict[str, Row] = {}
        for task_id, sample, key in plan:
            if key in rows:
                continue
            row = self._done.get(key)
            if row is not None and key in self._reruns_seen:
                row = dataclasses.replace(row, status="running")
            if row is None:
                row = Row(key=key, task_id=task_id, sample=sample, order=0)
                if key in failed:
                    row.status = "failed"
                    row.error = (failed[key] or "")[:_ERROR_CHARS] or None
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
            else:
                row = Row(
                    key=key,
                    task_id=parent if parent != "." else key,
                    sample=_int(directory.name),
                    order=len(rows),
                    status="running",
                )
            rows[key] = row
        changed = changed or rows.keys() != self.rows.keys()
        self.rows = rows
        return changed

    # ----------------------------------------------------------------- episode files

    def row(self, key: str) -> Row:
        """The row of episode ``key``; :class:`NotFound` for a key the index does not hold."""
        row = self.rows.get(key)
        if row is None:
            raise NotFound(f"no episode {key!r} in run {self.name!r}")
        return row

    def path(self, key: str, name: str | None = None) -> Path:
        """The episode folder (or one of its files), refusing anything outside the run folder."""
        self.row(key)
        if name is not None and not _is_episode_file(name):
            raise NotFound(f"{name!r} is not an episode file")
        return self.inside(f"{key}/{name}" if name else key)

    def inside(self, relative: str) -> Path:
        """``relative`` resolved against the run folder; :class:`OutsideRunFolder` if it leaves."""
        try:
            return files.inside(self.root, relative)
        except OutsideFolder as exc:
            raise OutsideRunFolder(str(exc)) from None

    def files(self, key: str) -> list[dict[str, Any]]:
        """The episode's files that the viewer shows, with their sizes."""
        directory = self.path(key)
        found: list[dict[str, Any]] = []
        try:
            with os.scandir(directory) as listing:
                entries = sorted(listing, key=lambda e: e.name)
        except OSError:  # not there (yet), or not a directory
            return found
        for entry in entries:
            try:
                if not (entry.is_file() and _is_episode_file(entry.name)):
                    continue
                self.path(key, entry.name)  # a symlink out is not listed
                found.append({"name": entry.name, "size": entry.stat().st_size})
            except OutsideRunFolder:
                continue
            except OSError:  # gone since the listing (a retry moves log.txt aside)
                continue
        return found

    def read_json(self, key: str, name: str) -> Any:
        """An episode's JSON file, or None when it does not exist (yet) or is not JSON."""
        return files.read_json(self.path(key, name))

    def load_json(self, key: str, name: str) -> Any:
        """An episode's JSON file, or None when it does not exist (yet).

        Raises :class:`~uniagent.view.files.Unreadable` for one that is not JSON (or too
        large), so the page can say so about that file.
        """
        return files.load_json(self.path(key, name))

    def read_text(self, key: str, name: str, *, tail: int) -> tuple[str, int]:
        """The last ``tail`` bytes of an episode's text file and its full size."""
        handle = files.open_regular(self.path(key, name))
        if handle is None:
            return "", 0
        with handle:
            try:
                size = os.fstat(handle.fileno()).st_size
                handle.seek(max(0, size - tail))
                return handle.read(tail).decode("utf-8", errors="replace"), size
            except OSError:
                return "", 0

    def record(self, key: str) -> dict[str, Any] | None:
        """The full result record: ``result.json``, else the episode's results.jsonl line.

        Raises :class:`StaleIndex` when the results file no longer holds that line where
        the index saw it (it was removed or replaced): refresh, then ask again.
        """
        record = self.read_json(key, RESULT)
        return record if isinstance(record, dict) else self.results_record(key)

    def results_record(self, key: str) -> dict[str, Any] | None:
        """The episode's line of results.jsonl as the index saw it, None if it has none.

        Raises :class:`StaleIndex` when the file no longer holds that line there.
        """
        row = self.row(key)
        if row.offset is None:
            return None
        path = self._top(RESULTS)
        line = files.line_at(path, row.offset) if path else None
        try:
            value = _loads(line) if line else None
        except ValueError:
            value = None
        if not isinstance(value, dict) or "task_id" not in value or record_key(value) != key:
            raise StaleIndex(f"results.jsonl of run {self.name!r} changed; refresh it")
        return value

    @property
    def samples_per_task(self) -> int:
        """``n`` of the run: from the manifest or summary, else the largest sample + 1."""
        for source in (self.manifest, self.summary):
            value = _int((source or {}).get("n" if source is self.manifest else "samples_per_task"))
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


def is_run_folder(path: Path) -> bool:
    """True for a folder ``uniagent run`` wrote (or is writing)."""
    return (
        any((path / name).exists() for name in (MANIFEST, RESULTS, SUMMARY))
        or (path / EPISODES).is_dir()
    )


def discover(paths: list[Path]) -> list[RunFolder]:
    """The run folders to show: each path, or the run folders directly inside it."""
    runs: list[RunFolder] = []
    for path in paths:
        if not path.is_dir():
            raise NotFound(f"{path} is not a folder")
        children = (
            [] if is_run_folder(path) else [c for c in _subdirs(path, True) if is_run_folder(c)]
        )
        if children:  # a folder the user named: links in it to run folders count too
            runs.extend(RunFolder(c, c.name) for c in children)
        else:
            runs.append(
                RunFolder(path, path.resolve().name if path.name in ("", ".", "..") else path.name)
            )
    names: dict[str, int] = {}
    for run in runs:  # two folders with one name: tell them apart by their parents
        names[run.name] = names.get(run.name, 0) + 1
    for run in runs:
        if names[run.name] > 1:
            run.name = f"{run.root.parent.name}/{run.root.name}"
    return runs


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
    return old is None or (old.status, old.exit_reason, old.reward) != (
        new.status,
        new.exit_reason,
        new.reward,
    )


def _scandir(path: Path) -> list[os.DirEntry[str]]:
    try:
        return [e for e in os.scandir(path) if e.is_dir()]
    except OSError:
        return []


def _is_episode_file(name: str) -> bool:
    return name in EPISODE_MARKERS or _LOG.fullmatch(name) is not None


def _subdirs(path: Path, follow: bool = False) -> list[Path]:
    try:
        return sorted(Path(e.path) for e in os.scandir(path) if e.is_dir(follow_symlinks=follow))
    except OSError:
        return []


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _str(value: Any) -> str | None:
    return None if value is None else str(value)


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.isascii() and value.isdigit():
        return int(value)  # not "²", which isdigit() admits and int() refuses
    return None


def _float(value: Any) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int | float):
        try:
            number = float(value)
        except OverflowError:  # an integer of hundreds of digits
            return None
        return number if math.isfinite(number) else None  # NaN sorts nowhere
    return None
