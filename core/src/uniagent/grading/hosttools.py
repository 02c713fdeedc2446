"""The toolchain check done from this process where the sandbox's paths are the host's.

Without isolation a sandbox sees the host's files at their own paths
(:meth:`~uniagent.env.AgentEnv.sees_host_files`), so most of the toolchain check
(:data:`~uniagent.grading.scripts.TOOLCHAIN`: each tool as bash's ``hash`` finds it on the
grading ``PATH``, its target as ``readlink -f`` gives it, each file's ``stat`` key as
``find -L -printf`` prints it) needs no process: this module answers as the script would,
line for line, with ``stat`` and ``realpath`` on a worker thread. Only the interpreters'
own answer (which start-up hooks and test-runner sources they load) still runs them, one
command for each, in the sandbox. Nothing here reads a file but an interpreter's first
bytes (opened without blocking, a regular file only), to see whether it is a pyenv shim:
then, as for a ``PATH`` with a relative or ``~`` entry, the script runs instead.
"""

from __future__ import annotations

import os
import shlex
import stat
from collections.abc import Iterable

from uniagent.grading import scripts
from uniagent.grading.sandbox import GradingSandbox, off_loop

#: What marks a pyenv shim (a bash script that runs ``pyenv exec``) in its first bytes.
_PYENV_SHIM = b'/libexec/pyenv" exec '


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


def _is_shim(path: str) -> bool:
    """Whether ``path`` is a pyenv shim (its first 2048 bytes, read without blocking from a
    regular file; anything else is not one)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError:
        return False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        return _PYENV_SHIM in os.read(fd, 2048)
    finally:
        os.close(fd)


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
        if _is_shim(real):
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
        command = (
            f"{shlex.quote(interpreter)} -I -S -c {shlex.quote(scripts.TOOLCHAIN_PY)} "
            "2>/dev/null; exit 0"
        )
        done = await sandbox.run(command, timeout=timeout, cwd="/")
        if done.timed_out or done.truncated or done.exit_code != 0:
            return None
        files += [line for line in done.output.split("\n") if line]
    unique = sorted(set(files), key=os.fsencode)  # (sort -zu: in byte order)
    lines += await off_loop(stat_lines, unique)
    return "".join(f"{line}\n" for line in lines)
