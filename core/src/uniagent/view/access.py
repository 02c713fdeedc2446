"""Reading an episode's files for a page: only episodes the index knows, only the files an
episode folder holds, only regular files inside the run folder, each read bounded.

The index (:mod:`uniagent.view.rundir`) says which episodes there are; this module opens
their files. Every path is resolved (symlinks followed) and refused when it leaves the run
folder; FIFOs and devices are never opened for reading (see :mod:`uniagent.view.files`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from uniagent.run.layout import RESULT, RESULTS, is_episode_file
from uniagent.view import files
from uniagent.view.files import OutsideFolder, contained, loads
from uniagent.view.rundir import NotFound, RunFolder, ViewError, record_key


class OutsideRunFolder(ViewError, OutsideFolder):
    """A path that would leave the run folder (``..``, an absolute path, a symlink out)."""


class StaleIndex(ViewError):
    """The results file changed under the index (its line for an episode moved): refresh."""


class EpisodeFiles:
    """The files of the episodes of one indexed run folder."""

    def __init__(self, run: RunFolder) -> None:
        """Read the files of ``run``'s episodes."""
        self.run = run
        self.root = run.root

    def path(self, key: str, name: str | None = None) -> Path:
        """The episode folder (or one of its files), refusing anything outside the run folder."""
        self.run.row(key)
        if name is not None and not is_episode_file(name):
            raise NotFound(f"{name!r} is not an episode file")
        return self.inside(f"{key}/{name}" if name else key)

    def inside(self, relative: str) -> Path:
        """``relative`` resolved against the run folder; :class:`OutsideRunFolder` if it leaves."""
        try:
            return files.inside(self.root, relative)
        except OutsideFolder as exc:
            raise OutsideRunFolder(str(exc)) from None

    def listing(self, key: str) -> list[dict[str, Any]]:
        """The episode's files that the viewer shows, with their sizes."""
        directory = self.path(key)
        found: list[dict[str, Any]] = []
        try:
            with os.scandir(directory) as entries:
                ordered = sorted(entries, key=lambda e: e.name)
        except OSError:  # not there (yet), or not a directory
            return found
        for entry in ordered:
            try:
                if not (entry.is_file() and is_episode_file(entry.name)):
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
        row = self.run.row(key)
        if row.offset is None:
            return None
        path = contained(self.root, self.root / RESULTS)
        line = files.line_at(path, row.offset) if path else None
        try:
            value = loads(line) if line else None
        except ValueError:
            value = None
        if not isinstance(value, dict) or "task_id" not in value or record_key(value) != key:
            raise StaleIndex(f"results.jsonl of run {self.run.name!r} changed; refresh it")
        return value
