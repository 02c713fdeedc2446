"""A persistent bash session driven over asyncio pipes with an end-marker protocol.

Why not SWE-ReX's ``LocalRuntime``: it drives bash through pexpect, which
blocks the event loop and waits 2 x 50 ms per command (REFERENCES.md). Here
bash's pipes are asyncio pipe transports and its exit is watched through a
pidfd: output arrives through callbacks, so one event loop drives thousands
of sessions and a command costs one pipe round trip. bash is spawned on a
worker thread: a fork/exec on the loop, times hundreds of sessions starting
together, would stall every other coroutine for seconds.

Protocol. bash runs interactive (``-i``) but without readline (``--noediting``)
and without prompts, so it behaves like a terminal where it matters: SIGINT
aborts the whole command line (a loop, a list) and returns to the prompt with
the working directory and variables intact, and bash itself ignores SIGTERM,
so SIGTERM to the process group stops only the command. Each command is sent
as ``eval '<command>' </dev/null; printf '\\036TOKEN:SEQ:%d\\036\\n' $?``: the
single-quoted ``eval`` keeps a malformed command from swallowing the marker,
``</dev/null`` keeps commands from reading the protocol's input, and the
marker (built by ``printf`` from pieces, so echoing the input never forges it)
carries the exit code. stdout and stderr share one pipe, in order.

Syntax check: a command that :func:`uniagent.env.syntax.obviously_valid`
cannot vouch for is first given to ``bash -n`` by the session itself, in the
same round trip (``if err=$("$BASH" -n <<<'<command>' 2>&1); then eval ...;
else report; fi``): the fork happens in the sandbox, never in this process.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import re
import secrets
import signal
import subprocess
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from uniagent.env.aio import pidfd_supported
from uniagent.env.errors import (
    ActionSyntaxError,
    CommandTimeoutError,
    EnvStartError,
    TerminalNotAliveError,
)
from uniagent.env.output import RUNTIME_DROP_NOTE
from uniagent.env.syntax import obviously_valid

log = logging.getLogger(__name__)

#: bash flags: no startup files, no readline (no echo), interactive signal handling.
BASH_FLAGS = ("--norc", "--noprofile", "--noediting", "-i")
#: Sent once at start: no history (nor ``!`` expansion), no prompts.
_INIT = "set +o history +H; PS1=''; PS2=''; PS0=''; unset PROMPT_COMMAND\n"
#: Time between a signal and the line that asks bash whether it is back. Writing
#: it at once could let an interactive bash's SIGINT handler discard half of it.
_SIGNAL_SETTLE_S = 0.05
_MAX_MARKER = 64
# Printed by an interactive bash without a terminal when a job dies of a signal.
#: The exit code a marker carries when ``bash -n`` rejected the command (real ones are 0-255).
_SYNTAX_ERROR = 1000
_BASH_PATH_PREFIX = re.compile(r"^\S*/bash: ", re.M)
_TTY_NOISE = re.compile(rb"bash: \[\d+: \d+ \(\d+\)\] tcsetattr: Inappropriate ioctl for device\n")


@dataclass
class _Capture:
    head: bytes | None
    dropped: int
    tail: bytes
    exit_code: int
    seq: int


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


class BashSession:
    """One persistent ``bash`` process (optionally wrapped, e.g. in ``bwrap``)."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        buffer_limit: int = 16 * 1024 * 1024,
    ) -> None:
        self.argv = list(argv)
        self.cwd = cwd
        self.env = dict(env) if env is not None else None
        self.buffer_limit = max(buffer_limit, 4 * _MAX_MARKER)
        self._token_text = secrets.token_hex(8)
        self._token = self._token_text.encode()
        self._prefix = b"\x1e" + self._token + b":"
        self._marker = re.compile(rb"\x1e" + self._token + rb":(\d+):(\d+)\x1e\n?")
        self._seq = itertools.count(1)
        self._lock = asyncio.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._stdin: asyncio.WriteTransport | None = None
        self._stdout: asyncio.ReadTransport | None = None
        self._pidfd: int | None = None
        self._exited = asyncio.Event()
        self._buf = bytearray()
        self._head: bytes | None = None
        self._dropped = 0
        self._scan = 0
        self._want: set[int] = set()
        self._fut: asyncio.Future[_Capture] | None = None
        self._eof = False
        self._busy = False  # a command timed out and was not interrupted yet
        self._closed = False
        self.pid: int | None = None  # bash itself
        self.pgid: int | None = None  # bash's process group (the commands run in it)
        self._protected: set[int] = set()  # bash and its wrappers: never signalled singly

    # -- life cycle -------------------------------------------------------------------
    async def start(self, timeout: float = 10.0) -> str:
        """Spawn bash and wait until it answers; returns what it printed on the way."""
        env = dict(self.env if self.env is not None else os.environ)
        env.update(PS1="", PS2="", PS0="")
        loop = asyncio.get_running_loop()
        try:
            self._proc = await asyncio.to_thread(self._spawn, env)
        except OSError as exc:
            raise EnvStartError(f"could not start {self.argv[0]!r}: {exc}") from exc
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._stdin, _ = await loop.connect_write_pipe(asyncio.BaseProtocol, self._proc.stdin)
        self._stdout, _ = await loop.connect_read_pipe(lambda: _Reader(self), self._proc.stdout)
        self._watch_exit(loop)
        fut = self._expect({0})
        self._write(_INIT + self._marker_line(0, "0"))
        try:
            capture = await asyncio.wait_for(asyncio.shield(fut), timeout)
        except (asyncio.TimeoutError, TerminalNotAliveError) as exc:
            output = self._decode(self._head, self._dropped, bytes(self._buf))
            await self.close()
            reason = f"did not answer within {timeout:g} s"
            if isinstance(exc, TerminalNotAliveError):
                reason = "exited at start"
            raise EnvStartError(
                f"the bash session ({' '.join(self.argv[:3])} ...) {reason}; its output:\n{output}"
            ) from None
        self._resolve_pids()
        return self._decode(capture.head, capture.dropped, capture.tail)

    def _spawn(self, env: dict[str, str]) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            self.argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd=self.cwd,
            env=env,
            start_new_session=True,  # its own process group: signals reach all it runs
        )

    def _watch_exit(self, loop: asyncio.AbstractEventLoop) -> None:
        assert self._proc is not None
        if pidfd_supported():
            self._pidfd = os.pidfd_open(self._proc.pid)
            loop.add_reader(self._pidfd, self._reap, loop)
            return
        # No pidfds (Linux < 5.3): one waiting thread per session, like asyncio's default.
        proc = self._proc
        thread = threading.Thread(
            target=lambda: (proc.wait(), loop.call_soon_threadsafe(self._on_exit)), daemon=True
        )
        thread.start()

    def _reap(self, loop: asyncio.AbstractEventLoop) -> None:
        assert self._proc is not None and self._pidfd is not None
        loop.remove_reader(self._pidfd)
        os.close(self._pidfd)
        self._pidfd = None
        try:
            _, status = os.waitpid(self._proc.pid, 0)
            self._proc.returncode = os.waitstatus_to_exitcode(status)
        except ChildProcessError:  # reaped elsewhere
            self._proc.returncode = 255
        self._on_exit()

    def _resolve_pids(self) -> None:
        assert self._proc is not None
        pid = self._proc.pid
        chain = [pid]
        # A wrapper (bwrap) runs bash as a descendant: follow the first child until bash.
        while _comm(chain[-1]) not in ("bash", "sh") and len(chain) < 5:
            children = _children(chain[-1])
            if not children:
                break
            chain.append(children[0])
        self.pid = chain[-1]
        self._protected = set(chain)
        try:
            self.pgid = os.getpgid(self.pid)
        except ProcessLookupError:
            self.pgid = pid

    @property
    def alive(self) -> bool:
        """Whether bash still runs and the session was not closed."""
        return not self._closed and not self._exited.is_set()

    async def close(self) -> None:
        """Kill bash and everything in its process group; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        self._fail_pending("the bash session was closed")
        proc = self._proc
        if proc is None:
            return
        # The spawned process leads its own group (start_new_session), so killing the
        # group kills it (bash, or bwrap, whose sandbox dies with it).
        for pgid in {self.pgid, proc.pid} - {None}:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)  # type: ignore[arg-type]
        try:
            await asyncio.wait_for(self._exited.wait(), 10)
        except asyncio.TimeoutError:
            log.warning("bash session pid %s did not exit after SIGKILL", proc.pid)
        for transport in (self._stdin, self._stdout):
            if transport is not None:
                transport.close()

    # -- commands ---------------------------------------------------------------------
    async def run(self, command: str, timeout: float | None = None) -> tuple[str, int]:
        """Run ``command``; its output (stdout and stderr merged) and exit code.

        On timeout raises :class:`CommandTimeoutError` and leaves the command
        running; call :meth:`interrupt` next. Raises
        :class:`TerminalNotAliveError` when bash has exited.
        """
        if "\x00" in command:
            raise ValueError("a command cannot contain NUL bytes")
        async with self._lock:
            self._check_usable()
            seq = next(self._seq)
            fut = self._expect({seq})
            self._write(self._command_line(command, seq))
            try:
                capture = await asyncio.wait_for(asyncio.shield(fut), timeout)
            except asyncio.TimeoutError:
                self._busy = True
                raise CommandTimeoutError(
                    f"timeout after {timeout:g} s while running {command[:200]!r}; the command "
                    "still runs: send BashInterruptAction"
                ) from None
        output = self._decode(capture.head, capture.dropped, capture.tail)
        if capture.exit_code == _SYNTAX_ERROR:
            raise ActionSyntaxError(_BASH_PATH_PREFIX.sub("bash: ", output).strip(), command)
        return output, capture.exit_code

    def _command_line(self, command: str, seq: int) -> str:
        quoted = _quote(command)
        run = f"eval {quoted} </dev/null; " + self._marker_line(seq, '"$?"', end="")
        if obviously_valid(command):
            return run + "\n"
        rejected = self._marker_line(seq, str(_SYNTAX_ERROR), end="")
        return (
            f'if __uniagent_err=$("$BASH" -n 2>&1 <<<{quoted}); then {run}; '
            f"else printf '%s\\n' \"$__uniagent_err\"; {rejected}; fi\n"
        )

    async def interrupt(self, timeout: float = 1.0, n_retry: int = 2) -> str:
        """Stop what runs and get the prompt back; returns the output since the command began.

        SIGINT to the process group (``n_retry`` times), then SIGTERM to it,
        then SIGKILL to every process of the group but bash; after each, bash
        must answer within ``timeout`` s. If it never does, the session is
        closed and :class:`TerminalNotAliveError` raised.
        """
        async with self._lock:
            self._check_usable(allow_busy=True)
            wanted: set[int] = set()
            fut = self._expect(wanted)
            stages = [signal.SIGINT] * max(1, n_retry) + [signal.SIGTERM, signal.SIGKILL]
            for sig in stages:
                await self._signal(sig)
                await asyncio.sleep(_SIGNAL_SETTLE_S)
                seq = next(self._seq)
                wanted.add(seq)
                self._write(self._marker_line(seq, "0"))
                try:
                    capture = await asyncio.wait_for(asyncio.shield(fut), timeout)
                except asyncio.TimeoutError:
                    continue
                self._busy = False
                return self._decode(capture.head, capture.dropped, capture.tail)
            partial = self._decode(self._head, self._dropped, bytes(self._buf))
        await self.close()
        raise TerminalNotAliveError(
            f"the bash session did not come back after SIGINT, SIGTERM and SIGKILL of its "
            f"commands ({timeout:g} s each); it was closed",
            partial_output=partial,
        )

    async def _signal(self, sig: int) -> None:
        if self.pgid is None:
            return
        if sig != signal.SIGKILL:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pgid, sig)
            return
        # SIGKILL would take bash with it: kill the group's other members one by one.
        members = await asyncio.to_thread(_group_members, self.pgid)
        for pid in set(members) - self._protected:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)

    def _check_usable(self, *, allow_busy: bool = False) -> None:
        if self._closed or self._exited.is_set():
            raise TerminalNotAliveError(self._death_message())
        if self._busy and not allow_busy:
            raise CommandTimeoutError(
                "the previous command timed out and still runs; send BashInterruptAction first"
            )

    def _death_message(self) -> str:
        if self._closed:
            return "the bash session was closed"
        code = self._proc.returncode if self._proc else None
        how = f"exit status {code}" if code is None or code >= 0 else f"signal {-code}"
        return (
            f"the bash session ended ({how}): a command ran `exit`, `exec` or killed the shell; "
            "the environment cannot run more commands"
        )

    # -- protocol plumbing ------------------------------------------------------------
    def _marker_line(self, seq: int, status: str, end: str = "\n") -> str:
        return f"printf '\\036%s:%s:%s\\036\\n' {self._token_text} {seq} {status}{end}"

    def _write(self, text: str) -> None:
        if self._stdin is None or self._stdin.is_closing():
            self._fail_pending(self._death_message())
            return
        self._stdin.write(text.encode("utf-8", "surrogateescape"))

    def _expect(self, seqs: set[int]) -> asyncio.Future[_Capture]:
        if self._fut is not None and not self._fut.done():
            self._fut.cancel()
        self._want = seqs
        self._fut = asyncio.get_running_loop().create_future()
        if self._exited.is_set():
            self._fail_pending(self._death_message())
        return self._fut

    def _feed(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        while True:
            start = buf.find(self._prefix, self._scan)
            if start < 0:
                self._scan = max(0, len(buf) - len(self._prefix) + 1)
                break
            match = self._marker.match(buf, start)
            if match is None:
                if len(buf) - start < _MAX_MARKER and b"\n" not in buf[start:]:
                    self._scan = start  # a marker cut in two: wait for the rest
                    break
                self._scan = start + 1
                continue
            seq, code = int(match.group(1)), int(match.group(2))
            fut = self._fut
            if fut is not None and not fut.done() and seq in self._want:
                tail, rest = bytes(buf[:start]), buf[match.end() :]
                fut.set_result(_Capture(self._head, self._dropped, tail, code, seq))
                self._fut, self._head, self._dropped, self._scan = None, None, 0, 0
                self._buf = buf = bytearray(rest)
            else:  # a marker of an interrupted command or of an earlier retry
                del buf[start : match.end()]
                self._scan = start
        self._enforce_limit()

    def _enforce_limit(self) -> None:
        # Keep the first and last buffer_limit/2 bytes; trim only when twice over
        # the budget so a flood of output costs linear, not quadratic, copying.
        half = self.buffer_limit // 2
        buf = self._buf
        if self._head is None and len(buf) > self.buffer_limit and self._scan >= half:
            self._head = bytes(buf[:half])
            del buf[:half]
            self._scan -= half
        if self._head is not None and len(buf) > 2 * half:
            cut = min(len(buf) - half, self._scan)
            if cut > 0:
                del buf[:cut]
                self._dropped += cut
                self._scan -= cut

    def _decode(self, head: bytes | None, dropped: int, tail: bytes) -> str:
        if b"tcsetattr" in tail:
            tail = _TTY_NOISE.sub(b"", tail)
        text = tail.decode("utf-8", "backslashreplace")
        if head is None:
            return text
        note = RUNTIME_DROP_NOTE.format(n=dropped, limit=self.buffer_limit)
        return head.decode("utf-8", "backslashreplace") + note + text

    def _fail_pending(self, message: str) -> None:
        fut = self._fut
        if fut is not None and not fut.done():
            partial = self._decode(self._head, self._dropped, bytes(self._buf))
            fut.set_exception(TerminalNotAliveError(message, partial_output=partial))
            fut.exception()  # retrieved: nobody may be waiting any more
        self._fut = None

    def _on_eof(self) -> None:
        self._eof = True
        if self._exited.is_set():
            self._fail_pending(self._death_message())

    def _on_exit(self) -> None:
        self._exited.set()
        if self._eof:
            self._fail_pending(self._death_message())
        else:
            # A background job may hold the pipe open; let the last output arrive first.
            asyncio.get_running_loop().call_later(
                0.2, lambda: self._fail_pending(self._death_message())
            )


class _Reader(asyncio.Protocol):
    def __init__(self, session: BashSession) -> None:
        self.session = session

    def data_received(self, data: bytes) -> None:
        self.session._feed(data)

    def eof_received(self) -> bool | None:
        self.session._on_eof()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.session._on_eof()


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def _group_members(pgid: int) -> list[int]:
    """PIDs whose process group is ``pgid`` (a /proc scan: only on the rare SIGKILL path)."""
    members = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 2 and int(fields[2]) == pgid:
            members.append(int(entry.name))
    return members
