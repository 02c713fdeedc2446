"""Reading the files of a run folder safely: only regular files inside it, and the results
file tailed in bounded chunks.

The run folder's files were written by ``uniagent run``, but what they hold (and links
placed among them) is treated as untrusted: a path that resolves outside the folder is
never read, a FIFO or device is never opened for reading (it could block a worker for
good), and no read takes more memory than a chunk plus the longest line.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

try:  # twice as fast on a results file of many megabytes; json does the same job
    import orjson

    def loads(data: bytes) -> Any:
        """The JSON value in ``data`` (orjson where it takes it, else json)."""
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:  # NaN, integers past 64 bits: json takes them
            return json.loads(data)

except ImportError:  # pragma: no cover - orjson comes with the view extra

    def loads(data: bytes) -> Any:
        """The JSON value in ``data``."""
        return json.loads(data)


CHUNK_BYTES = 1 << 20  # how much of the results file is read at a time
#: The largest JSON file (messages, rollout, result) the viewer parses: a bigger one is
#: reported as such instead of taking the server's memory.
MAX_JSON_BYTES = 256 << 20
MAX_LINE_BYTES = 64 << 20  # the longest results line read back for one episode
_CHECK_BYTES = 256  # the bytes before the read position, kept to notice an in-place rewrite


class OutsideFolder(PermissionError):
    """A path that would leave its folder (``..``, an absolute path, a symlink out)."""


def inside(root: Path, relative: str) -> Path:
    """``relative`` resolved against ``root`` (itself resolved); :class:`OutsideFolder` if
    it leaves the folder, through ``..``, an absolute path or a symlink on the way."""
    if "\x00" in relative or relative.startswith(("/", "\\")) or Path(relative).is_absolute():
        raise OutsideFolder(f"{relative!r} is not a path inside the run folder")
    try:
        resolved = (root / relative).resolve()
    except (RuntimeError, OSError):  # a symlink loop, a name too long
        raise OutsideFolder(f"{relative!r} cannot be resolved inside the run folder") from None
    if resolved != root and not resolved.is_relative_to(root):
        raise OutsideFolder(f"{relative!r} leads outside the run folder")
    return resolved


def contained(root: Path, path: Path) -> Path | None:
    """``path`` (a path under ``root`` as listed) if it stays inside ``root`` once links are
    followed, else None: what the index reads instead of a file that links out."""
    try:
        if not path.is_symlink():
            return path  # its folder was reached without following links: it is inside
        return inside(root, path.relative_to(root).as_posix())
    except (OutsideFolder, ValueError, OSError):
        return None


def open_regular(path: Path) -> BinaryIO | None:
    """``path`` opened for reading if it is a regular file, else None (missing, a folder,
    a FIFO, a device). Opened without blocking, so a FIFO cannot stall the caller."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            return None
        return os.fdopen(fd, "rb")
    except OSError:
        os.close(fd)
        return None


class Unreadable(ValueError):
    """A file that is there but cannot be shown: not JSON, too large, unreadable."""


def read_bytes(path: Path, limit: int | None = None) -> bytes | None:
    """The content of a regular file, or None when there is none.

    Raises :class:`Unreadable` for a file over ``limit`` bytes (default
    :data:`MAX_JSON_BYTES`) or a read error.
    """
    limit = MAX_JSON_BYTES if limit is None else limit
    handle = open_regular(path)
    if handle is None:
        return None
    with handle:
        try:
            data = handle.read(limit + 1)
        except OSError as exc:
            raise Unreadable(f"{path.name} could not be read: {exc.strerror}") from None
    if len(data) > limit:
        raise Unreadable(f"{path.name} is over {limit >> 20} MB: too large to show")
    return data


def load_json(path: Path) -> Any:
    """The JSON value in a regular file, None when there is no such file.

    Raises :class:`Unreadable` (saying where the JSON breaks) for a file that is not JSON.
    """
    data = read_bytes(path)
    if data is None:
        return None
    try:
        return json.loads(data)
    except ValueError as exc:  # json's message names the line and column
        raise Unreadable(f"{path.name} is not valid JSON: {exc}") from None


def read_json(path: Path) -> Any:
    """The JSON value in a regular file, or None when it is missing or not JSON."""
    try:
        return load_json(path)
    except Unreadable:
        return None


def read_json_object(path: Path) -> dict[str, Any] | None:
    """The JSON object in a regular file, or None."""
    value = read_json(path)
    return value if isinstance(value, dict) else None


def signature(path: Path | None) -> tuple[int, ...] | None:
    """(inode, size, mtime) of a regular file, or None: what tells that it changed."""
    if path is None:
        return None
    try:
        st = path.stat()
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def line_at(path: Path, offset: int, limit: int = MAX_LINE_BYTES) -> bytes | None:
    """The line that starts at byte ``offset`` of a regular file (at most ``limit``
    bytes of it), or None."""
    handle = open_regular(path)
    if handle is None:
        return None
    with handle:
        try:
            handle.seek(offset)
            return handle.readline(limit)
        except OSError:
            return None


@dataclass
class Batch:
    """What :meth:`ResultsTail.poll` found: whether to forget what was read before
    (the file was replaced, truncated or rewritten), then the new complete lines."""

    reset: bool
    lines: Iterator[tuple[int, bytes]] = field(default_factory=lambda: iter(()))


class ResultsTail:
    """Follows an append-only JSON-lines file: each poll yields the complete lines added
    since the last one, with their offsets; a line still being written waits for its end.

    Replacement (a new inode), truncation and an in-place rewrite (the bytes before the
    read position changed, or the file was written without growing: an append always
    grows it) all start it over from the top.
    """

    def __init__(self) -> None:
        """Nothing read yet."""
        self.pos = 0
        self._sig: tuple[int, ...] | None = None
        self._check = b""  # the last bytes before ``pos``, as read

    def poll(self, path: Path | None) -> Batch | None:
        """None when the file did not change; else a :class:`Batch` whose lines are read
        as it is iterated (in chunks of :data:`CHUNK_BYTES`)."""
        sig = signature(path)
        old, self._sig = self._sig, sig
        if sig == old:
            return None
        if sig is None or path is None:
            reset = self.pos > 0 or old is not None
            self.pos, self._check = 0, b""
            return Batch(reset=reset)
        handle = open_regular(path)
        if handle is None:
            self.pos, self._check = 0, b""
            return Batch(reset=True)
        reset = False
        rewritten = old is not None and sig[1] == old[1] and sig[1] == self.pos  # not grown
        if (
            old is None
            or sig[0] != old[0]
            or sig[1] < self.pos
            or rewritten
            or not self._same_before(handle)
        ):
            reset = self.pos > 0 or old is not None
            self.pos, self._check = 0, b""
        return Batch(reset=reset, lines=self._lines(handle))

    def _same_before(self, handle: BinaryIO) -> bool:
        if not self.pos:
            return True
        try:
            handle.seek(self.pos - len(self._check))
            return handle.read(len(self._check)) == self._check
        except OSError:
            return False

    def _lines(self, handle: BinaryIO) -> Iterator[tuple[int, bytes]]:
        with handle:
            handle.seek(self.pos)
            carry = b""
            while True:
                try:
                    chunk = handle.read(CHUNK_BYTES)
                except OSError:
                    return
                if not chunk:
                    return  # what is left in carry is a line still being written
                data = carry + chunk
                end = data.rfind(b"\n") + 1
                start = 0
                while start < end:
                    stop = data.index(b"\n", start) + 1
                    yield self.pos + start, data[start:stop]
                    start = stop
                if end:
                    self._check = (self._check + data[:end])[-_CHECK_BYTES:]
                    self.pos += end
                carry = data[end:]
