"""The grading sandbox: what a reward works with, never the agent's shell session.

Every command is a one-off process started through the runtime's ``execute``
with an environment fixed before the agent's first turn (the sandbox's own
start-up environment, minus variables that hook into shells, interpreters,
test runners or git), a fresh ``HOME`` and a fresh scratch directory made at
grading time, so nothing the agent left behind in its shell (aliases,
functions, exported variables, ``PATH``, ``BASH_ENV``, traps, background jobs)
or in its home directory reaches the grader. Its bounds (a process group of its own, the
output cut at a limit, a time-out, an output held open past a grace) are kept by a small
wrapper in the sandbox (:data:`_BOUNDED`), or, without isolation, where the sandbox's
processes are this machine's, by the runtime in this process
(:meth:`~uniagent.env.AgentEnv.run_bounded`: the same outcome, five processes fewer a
command), which then also makes the scratch directory and writes the staged files.

The grader reads nothing from the sandbox's files on the host side: every
command's output comes back through the exec channel, cut at a size limit (the
command's own output cannot grow the grader's memory), and every read of a
sandbox file (:meth:`GradingSandbox.read_bytes`) is such a command, with a
regular-file check, a size limit and a timeout; so a file that the tested code
replaced (by a FIFO, a symlink, a huge file) can neither hang nor flood the grader.
The exceptions: without isolation, where the sandbox's paths are the host's, the test
environment's roots are listed from this process (:mod:`uniagent.grading.walks`: names and
``lstat`` only, no file read, no link followed, a bounded number of names), and so are the
toolchain's tools and files (:mod:`uniagent.grading.hosttools`: ``stat`` and ``realpath``,
and an interpreter's first bytes, read without blocking from a regular file).

Under bubblewrap, the grader's own scripts (never the tested code) run one after another in a
resident shell (:class:`_ResidentShell`): one ``bwrap`` for all of a grading sandbox's steps
instead of one each. It runs in a PID namespace of its own, which no process of the agent or
of the tests can see (so none can write to its pipes or signal it), only where every
directory of the grading ``PATH`` is a read-only bind (so no tool those scripts run can have
been changed), and each command in it runs exactly as a one-off one would: the same wrapper,
its own environment, stdin from ``/dev/null``, its output framed by a token drawn for it.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import os
import posixpath
import re
import secrets
import shlex
import shutil
import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from uniagent.env.aio import wait_for
from uniagent.env.errors import EnvError
from uniagent.env.killall import SYSTEM_PATH

if TYPE_CHECKING:  # pragma: no cover
    from uniagent.env import AgentEnv

T = TypeVar("T")
log = logging.getLogger(__name__)

#: Variables that make shells, interpreters, test runners, linkers or git run extra code or
#: read other configuration; never passed to grading commands.
HOOK_VARIABLES = re.compile(
    r"^(BASH_ENV|ENV|BASH_FUNC_.*|PROMPT_COMMAND|PS[0-4]|SHELLOPTS|BASHOPTS|CDPATH|GLOBIGNORE"
    r"|HISTFILE|INPUTRC|IFS|PYTHONSTARTUP|PYTHONINSPECT|PYTHONHOME|PYTHONUSERBASE|PYTHONBREAKPOINT"
    r"|PYTHONWARNINGS|PYTHONPYCACHEPREFIX|PYTEST_.*|COV_CORE_.*|LD_PRELOAD|LD_AUDIT"
    r"|PERL5OPT|PERL5LIB|RUBYOPT|RUBYLIB|NODE_OPTIONS|JAVA_TOOL_OPTIONS|_JAVA_OPTIONS"
    r"|GIT_.*|EDITOR|VISUAL|PAGER|HOME|TMPDIR|TMP|TEMP|OLDPWD|PWD|SHLVL|_)$"
)

#: Always set for grading: no user site, no pager, git without global or system config.
FIXED_VARIABLES: dict[str, str] = {
    "PYTHONNOUSERSITE": "1",
    "PYTHONDONTWRITEBYTECODE": "1",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_TERMINAL_PROMPT": "0",
    # `git replace` refs would change what every git command (the eval script's too) sees.
    "GIT_NO_REPLACE_OBJECTS": "1",
    "PAGER": "cat",
    "GIT_PAGER": "cat",
    "NO_COLOR": "1",
    "TERM": "dumb",
}

#: git as the grader runs it (a shell function ``gitc``): no fsmonitor, hooks, CRLF
#: conversion, network or ownership check, and no repository looked for in or above
#: ``$GIT_CEILING`` (the parent of the repository, set by ``scripts.with_vars``).
GIT_FUNCTION = (
    'gitc() { GIT_CEILING_DIRECTORIES="${GIT_CEILING:-}" git -c core.fsmonitor=false '
    "-c core.hooksPath=/dev/null -c core.autocrlf=false "
    "-c core.safecrlf=false -c core.quotepath=false -c protocol.allow=never "
    '-c "safe.directory=*" -c advice.detachedHead=false -c gc.auto=0 '
    '-c core.useReplaceRefs=false "$@"; }'
)

#: Base64 bytes of staged files (:meth:`GradingSandbox.stage_bytes`) that go with the next
#: command's arguments (well below the kernel's 128 KiB for one argument); more go as files.
INLINE_BYTES = 96 << 10
#: Bytes of one grading command's output kept by default; more is cut (``truncated``).
OUTPUT_LIMIT = 64 << 20
#: Bytes :meth:`GradingSandbox.read_bytes` reads at most by default.
READ_LIMIT = 64 << 20
#: Seconds a file read in the sandbox may take.
READ_TIMEOUT = 120.0
#: Exit status of :data:`_READ` for a path that is not a regular file.
_NOT_REGULAR = 66

#: Seconds the output may stay open after the command ended (held by a process that left
#: its group), before the reading stops and the command counts as timed out.
HOLD_GRACE = 5

#: Runs ``$1`` (killed with its process group after ``$4`` seconds where ``$5`` asks for it)
#: in a process group of its own, its output cut at ``$2`` bytes: what was cut is counted (and
#: drained) and reported on a last line starting with ``$3``. When the command ends, what is
#: left of its process group is killed. Its output goes through a pipe to a reader (a
#: ``coproc``) that only the command holds open, so the reading ends when the command ends; a
#: process that left the group and holds it open (or opened it again through ``/proc``) gets
#: ``$6`` seconds, then the reading is stopped and ``$3 held`` is the last line. The reader's
#: end is seen on the coproc's other pipe, which it holds open: waiting for it costs no
#: process, and no timer runs when the output is not held. Exits with the command's status
#: (137 when the time ran out). (Pipes, not FIFOs in ``$TMPDIR``: no ``mkfifo`` or ``rm`` per
#: command, nothing to name or clean up.)
#:
#: Every program started here costs about a millisecond of CPU (the dynamic loader's start
#: alone, on a virtual machine), so the wrapper starts one besides the command's ``bash``:
#: the reader's ``head`` (``wc`` only where the output was cut). The time-out is a subshell
#: (a fork, no program) that waits on a pipe it holds both ends of (``read -t``; ``sleep``
#: where that fails), then kills the command's group; the wrapper ends it when the command
#: ends first.
#:
#: Before that, in the same process (no command of its own): the grading scratch dir ``$7``
#: (with ``home`` and ``tmp``, mode 0700) is made where it is not there yet, and each file
#: ``PATH`` of the lines ``file<TAB>PATH<TAB>STAGED`` (or ``data<TAB>PATH<TAB>ESCAPED``) of
#: ``$8`` is decoded from its base64 file ``STAGED`` (or from the line, as bash's ``printf
#: %b`` reads it: every byte but printable ASCII written ``\xHH``, no program started).
#: ``$3 noscratch`` or ``$3 unstaged PATH`` (exit 125) says that the scratch dir or a file
#: could not be made.
_BOUNDED = r"""exec 2>/dev/null
set -m
if [ -n "$7" ] && [ ! -d "$7" ]; then
  mkdir -m 700 -- "$7" "$7/home" "$7/tmp" || { printf '%s noscratch\n' "$3"; exit 125; }
fi
if [ -n "$8" ]; then
  set -f; IFS=$'\n'
  for line in $8; do
    kind=${line%%$'\t'*} line=${line#*$'\t'}
    p=${line%%$'\t'*} data=${line#*$'\t'}
    case "$kind" in
      file) { base64 -d < "$data" > "$p" && rm -f -- "$data"; } ;;
      *) printf '%b' "$data" > "$p" ;;
    esac || { printf '%s unstaged %s\n' "$3" "$p"; exit 125; }
  done
  set +f; IFS=$' \t\n'
fi
# The reader writes to the wrapper's stdout (fd 5 here) and holds the coproc's stdout (fd 7):
# EOF there is its end. Its pipes move to fds 3 and 4 (bash closes a coproc's own fds, by
# number, when it reaps it).
exec 5>&1
coproc {
  exec 7>&1 1>&5 5>&-
  head -c "$2"
  # (a byte more, read in the C locale: NUL, newline or any other, then the rest counted)
  LC_ALL=C
  if IFS= read -r -d '' -n 1 _; then n=$(wc -c); printf '\n%s %s\n' "$3" "$((n + 1))"; fi
}
reader=$COPROC_PID
exec 3>&"${COPROC[1]}" 4<&"${COPROC[0]}" 5>&-
eval "exec ${COPROC[1]}>&- ${COPROC[0]}<&-"
bash --norc --noprofile -c "$1" >&3 2>&3 3>&- 4<&- &
pid=$!
exec 3>&-
dog=
if [ -n "$5" ]; then
  {
    exec 4<&-
    read -r -t "$4" _ <> <(:); st=$?
    [ "$st" -gt 128 ] || sleep "$4" || exit 0
    kill -KILL -- "-$pid"
  } > /dev/null 2>&1 &
  dog=$!
fi
wait "$pid"; rc=$?
[ -z "$dog" ] || { kill -KILL "$dog"; wait "$dog"; }
kill -KILL -- "-$pid"
# The reader's end (EOF on fd 4) within $6 s; what else comes there is read past.
held=1 left=$6 end=$((SECONDS + $6))
while :; do
  read -r -N 65536 -t "$left" -u 4 _; st=$?
  if [ "$st" -eq 0 ]; then left=$((end - SECONDS)); [ "$left" -gt 0 ] && continue; break; fi
  [ "$st" -le 128 ] && held=
  break
done
exec 4<&-
[ -z "$held" ] || kill -KILL -- "-$reader"
wait "$reader"
[ -z "$held" ] || printf '\n%s held\n' "$3"
exit "$rc"
"""
#: The resident shell (``$1``: :data:`_BOUNDED`): for each request, a line ``TOKEN NENV LEN...``
#: and then fields of exactly those byte lengths: the working directory, ``NENV`` variables
#: (``NAME=VALUE``) and the arguments of :data:`_BOUNDED`; it runs the wrapper with exactly
#: those variables, stdin from ``/dev/null``, and ends its output with ``\nTOKEN STATUS\n``.
#: The wrapper runs in a subshell (a fork, no program), the environment reset there with
#: builtins to exactly the request's, as ``env -i`` would give a new ``bash``; ``NENV`` written
#: ``xN`` (a variable :func:`_exportable` refuses) runs it under ``env -i`` and a new ``bash``.
#: ``read -N`` (not ``-d ''``, a read(2) per byte) in the C locale: lengths are bytes. A
#: request ``TOKEN rm LEN`` and one field, a path, removes that path (``rm -rf``) without the
#: wrapper (the scratch dir at close: no output to bound, nothing of the agent's to run).
_SHELL = r"""export LC_ALL=C
wrapper=$1
eval "bounded() {
$wrapper
}"
while IFS= read -r head; do
  set -f; set -- $head; set +f
  tok=$1 n=$2; shift 2
  fields=()
  for len; do
    f=
    if [ "$len" -gt 0 ]; then IFS= read -r -N "$len" f || exit 0; fi
    fields+=("$f")
  done
  if [ "$n" = rm ]; then
    rm -rf -- "${fields[0]}" < /dev/null > /dev/null 2>&1  # (the shell is in /)
    printf '\n%s %d\n' "$tok" "$?"
    continue
  fi
  (
    cd -P -- "${fields[0]}" 2>/dev/null || { printf 'cannot enter %s\n' "${fields[0]}"; exit 1; }
    if [ "${n#x}" != "$n" ]; then
      n=${n#x}
      exec env -i "${fields[@]:1:n}" bash --norc --noprofile -c "$wrapper" bash "${fields[@]:n+1}"
    fi
    unset -v PATH LC_ALL OLDPWD
    export SHLVL=1 "${fields[@]:1:n}" || exit 126
    hash -r
    bounded "${fields[@]:n+1}"
  ) < /dev/null 2>/dev/null
  printf '\n%s %d\n' "$tok" "$?"
done
"""
#: Names of variables the resident shell cannot set with ``export`` as ``env -i`` would pass
#: them: bash's own (read-only, dynamic or set at start-up) and the shell's loop variables.
_BASH_OWN = frozenset((
    "UID", "EUID", "PPID", "GROUPS", "SHELLOPTS", "FUNCNAME", "DIRSTACK", "PIPESTATUS", "RANDOM",
    "SRANDOM", "SECONDS", "LINENO", "HISTCMD", "EPOCHSECONDS", "EPOCHREALTIME", "PWD", "OLDPWD",
    "SHLVL", "IFS", "OPTIND", "OPTARG", "OPTERR", "REPLY", "MAPFILE", "_",
    "head", "tok", "n", "fields", "len", "f", "wrapper",
))  # fmt: skip
_SHELL_NAME = re.compile(r"(?!BASH|COMP_|COPROC|READLINE_)[A-Za-z_][A-Za-z0-9_]*")


def _exportable(env: Mapping[str, str]) -> bool:
    """Whether the resident shell can give a command exactly ``env`` with builtins (the
    shell runs only with a read-only ``PATH``: ``env`` always has one)."""
    return all(_SHELL_NAME.fullmatch(k) and k not in _BASH_OWN for k in env)


#: Bytes a resident shell's answer may hold beyond the command's own limit (the wrapper's
#: lines about the cut, the time-out, a held output): more is a broken shell.
_SHELL_SLACK = 4096


class _ShellBroken(Exception):
    """The resident shell ended or answered out of protocol."""


class _ResidentShell:
    """One ``bash`` in the sandbox that runs the grader's commands one after another
    (:data:`_SHELL`); broken for good after any failure (the next ones run as one-offs)."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self._process = process
        self._lock = asyncio.Lock()

    async def run(
        self, argv: list[str], env: Mapping[str, str], cwd: str, limit: int
    ) -> tuple[bytes, int]:
        """The wrapper's output and status; :class:`_ShellBroken` (the shell is ended) if
        it cannot tell them. Cancelled, it ends the shell (its state is unknown then)."""
        async with self._lock:
            try:
                return await self._run(argv, env, cwd, limit)
            except BaseException:
                await self.close()
                raise

    async def remove(self, path: str) -> int:
        """``rm -rf PATH`` (from ``/``) in the shell, without the wrapper; its status."""
        async with self._lock:
            try:
                _, status = await self._run([], {}, path, 4096, remove=True)
                return status
            except BaseException:
                await self.close()
                raise

    async def _run(
        self, argv: list[str], env: Mapping[str, str], cwd: str, limit: int, remove: bool = False
    ) -> tuple[bytes, int]:
        stdin, stdout = self._process.stdin, self._process.stdout
        if stdin is None or stdout is None or self._process.returncode is not None:
            raise _ShellBroken("the resident shell has ended")
        token = f"[uniagent-done-{secrets.token_hex(12)}]".encode()
        fields = [os.fsencode(cwd), *(os.fsencode(f"{k}={v}") for k, v in env.items())]
        fields += [os.fsencode(a) for a in argv]
        kind = b"rm" if remove else (b"%d" if _exportable(env) else b"x%d") % len(env)
        head = b" ".join([token, kind, *(b"%d" % len(f) for f in fields)])
        try:
            stdin.write(head + b"\n" + b"".join(fields))
            await stdin.drain()
        except (ConnectionError, RuntimeError) as exc:
            raise _ShellBroken(f"the resident shell took no command: {exc}") from None
        mark, buffer = b"\n" + token + b" ", bytearray()
        while True:
            chunk = await stdout.read(1 << 16)
            if not chunk:
                raise _ShellBroken("the resident shell ended during a command")
            buffer += chunk
            at = buffer.find(mark, max(0, len(buffer) - len(chunk) - len(mark)))
            if at >= 0:
                break
            if len(buffer) > limit + _SHELL_SLACK:
                raise _ShellBroken("the resident shell's answer has no end")
        while not buffer.endswith(b"\n"):
            chunk = await stdout.read(64)
            if not chunk or len(buffer) - at > 64:
                raise _ShellBroken("the resident shell's answer is garbled")
            buffer += chunk
        status = bytes(buffer[at + len(mark) :])
        if not re.fullmatch(rb"\d+\n", status):
            raise _ShellBroken("the resident shell's answer is garbled")
        return bytes(buffer[:at]), int(status)

    async def close(self) -> None:
        """End the shell: its stdin closed, then its process group killed."""
        process = self._process
        if process.stdin is not None:
            with contextlib.suppress(Exception):
                process.stdin.close()
        if process.returncode is None:  # (not reaped: its group is still its own)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
        with contextlib.suppress(Exception):
            await process.wait()


#: Reads the regular file ``$p`` (not a symlink), at most ``$n`` bytes, as base64.
_READ = (
    '[ -f "$p" ] && [ ! -L "$p" ] || exit 66; set -o pipefail; head -c "$n" -- "$p" | base64 -w0'
)


def _stage_here(scratch: str, staged: list[tuple[str, str, str]]) -> None:
    """What :data:`_BOUNDED` does before the command, from this process where the sandbox's
    paths are the host's: the scratch dir (with ``home`` and ``tmp``, mode 0700) made where
    it is not there, each staged file decoded to its path."""
    if not os.path.isdir(scratch):
        try:
            os.mkdir(scratch, 0o700)
            os.mkdir(f"{scratch}/home", 0o700)
            os.mkdir(f"{scratch}/tmp", 0o700)
        except OSError as exc:
            raise EnvError(f"could not make the grading scratch directory {scratch}") from exc
    for kind, path, data in staged:
        try:
            if kind == "file":
                with open(data, "rb") as encoded:
                    raw = base64.b64decode(encoded.read())
                os.unlink(data)
            else:
                raw = _unescaped(data)
            with open(path, "wb") as out:
                out.write(raw)
        except (OSError, ValueError) as exc:
            raise EnvError(f"could not write {path} in the sandbox") from exc


#: Bytes :func:`_escaped` writes as they are (printable ASCII but the backslash).
_PLAIN = re.compile(rb"[^\x20-\x5b\x5d-\x7e]+")
_HEX = re.compile(r"\\x([0-9a-f]{2})")


def _escaped(data: bytes) -> str:
    """``data`` as bash's ``printf %b`` writes it back: every byte that is not printable
    ASCII, and the backslash, as ``\\xHH`` (no tab or newline: the staged lines' separators)."""
    return _PLAIN.sub(lambda m: "".join(f"\\x{b:02x}" for b in m[0]).encode(), data).decode()


def _unescaped(text: str) -> bytes:
    """The bytes of :func:`_escaped`'s ``text`` (as ``printf %b`` writes them)."""
    return _HEX.sub(lambda m: chr(int(m[1], 16)), text).encode("latin-1")


async def off_loop(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` on a worker thread: work on what the agent wrote (megabytes of patch,
    millions of paths, lines of any length) never holds the event loop, so other episodes
    and the grading timeout go on. If the caller is cancelled (the grading timeout), the
    thread finishes on its own; what runs there is linear in its input."""
    return await asyncio.to_thread(fn, *args)


class GradingReadError(EnvError):
    """A sandbox file could not be read for grading: not a regular file, too large, too slow."""


def grading_environment(
    start_env: Mapping[str, str], *, exclude_path: tuple[str, ...] = (), extra: Mapping[str, str]
) -> dict[str, str]:
    """The environment of grading commands, from the sandbox's start-up environment.

    ``exclude_path`` drops ``PATH`` entries the agent could write (its tools dir,
    its work dir); ``extra`` (the config's) is applied last.
    """
    env = {k: v for k, v in start_env.items() if not HOOK_VARIABLES.match(k)}
    path = [
        p
        for p in (start_env.get("PATH") or SYSTEM_PATH).split(":")
        if p and not any(p == x or p.startswith(x.rstrip("/") + "/") for x in exclude_path)
    ]
    env["PATH"] = ":".join(path) or SYSTEM_PATH
    env.setdefault("LANG", "C.UTF-8")
    env.update(FIXED_VARIABLES)
    env.update(extra)
    return env


@dataclass(frozen=True)
class GradingOutput:
    """A grading command's merged output and exit code; ``timed_out`` when it was killed."""

    output: str
    exit_code: int | None
    timed_out: bool = False
    #: The output was longer than the command's limit and was cut there.
    truncated: bool = False


class GradingSandbox:
    """Clean one-off shells in the sandbox, with a private scratch directory.

    Rewards get one through ``RewardContext.sandbox``; they never see the
    agent's session. ``workdir`` is the repository (or work dir) being graded.
    """

    def __init__(
        self,
        env: AgentEnv,
        environment: Mapping[str, str],
        *,
        workdir: str | None,
        scratch: str,
        timed: bool = True,
    ) -> None:
        self._env = env
        self.environment = dict(environment)
        self.workdir = workdir
        self.scratch = scratch
        #: Commands are killed when their time runs out (False: never).
        self._timed = timed
        self._cut = f"[uniagent-output-cut-{secrets.token_hex(8)}]"
        #: The scratch dir is made by the first command (none was run yet: not there).
        self._made = False
        #: Files the next command decodes first: (``file``, path, staged base64 file) or
        #: (``data``, path, :func:`_escaped` bytes), and the characters those hold.
        self._staged: list[tuple[str, str, str]] = []
        self._inline = 0
        #: The resident shell once started; ``_no_shell``: the sandbox gives none, or one
        #: broke (every command runs as a one-off from then on).
        self._shell: _ResidentShell | None = None
        self._no_shell = False
        self._read_only_paths: dict[str, tuple[str, ...] | None] = {}

    @property
    def env(self) -> AgentEnv:
        """The sandbox these shells run in."""
        return self._env

    @classmethod
    async def open(
        cls,
        env: AgentEnv,
        environment: Mapping[str, str],
        *,
        workdir: str | None,
        lazy: bool = False,
    ) -> GradingSandbox:
        """Make the scratch dir (and a fresh ``HOME`` in it) in ``env``'s sandbox.

        ``lazy``: named here and made by the first command (or before the first file is
        written into the sandbox), so that opening runs nothing: the grader's way.
        """
        scratch = f"/tmp/uniagent-grade.{secrets.token_hex(8)}"
        environment = {**environment, "HOME": f"{scratch}/home", "TMPDIR": f"{scratch}/tmp"}
        sandbox = cls(env, environment, workdir=workdir, scratch=scratch)
        if not lazy:
            await sandbox._ensure_scratch()
        return sandbox

    async def _ensure_scratch(self) -> None:
        """Make the scratch dir before a file is written into it from outside a command."""
        if not self._made:
            done = await self.run(":", timeout=60, cwd="/", resident=True)
            if done.exit_code != 0:
                raise EnvError(f"could not make a grading scratch dir: {done.output[-300:]}")

    def read_only_path(self) -> tuple[str, tuple[str, ...]] | None:
        """The grading ``PATH`` and the host sources of its directories, where every one of
        them is at or below a read-only bind that no sandbox of this process can write
        (:meth:`~uniagent.env.AgentEnv.read_only_source`: bubblewrap's system binds, never
        without isolation): then no tool can be put before the ones found, and the found
        ones cannot change. ``None`` otherwise."""
        path = self.environment.get("PATH", "")
        if path not in self._read_only_paths:
            entries = path.split(":")
            sources: tuple[str, ...] | None = ()
            if not path or any(not posixpath.isabs(entry) for entry in entries):
                sources = None
            for entry in entries:
                source = self._env.read_only_source(entry) if sources is not None else None
                sources = None if source is None or sources is None else (*sources, source)
            self._read_only_paths[path] = sources
        found = self._read_only_paths[path]
        return None if found is None else (path, found)

    async def run(
        self,
        command: str,
        *,
        timeout: float,
        cwd: str | None = None,
        max_bytes: int = OUTPUT_LIMIT,
        resident: bool = False,
    ) -> GradingOutput:
        """Run ``command`` with ``bash -c`` in a clean process (in ``cwd``, default the workdir).

        Killed with its process group after ``timeout`` s (``timed_out``); its merged
        output is cut after ``max_bytes`` bytes (``truncated``). Output that a process which
        left the group holds open more than :data:`HOLD_GRACE` s after the command ended
        makes it ``timed_out`` too (its output not used). Files staged with
        :meth:`stage_bytes` are decoded first (:class:`EnvError` where one cannot be).

        ``resident``: the command runs nothing but tools found on the grading ``PATH``
        (never the tested code, nor an interpreter or script the agent could have written),
        so it may run in the resident shell (with ``cwd`` given, where the sandbox gives
        a private process and the ``PATH`` is read-only: :meth:`read_only_path`); it runs
        the same either way.
        """
        staged, self._staged, self._inline = self._staged, [], 0
        args = [
            command,
            str(max_bytes),
            self._cut,
            f"{max(1.0, timeout):g}",
            "1" if self._timed else "",
            str(HOLD_GRACE),
            self.scratch,
            "".join(f"{kind}\t{path}\t{data}\n" for kind, path, data in staged),
        ]
        if resident and cwd is not None and await self._shell_ready():
            assert self._shell is not None
            try:
                raw, status = await wait_for(
                    self._shell.run(args, self.environment, cwd, max_bytes), timeout + 30
                )
            except asyncio.TimeoutError:
                self._shell, self._no_shell, self._made = None, True, True
                return GradingOutput(f"[killed after {timeout:g} s]", None, timed_out=True)
            except _ShellBroken as exc:
                self._shell, self._no_shell = None, True
                raise EnvError(f"the grading shell in the sandbox broke: {exc}") from None
            return self._finish(raw.decode("utf-8", "backslashreplace"), status)
        if self._env.sees_host_files():  # without isolation: no wrapper, its bounds kept here
            here = await self._run_here(command, staged, timeout, cwd or self.workdir, max_bytes)
            if here is not None:
                return here
            args[-1] = ""  # (staged already)
        argv = ["bash", "--norc", "--noprofile", "-c", _BOUNDED, "bash", *args]
        try:
            response = await self._env.execute(
                argv, env=self.environment, cwd=cwd or self.workdir, timeout=timeout + 30
            )
        except Exception as exc:
            if "CommandTimeoutError" not in {c.__name__ for c in type(exc).__mro__}:
                raise
            self._made = True  # (most likely: it is removed at close if it is there)
            return GradingOutput(f"[killed after {timeout:g} s]", None, timed_out=True)
        return self._finish(response.stdout + response.stderr, response.exit_code)

    async def _run_here(
        self,
        command: str,
        staged: list[tuple[str, str, str]],
        timeout: float,
        cwd: str | None,
        max_bytes: int,
    ) -> GradingOutput | None:
        """Without isolation (the sandbox's paths are the host's): the scratch dir made and
        the staged files written from this process, the command run with its bounds kept by
        the runtime (:meth:`~uniagent.env.AgentEnv.run_bounded`), not by :data:`_BOUNDED`'s
        processes; the same output, status, cut, time-out and held output. ``None`` where
        the runtime has no such run (the staged files are written then all the same)."""
        if staged or not os.path.isdir(self.scratch):  # (one stat: no thread hop for it)
            await off_loop(_stage_here, self.scratch, staged)
        self._made = True
        done = await self._env.run_bounded(
            command, env=self.environment, cwd=cwd, timeout=max(1.0, timeout),
            max_bytes=max_bytes, hold_grace=HOLD_GRACE,
        )  # fmt: skip
        if done is None:
            return None
        if done.held:
            note = f"[killed: the output was held open {HOLD_GRACE} s after the command ended]"
            return GradingOutput(note, None, timed_out=True)
        # (timed out only where the time ran out: a command that killed itself is not)
        output = done.output.decode("utf-8", "backslashreplace")
        return GradingOutput(output, done.exit_code, done.timed_out, done.cut > 0)

    async def _shell_ready(self) -> bool:
        """Whether a command can run in the resident shell (started here if need be): the
        grading ``PATH`` (as it is now) wholly read-only."""
        if self._no_shell:
            return False
        if self.environment.get("PATH", "") not in self._read_only_paths:
            await off_loop(self.read_only_path)  # asked once per PATH, off the event loop
        if self.read_only_path() is None:
            return False
        if self._shell is not None:
            return True
        argv = ["bash", "--norc", "--noprofile", "-c", _SHELL, "bash", _BOUNDED]
        try:
            process = await self._env.spawn_private(
                argv, env={"PATH": self.environment["PATH"]}, cwd="/"
            )
        except Exception as exc:
            log.info("no resident grading shell (%s); one-off commands instead", exc)
            process = None
        if process is None:
            self._no_shell = True
            return False
        self._shell = _ResidentShell(process)
        return True

    def _takes(self, env: AgentEnv) -> bool:
        """Whether this sandbox can take over a resident shell in ``env``."""
        return self._env is env and self._shell is None and not self._no_shell

    def _finish(self, output: str, code: int | None) -> GradingOutput:
        """The wrapper's output and status as the command's."""
        if output.startswith(f"{self._cut} noscratch\n") and code == 125:
            raise EnvError(f"could not make the grading scratch directory {self.scratch}")
        self._made = True
        if output.startswith(f"{self._cut} unstaged ") and code == 125:
            path = output.split("\n", 1)[0].removeprefix(f"{self._cut} unstaged ")
            raise EnvError(f"could not write {path} in the sandbox")
        timed_out = self._timed and code in (137, -9)
        if output.endswith(f"\n{self._cut} held\n"):
            # What was read may hold what the leftover wrote after the command: not used.
            note = f"[killed: the output was held open {HOLD_GRACE} s after the command ended]"
            return GradingOutput(note, None, timed_out=True)
        output, truncated = self._uncut(output)
        return GradingOutput(output, code, timed_out, truncated)

    def _uncut(self, output: str) -> tuple[str, bool]:
        """The output without the cut report, and whether it was cut."""
        head, sep, tail = output.rpartition(f"\n{self._cut} ")
        if sep and re.fullmatch(r"\d+\n", tail):
            return head, True
        return output, False

    async def read_bytes(
        self, path: str, *, max_bytes: int = READ_LIMIT, timeout: float = READ_TIMEOUT
    ) -> bytes:
        """A regular file of the sandbox, byte for byte, read by a command in the sandbox.

        Raises :class:`GradingReadError` for a path that is not a regular file (a
        symlink, a FIFO, a directory, missing), is larger than ``max_bytes``, or is
        not read within ``timeout`` s.
        """
        script = f"p={shlex.quote(path)} n={max_bytes + 1}\n{_READ}"
        done = await self.run(
            script,
            timeout=timeout,
            cwd="/",
            max_bytes=(max_bytes + 1) * 4 // 3 + 8,
            resident=True,
        )
        if done.timed_out:
            raise GradingReadError(f"reading {path} took longer than {timeout:g} s")
        if done.exit_code == _NOT_REGULAR:
            raise GradingReadError(f"{path} is not a regular file (or does not exist)")
        if done.exit_code != 0 or done.truncated:
            raise GradingReadError(f"could not read {path}: {done.output[-300:]}")
        try:
            data = base64.b64decode(done.output.strip(), validate=True)
        except ValueError as exc:
            raise GradingReadError(f"could not read {path}: {exc}") from None
        if len(data) > max_bytes:
            raise GradingReadError(f"{path} is larger than {max_bytes} bytes")
        return data

    async def read_file(
        self, path: str, errors: str | None = "replace", *, max_bytes: int = READ_LIMIT
    ) -> str:
        """A regular text file of the sandbox (UTF-8), read as :meth:`read_bytes` does."""
        return (await self.read_bytes(path, max_bytes=max_bytes)).decode(
            "utf-8", errors or "strict"
        )

    async def write_file(self, path: str, content: str) -> None:
        """Write a text file (UTF-8) in the sandbox."""
        await self._ensure_scratch()
        await self._env.write_file(path, content)

    async def write_bytes(self, path: str, data: bytes, *, timeout: float = 120) -> None:
        """Write a file byte for byte (sent escaped or as base64, decoded in the sandbox)."""
        await self.stage_bytes(path, data)
        done = await self.run(":", timeout=timeout, cwd="/", resident=True)
        if done.exit_code != 0:
            raise EnvError(f"could not write {path} in the sandbox: {done.output[-300:]}")

    async def stage_bytes(self, path: str, data: bytes) -> None:
        """Write a file byte for byte, as :meth:`write_bytes` does, but decoded in the sandbox
        by the next command, before it runs (no command of its own). Up to
        :data:`INLINE_BYTES` in all go with that command's arguments; more is sent as a file."""
        if self._inline + len(data) <= INLINE_BYTES:  # (at most 4 characters a byte)
            inline = _escaped(data)
            if self._inline + len(inline) <= INLINE_BYTES:
                self._inline += len(inline)
                self._staged.append(("data", path, inline))
                return
        encoded = base64.b64encode(data).decode("ascii")
        await self._ensure_scratch()
        staged = f"{path}.{secrets.token_hex(6)}.b64"
        await self._env.write_file(staged, encoded)
        self._staged.append(("file", path, staged))

    async def upload(self, local: str, remote: str) -> None:
        """Copy a local file or directory into the sandbox."""
        await self._ensure_scratch()
        await self._env.upload(local, remote)

    async def close(self, *, hand_to: GradingSandbox | None = None) -> None:
        """Remove the scratch directory (best effort; nothing to do where no command ran) and
        end the resident shell, or give it to ``hand_to``: a grading sandbox of the same
        sandbox that has none (the shell keeps nothing between commands, each brings its
        own environment and directory), which ends it when it closes."""
        shell = self._shell
        try:
            if not self._made:
                return
            with contextlib.suppress(Exception):  # the sandbox is closed right after anyway
                if shell is not None:
                    try:
                        await wait_for(shell.remove(self.scratch), 60)
                    except BaseException:
                        self._shell = None  # ended by the failure: not handed over
                        raise
                elif self._env.sees_host_files():
                    await off_loop(shutil.rmtree, self.scratch, True)
                else:
                    await self._env.execute(
                        ["rm", "-rf", "--", self.scratch], env=self.environment, timeout=60
                    )
        finally:
            intact = shell is not None and self._shell is shell  # (the removal did not break it)
            self._shell, self._no_shell = None, True
            if intact and hand_to is not None and hand_to._takes(self._env):
                hand_to._shell, shell = shell, None
            if shell is not None:
                await shell.close()
