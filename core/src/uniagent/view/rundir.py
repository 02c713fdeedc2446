"""Reading a run folder: the one module of ``uniagent view`` that knows its layout.

What ``uniagent run`` writes (see ``uniagent.run.runner``)::

    manifest.json   at start: run_id, started_at, n, pid, host, jobs [[task_id, sample], ...]
    results.jsonl   one record per finished episode, appended as it finishes
    summary.json    written at the end of each invocation
    episodes/<task>/<sample>/  messages.json, rollout.json, log[.<attempt>].txt, result.json

Everything is optional and read tolerantly: a folder without a manifest (an older run),
unknown files and fields, a half-written last line. A folder with none of these is read
as a tree of episode folders (any folder holding ``result.json``, ``messages.json`` or
``rollout.json``), which is how training dumps lay them out.

Nothing here writes: every file is opened for reading, and every path handed out is
checked to lie inside the run folder after symlinks are resolved.
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from uniagent.errors import UniAgentError
from uniagent.interaction.exit import DEFAULT_EXIT_POLICY
from uniagent.run.runner import MANIFEST, RESULTS, SUMMARY, task_dirname
from uniagent.view.row import TIME_KEYS, Row

try:  # twice as fast on a results file of many megabytes; json does the same job
    import orjson

    def _loads(data: bytes) -> Any:
        return orjson.loads(data)

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
_LOG = re.compile(r"log(\.[A-Za-z0-9_-]{1,64})?\.txt")
_TREE_DEPTH = 8  # how deep a tree of episode folders is searched
_TREE_RESCAN_S = 2.0  # a tree has no results file to tail: rescan it at most this often
_ERROR_CHARS = 300
_CHANGES_KEPT = 64  # versions whose changed rows are remembered, for the live events


class ViewError(UniAgentError):
    """A request ``uniagent view`` cannot answer (the message says why)."""


class NotFound(ViewError, LookupError):
    """No such run, episode or file."""


class OutsideRunFolder(ViewError, PermissionError):
    """A path that would leave the run folder (``..``, an absolute path, a symlink out)."""


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
        self._sigs: dict[str, tuple[int, ...] | None] = {}
        self._done: dict[str, Row] = {}
        self._results_pos = 0
        self._dirs: set[str] = set()
        self._jobs: list[tuple[str, int, str]] = []
        self._tree_scanned = 0.0
        self._changes: dict[int, list[str]] = {}
        self.refresh()

    # ----------------------------------------------------------------- reading

    def refresh(self) -> bool:
        """Pick up what changed on disk since the last call; True when a row changed."""
        self.refreshed_at = time.monotonic()
        old = self.rows
        changed = self._refresh_tree() if self.kind == "tree" else self._refresh_run()
        if changed:
            self.version += 1
            keys = [k for k, r in self.rows.items() if _differs(old.get(k), r)]
            keys += [k for k in old if k not in self.rows]
            self._changes[self.version] = keys
            self._changes.pop(self.version - _CHANGES_KEPT, None)
        return changed

    def changes_since(self, version: int) -> list[str] | None:
        """Keys of the rows that changed after ``version``; None when too long ago to tell."""
        if version >= self.version:
            return []
        keys: set[str] = set()
        for v in range(version + 1, self.version + 1):
            if v not in self._changes:
                return None
            keys.update(self._changes[v])
        return sorted(keys)

    def _refresh_run(self) -> bool:
        dirty = not self.rows
        if self._changed(MANIFEST):
            dirty = True
            self.manifest = _read_json_object(self.root / MANIFEST)
            self._jobs = []
            for job in (self.manifest or {}).get("jobs") or []:
                if isinstance(job, list | tuple) and len(job) >= 2 and _int(job[1]) is not None:
                    task_id, sample = str(job[0]), int(job[1])
                    self._jobs.append((task_id, sample, job_key(task_id, sample)))
        if self._changed(SUMMARY):
            dirty = True
            self.summary = _read_json_object(self.root / SUMMARY)
        dirty = self._read_results() or dirty
        state = self._run_state()
        dirty = dirty or state != self.state
        self.state = state
        if self.manifest is None:
            if not self.rows:  # an older run folder: its episode folders are the plan
                self._dirs |= set(self._scan_episode_dirs())
        elif dirty or state in ("live", "unknown"):
            started = self._started_jobs()
            dirty = dirty or bool(started)
            self._dirs |= started
        if dirty:
            self._merge()
        return dirty

    def _started_jobs(self) -> set[str]:
        """Planned jobs whose folder appeared since the last look (queued -> running)."""
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
            found.update(f"{EPISODES}/{task}/{s}" for s in waiting[task] if s in samples)
        return found

    def _changed(self, name: str) -> bool:
        sig = _signature(self.root / name)
        if self._sigs.get(name, ()) == sig:
            return False
        self._sigs[name] = sig
        return True

    def _read_results(self) -> bool:
        """Read what was appended to results.jsonl; reread it whole if it was replaced."""
        path = self.root / RESULTS
        sig = _signature(path)
        old = self._sigs.get(RESULTS)
        if sig == old:
            return False
        self._sigs[RESULTS] = sig
        if sig is None or old is None or sig[0] != old[0] or sig[1] < self._results_pos:
            self._done = {}
            self._results_pos = 0
        if sig is None:
            return True
        with path.open("rb") as handle:
            handle.seek(self._results_pos)
            data = handle.read()
        end = data.rfind(b"\n") + 1  # a last line without its newline is still being written
        pos = self._results_pos
        for line in data[:end].splitlines(keepends=True):
            offset, pos = pos, pos + len(line)
            try:
                record = _loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and "task_id" in record:
                key = record_key(record)
                self._done[key] = row_from_record(record, key, len(self._done), offset)
        self._results_pos += end
        return True

    def _run_state(self) -> RunState:
        manifest_sig = self._sigs.get(MANIFEST)
        summary_sig = self._sigs.get(SUMMARY)
        if self.manifest is None:
            return "finished" if summary_sig else "unknown"
        if summary_sig and manifest_sig and summary_sig[2] >= manifest_sig[2]:
            return "finished"
        pid, host = _int(self.manifest.get("pid")), self.manifest.get("host")
        if pid is None or host != socket.gethostname():
            return "unknown"  # another machine's run: assume it goes on
        return "live" if _pid_is_uniagent(pid) else "interrupted"

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
            sig = _signature(directory / RESULT)
            old = self.rows.get(key)
            if old is not None and self._sigs.get(f"tree:{key}") == sig:
                rows[key] = old
                old.order = len(rows) - 1
                continue
            self._sigs[f"tree:{key}"] = sig
            changed = True
            record = _read_json_object(directory / RESULT) if sig else None
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
        if "\x00" in relative or relative.startswith(("/", "\\")) or Path(relative).is_absolute():
            raise OutsideRunFolder(f"{relative!r} is not a path inside the run folder")
        resolved = (self.root / relative).resolve()
        if resolved != self.root and not resolved.is_relative_to(self.root):
            raise OutsideRunFolder(f"{relative!r} leads outside the run folder")
        return resolved

    def files(self, key: str) -> list[dict[str, Any]]:
        """The episode's files that the viewer shows, with their sizes."""
        directory = self.path(key)
        found = []
        if directory.is_dir():
            for entry in sorted(os.scandir(directory), key=lambda e: e.name):
                if entry.is_file() and _is_episode_file(entry.name):
                    try:
                        self.path(key, entry.name)  # a symlink out is not listed
                    except OutsideRunFolder:
                        continue
                    found.append({"name": entry.name, "size": entry.stat().st_size})
        return found

    def read_json(self, key: str, name: str) -> Any:
        """An episode's JSON file, or None when it does not exist (yet) or is not JSON."""
        path = self.path(key, name)
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None

    def read_text(self, key: str, name: str, *, tail: int) -> tuple[str, int]:
        """The last ``tail`` bytes of an episode's text file and its full size."""
        path = self.path(key, name)
        try:
            size = path.stat().st_size
            with path.open("rb") as handle:
                handle.seek(max(0, size - tail))
                return handle.read(tail).decode("utf-8", errors="replace"), size
        except OSError:
            return "", 0

    def record(self, key: str) -> dict[str, Any] | None:
        """The full result record: ``result.json``, else the episode's results.jsonl line."""
        row = self.row(key)
        record = self.read_json(key, RESULT)
        if isinstance(record, dict):
            return record
        if row.offset is not None:
            with (self.root / RESULTS).open("rb") as handle:
                handle.seek(row.offset)
                try:
                    value = json.loads(handle.readline())
                except ValueError:
                    return None
            return value if isinstance(value, dict) else None
        return None

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
            "n": self.samples_per_task,
            "episodes": len(self.rows),
            "wall_seconds": (self.summary or {}).get("wall_seconds"),
            "version": self.version,
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


def _signature(path: Path) -> tuple[int, ...] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def _read_json_object(path: Path) -> dict[str, Any] | None:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _pid_is_uniagent(pid: int) -> bool:
    """Whether process ``pid`` exists and (where /proc tells) is a uniagent command."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True  # no /proc here: the process exists, trust it
    return b"uniagent" in cmdline


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _str(value: Any) -> str | None:
    return None if value is None else str(value)


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return None


def _float(value: Any) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int | float):
        return float(value)
    return None
