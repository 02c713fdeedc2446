"""Which runs ``uniagent view`` shows: the folders it was given, and the run folders that
appear later in a folder of runs (``uniagent view runs/``, then ``uniagent run --out
runs/new``, whether ``runs/new`` existed before or not).

A run's id is its position in :attr:`Catalog.runs`; ids never move. A folder of runs that
holds no run yet shows as an empty run of its own name until the first run appears in it,
which then takes its place (its id).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from uniagent.run.layout import is_run_folder
from uniagent.view.rundir import NotFound, RunFolder

#: A folder whose modification time is this much older than the last look at it cannot
#: have changed unseen since (file times are coarser than the clock).
_SETTLED_NS = 10**9


@dataclass
class _Parent:
    """A folder of runs, looked into again for new ones."""

    path: Path
    #: The slot of the empty run shown for it while it holds no run yet.
    placeholder: int | None = None
    #: Subfolders shown as runs (here or as named on the command line).
    shown: set[Path] = field(default_factory=set)
    #: Subfolders that are not run folders (yet): (modification time, when it was seen).
    waiting: dict[Path, tuple[int, int]] = field(default_factory=dict)


class Catalog:
    """The runs on show; :meth:`rescan` adds the ones started since in a folder of runs."""

    def __init__(self, paths: Sequence[Path]) -> None:
        """The runs of ``paths``: each a run folder, a folder of runs, or a tree of episode
        folders. Raises :class:`NotFound` for a path that is not a folder."""
        self.runs: list[RunFolder] = []
        self.version = 0  # bumped whenever a run is added or takes a placeholder's place
        self.scanned_at = 0.0  # time.monotonic() of the last rescan
        self._parents: list[_Parent] = []
        self._roots: set[Path] = set()
        self._names: dict[Path, str] = {}  # each run's own name, before telling twins apart
        self._lock = threading.Lock()  # rescans come from worker threads
        for path in paths:
            self._add_path(Path(path))
        self._name_runs()
        self.scanned_at = time.monotonic()

    @classmethod
    def of(cls, runs: Sequence[RunFolder]) -> Catalog:
        """A catalog of runs already indexed (none looked for later)."""
        catalog = cls(())
        for run in runs:
            catalog._add(run)
        return catalog

    @property
    def watched(self) -> list[Path]:
        """The folders of runs that new runs are looked for in."""
        return [parent.path for parent in self._parents]

    def _add_path(self, path: Path) -> None:
        if not path.is_dir():
            raise NotFound(f"{path} is not a folder")
        name = path.resolve().name if path.name in ("", ".", "..") else path.name
        if is_run_folder(path):
            self._add(RunFolder(path, name))
        elif any(is_run_folder(child) for child in _subdirs(path)):
            parent = _Parent(path)
            self._look_into(parent)
            self._parents.append(parent)
        else:
            run = RunFolder(path, name)  # no run in it: a tree of episode folders, or empty
            self._add(run)
            if not run.rows:  # empty: the run folder of a run to come, or a folder of runs
                self._parents.append(_Parent(path, placeholder=len(self.runs) - 1))

    def _add(self, run: RunFolder, slot: int | None = None) -> None:
        self._roots.add(run.root)
        self._names[run.root] = run.name
        if slot is None:
            self.runs.append(run)
        else:  # the placeholder's folder stays watched, not shown
            self.runs[slot] = run

    def rescan(self) -> bool:
        """Look into the folders of runs again; True when a run was added."""
        with self._lock:
            added = False
            for parent in list(self._parents):
                if parent.placeholder is not None and is_run_folder(parent.path):
                    # A run started in the folder itself: it is that run, not a folder of runs.
                    self._parents.remove(parent)
                    continue
                added = self._look_into(parent) or added
            self.scanned_at = time.monotonic()
            if added:
                self._name_runs()
                self.version += 1
            return added

    def _look_into(self, parent: _Parent) -> bool:
        """Add the subfolders of ``parent`` that became run folders; True if any did."""
        added = False
        now = time.time_ns()
        for child in _subdirs(parent.path):
            if child in parent.shown:
                continue
            try:
                mtime = child.stat().st_mtime_ns
            except OSError:
                continue
            seen = parent.waiting.get(child)
            if seen is not None and seen[0] == mtime and seen[1] - mtime > _SETTLED_NS:
                continue  # not changed since it was last found not to be a run folder
            if not is_run_folder(child):
                parent.waiting[child] = (mtime, now)
                continue
            parent.waiting.pop(child, None)
            parent.shown.add(child)
            if child.resolve() in self._roots:  # also named on the command line
                continue
            run = RunFolder(child, child.name)
            self._add(run, parent.placeholder)
            parent.placeholder = None
            added = True
        return added

    def _name_runs(self) -> None:
        """Two folders with one name are told apart by their parents."""
        for run in self.runs:
            run.name = self._names.get(run.root, run.name)
        names: dict[str, int] = {}
        for run in self.runs:
            names[run.name] = names.get(run.name, 0) + 1
        for run in self.runs:
            if names[run.name] > 1:
                run.name = f"{run.root.parent.name}/{run.root.name}"


def discover(paths: list[Path]) -> list[RunFolder]:
    """The run folders to show: each path, or the run folders directly inside it."""
    return Catalog(paths).runs


def _subdirs(path: Path) -> list[Path]:
    """The subfolders of ``path``, links to folders too (a folder the user named)."""
    try:
        with os.scandir(path) as entries:
            return sorted(Path(e.path) for e in entries if e.is_dir(follow_symlinks=True))
    except OSError:
        return []
