"""The toolchain check done from this process where the sandbox's paths are the host's.

Without isolation a sandbox sees the host's files at their own paths
(:meth:`~uniagent.env.AgentEnv.sees_host_files`), so most of the toolchain check
(:data:`~uniagent.grading.scripts.TOOLCHAIN`: each tool as bash's ``hash`` finds it on the
grading ``PATH``, its target as ``readlink -f`` gives it, each file's ``stat`` key as
``find -L -printf`` prints it) needs no process: this module answers as the script would,
line for line, with ``stat`` and ``realpath`` on a worker thread. Only the interpreters'
own answer (which start-up hooks and test-runner sources they load) runs them, in the
sandbox; that answer is a list of names, so it is kept and given again while nothing it
depends on can have changed (:func:`_still_holds`): the interpreter (its ``stat`` key),
its ``pyvenv.cfg`` beside or above it, and every directory whose names it read (each
``sys.path`` entry, where it is missing the nearest directory above it that is there, and
every directory of the packages it listed), none changed since shortly before it ran (a
name added, removed or renamed changes its directory's ctime, as for the walks of
:mod:`uniagent.grading.walks`). Nothing here reads a file but an interpreter's first
bytes (opened without blocking, a regular file only), to see whether it is a pyenv shim:
then, as for a ``PATH`` with a relative or ``~`` entry, the script runs instead.
"""

from __future__ import annotations

import os
import posixpath
import shlex
import stat
import time
from collections.abc import Iterable
from dataclasses import dataclass

from uniagent.grading import scripts, walks
from uniagent.grading.sandbox import GradingSandbox, off_loop

#: What marks a pyenv shim (a bash script that runs ``pyenv exec``) in its first bytes.
_PYENV_SHIM = b'/libexec/pyenv" exec '


#: After :data:`~uniagent.grading.scripts.TOOLCHAIN_PY` (whose output it leaves as it is):
#: ``dir PATH`` for each directory whose names its answer depends on.
_DIRS_PY = r"""
seen = set()
def _dir(p):
    p = os.path.abspath(p)
    while p != "/" and not os.path.isdir(p):
        p = os.path.dirname(p)
    seen.add(p)
for d in sys.path + dirs:
    if d:
        _dir(d)
for name in ('sitecustomize', 'usercustomize', 'pytest', '_pytest', 'pluggy', 'unittest', 'py'):
    try:
        spec = importlib.util.find_spec(name)
    except Exception:
        continue
    if spec is not None and spec.submodule_search_locations:
        for root in spec.submodule_search_locations:
            for here, _, _ in os.walk(root):
                seen.add(here)
print('\n'.join('dir ' + d for d in sorted(seen)))
"""
#: Interpreters' answers kept, at most.
_ANSWERS_MAX = 64


@dataclass
class _Answer:
    """An interpreter's answer and what it depends on."""

    files: list[str]
    #: (stat key, or None where missing) of the interpreter and its ``pyvenv.cfg`` places.
    keys: tuple[str | None, ...]
    #: The directories whose names it read, with their (device, inode).
    dirs: list[tuple[str, int, int]]
    started_ns: int
    #: Every directory it named was there after it ran (else it is not kept).
    complete: bool = True


_ANSWERS: dict[tuple[str, str], _Answer] = {}


def _keys(interpreter: str) -> tuple[str | None, ...]:
    """The ``stat`` keys of the interpreter and of the ``pyvenv.cfg`` it would read."""
    here = posixpath.dirname(interpreter)
    paths = (interpreter, f"{here}/pyvenv.cfg", f"{posixpath.dirname(here)}/pyvenv.cfg")
    keys: list[str | None] = []
    for path in paths:
        line = stat_lines([path])
        keys.append(" ".join(line[0].split(" ", 6)[1:6]) if line else None)
    return tuple(keys)


def _still_holds(answer: _Answer, interpreter: str) -> bool:
    """Whether ``answer`` is what the interpreter would answer now (blocking)."""
    if _keys(interpreter) != answer.keys:
        return False
    dirs = ((path, (dev, ino)) for path, dev, ino in answer.dirs)
    return walks.paths_unchanged(dirs, answer.started_ns - walks.CTIME_SLACK_NS)


def _answer(output: str, keys: tuple[str | None, ...], started: int, scratch: str) -> _Answer:
    """An interpreter's output as an :class:`_Answer` (blocking: it ``lstat``-s the
    directories; those of the grading scratch dir, fresh each time, are left out)."""
    files: list[str] = []
    dirs: list[tuple[str, int, int]] = []
    complete = True
    for line in output.split("\n"):
        if line.startswith("dir "):
            path = line[4:]
            if path == scratch or path.startswith(f"{scratch}/"):
                continue
            try:
                info = os.lstat(path)
            except OSError:
                complete = False  # gone since it ran: the answer is not kept
                continue
            dirs.append((path, info.st_dev, info.st_ino))
        elif line:
            files.append(line)
    return _Answer(files, keys, dirs, started, complete)


class NotHere(Exception):
    """The check cannot be answered from this process exactly as the script would."""


def lookup(name: str, path: str) -> str | None:
    """``name`` as bash's ``hash`` finds it on ``path`` from ``/`` (where the check runs):
    the first executable file that is not a directory (a file that is not executable is
    passed over, and is not found where it is the only one); ``None`` when there is none.
    Raises :class:`NotHere` for an entry that is not an absolute path (bash reads it from
    the working directory, ``~`` it expands)."""
    for entry in path.split(":"):
        if not entry.startswith("/"):
            raise NotHere(f"PATH entry {entry!r}")
        full = f"{entry}/{name}"
        try:
            info = os.stat(full)
        except OSError:
            continue
        if stat.S_ISDIR(info.st_mode):
            continue
        if os.access(full, os.X_OK):
            return full
    return None


def _timestamp(ns: int) -> str:
    """A time as ``find -printf %T@`` prints it: seconds and ten digits of fraction."""
    seconds, fraction = divmod(ns, 1_000_000_000)
    return f"{seconds}.{fraction:09d}0"


def stat_lines(paths: Iterable[str]) -> list[str]:
    """``stat DEV INODE SIZE MTIME CTIME PATH`` for each path that exists, as
    :data:`~uniagent.grading.scripts.STAT_FILES` prints it (``find -L``: a link's target,
    a dangling link itself)."""
    lines = []
    for path in paths:
        try:
            info = os.stat(path)
        except FileNotFoundError:
            try:
                info = os.lstat(path)
            except OSError:
                continue
        except OSError:
            continue
        lines.append(
            f"stat {info.st_dev} {info.st_ino} {info.st_size} {_timestamp(info.st_mtime_ns)} "
            f"{_timestamp(info.st_ctime_ns)} {path}"
        )
    return lines


def read_regular(path: str, limit: int) -> bytes | None:
    """The first ``limit`` bytes of ``path`` where it is a regular file, opened without
    blocking (a FIFO or a device put where a file was is never waited on); ``None`` for
    anything else or where it cannot be read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.read(fd, limit)  # (a file's start: an interpreter's first line, a shim's)
    except OSError:
        return None
    finally:
        os.close(fd)


def is_shim(path: str) -> bool:
    """Whether ``path`` is a pyenv shim (its first 2048 bytes, read without blocking from a
    regular file; anything else is not one)."""
    start = read_regular(path, 2048)
    return start is not None and _PYENV_SHIM in start


def _tools(path: str) -> tuple[list[str], list[str], list[str]]:
    """The ``bin`` lines, the files to ``stat`` and the interpreters to ask (blocking)."""
    lines: list[str] = []
    files: list[str] = []
    for name in scripts.TOOLCHAIN_TOOLS.split():
        found = lookup(name, path)
        if found is not None:
            real = os.path.realpath(found)
            lines.append(f"bin {name} {real}")
            files.append(real)
    asked: list[str] = []
    interpreters: list[str] = []
    for name in ("python3", "python"):
        found = lookup(name, path)
        if found is None:
            continue
        real = os.path.realpath(found)
        if is_shim(real):
            raise NotHere(f"{found} is a pyenv shim")
        key = f"{os.path.dirname(found)} {real}"  # python and python3 of one bin: one
        if key not in asked:
            asked.append(key)
            interpreters.append(found)
    return lines, files, interpreters


async def toolchain_output(sandbox: GradingSandbox, timeout: float) -> str | None:
    """What :data:`~uniagent.grading.scripts.TOOLCHAIN` would print in ``sandbox``, where it
    sees the host's files and the answer can be had from here; ``None`` otherwise (run the
    script). The interpreters still run in the sandbox, with ``-I -S``, their output taken
    as the script takes it (whatever their status); one that does not end in ``timeout``
    s, or prints more than the script may, means ``None`` too."""
    if not sandbox.env.sees_host_files():
        return None
    try:
        lines, files, interpreters = await off_loop(_tools, sandbox.environment.get("PATH", ""))
    except NotHere:
        return None
    for interpreter in interpreters:
        found = await _interpreter_files(sandbox, interpreter, timeout)
        if found is None:
            return None
        files += found
    unique = sorted(set(files), key=os.fsencode)  # (sort -zu: in byte order)
    lines += await off_loop(stat_lines, unique)
    return "".join(f"{line}\n" for line in lines)


async def _interpreter_files(
    sandbox: GradingSandbox, interpreter: str, timeout: float
) -> list[str] | None:
    """The files ``interpreter`` answers that it loads (its answer kept from an earlier
    check where :func:`_still_holds`); ``None`` where it did not answer in time."""
    real = os.path.realpath(interpreter)
    kept = _ANSWERS.get((interpreter, real))
    if kept is not None and await off_loop(_still_holds, kept, interpreter):
        return list(kept.files)
    keys = await off_loop(_keys, interpreter)
    started = time.time_ns()
    code = scripts.TOOLCHAIN_PY + _DIRS_PY
    command = f"{shlex.quote(interpreter)} -I -S -c {shlex.quote(code)} 2>/dev/null; exit 0"
    done = await sandbox.run(command, timeout=timeout, cwd="/")
    if done.timed_out or done.truncated or done.exit_code != 0:
        return None
    answer = await off_loop(_answer, done.output, keys, started, sandbox.scratch)
    if len(_ANSWERS) >= _ANSWERS_MAX:
        _ANSWERS.clear()
    # (kept where nothing it depends on changed while it ran)
    if answer.complete and answer.dirs and await off_loop(_still_holds, answer, interpreter):
        _ANSWERS[(interpreter, real)] = answer
    return answer.files
