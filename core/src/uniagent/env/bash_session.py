"""A persistent bash session driven from asyncio, with a control channel commands cannot touch.

Why not SWE-ReX's ``LocalRuntime``: it drives bash through pexpect, which
blocks the event loop and waits 2 x 50 ms per command (SWE-ReX 1.4.0). Here
bash's descriptors are non-blocking and watched by the event loop, its exit
through a pidfd, so one loop drives thousands of sessions and a command costs
one round trip. bash is spawned on a worker thread: a fork/exec on the loop,
times hundreds of sessions starting together, would stall every coroutine.

bash runs interactive (``-i``) without readline or job control: SIGINT aborts
the whole command line and returns to the prompt with the working directory
and variables intact. What goes over the wire is in
:mod:`uniagent.env.bash_protocol` (commands cannot read, forge or take over
the control channel; what cannot be prevented inside one bash process is
detected and reported as :class:`~uniagent.env.errors.SessionProtocolError`),
the descriptors in :mod:`uniagent.env.bash_wire`, interrupts in
:mod:`uniagent.env.bash_stop`.

A command never runs after its caller has given up on it: a caller cancelled
before the line is written sends nothing; one cancelled later has its command
interrupted (in the background, before the next command starts), so no output
leaks into the next command. A command that timed out keeps running until
:meth:`BashSession.interrupt` (SWE-ReX's semantics).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from uniagent.env import bash_stop
from uniagent.env.aio import wait_for
from uniagent.env.bash_protocol import (
    Marker,
    OutputBuffer,
    command_prefix,
    init_line,
    quote,
    trailer,
)
from uniagent.env.bash_wire import BashWire, Line
from uniagent.env.errors import (
    ActionSyntaxError,
    CommandTimeoutError,
    EnvError,
    EnvStartError,
    SessionProtocolError,
    ShellKilledError,
    TerminalNotAliveError,
    check_encodable,
)
from uniagent.env.output import clean_output, render_output
from uniagent.env.syntax import obviously_valid

log = logging.getLogger(__name__)

#: bash flags: no startup files, no readline (no echo), interactive signal handling.
BASH_FLAGS = ("--norc", "--noprofile", "--noediting", "-i")
#: Commands longer than this are checked and quoted on a worker thread.
_THREAD_CHARS = 256 * 1024
#: Outputs longer than this many bytes are decoded on a worker thread.
_THREAD_DECODE = 1 << 20
_BASH_PATH_PREFIX = re.compile(r"^\S*/bash: ", re.M)


class BashSession:
    """One persistent ``bash`` process (optionally wrapped, e.g. in ``bwrap``)."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        buffer_limit: int = 16 * 1024 * 1024,
        pty: bool = False,
    ) -> None:
        self.argv = list(argv)
        #: Every command on the session's terminal (stdin, stdout, stderr), not just
        #: interactive ones: a pager or a prompt waits for input until the timeout.
        self.pty = pty
        self.cwd = cwd
        self.env = dict(env) if env is not None else None
        self.buffer_limit = max(buffer_limit, 1024)
        self._lock = asyncio.Lock()
        self._wire: BashWire | None = None
        self._timed_out: Line | None = None  # until interrupt()
        self._interactive: Line | None = None  # a program on the terminal
        self._cleanup: asyncio.Future[None] | None = None

    @property
    def wire(self) -> BashWire:
        """The descriptors and lines in flight (after :meth:`start`)."""
        if self._wire is None:
            raise EnvError("the bash session is not started")
        return self._wire

    @property
    def pid(self) -> int | None:
        """bash's pid (below any wrapper)."""
        return self._wire.pid if self._wire else None

    @property
    def pgid(self) -> int | None:
        """bash's process group (its commands run in it)."""
        return self._wire.pgid if self._wire else None

    @property
    def alive(self) -> bool:
        """Whether bash still runs, answers, and the session was not closed."""
        wire = self._wire
        return wire is not None and not (wire.closed or wire.exited.is_set() or wire.broken)

    # -- life cycle -------------------------------------------------------------------
    async def start(self, timeout: float = 10.0) -> str:
        """Spawn bash and wait until it answers; returns what it printed on the way."""
        env = dict(self.env if self.env is not None else os.environ)
        # No prompts until ours; no history file (it would show the host's history and
        # receive the session's).
        env.update(PS1="", PS2="", PS0="", HISTFILE="")
        wire = self._wire = BashWire(
            self.argv,
            cwd=self.cwd,
            env=env,
            buffer_limit=self.buffer_limit,
            on_orphan_prompt=self._orphan_prompt,
        )
        try:
            await wire.spawn()
        except OSError as exc:
            raise EnvStartError(f"could not start {self.argv[0]!r}: {exc}") from exc
        nonce, generation = wire.new_ids()
        line = wire.send_line(
            "init", nonce, generation, init_line(nonce, generation).encode(), None
        )
        try:
            await wait_for(asyncio.shield(line.done), timeout)
        except (asyncio.TimeoutError, TerminalNotAliveError) as exc:
            junk = wire.parser.take_junk()
            output = self._render_now(line.output)
            await self.close()
            reason = f"did not answer within {timeout:g} s"
            if isinstance(exc, TerminalNotAliveError):
                reason = "exited at start"
            raise EnvStartError(
                f"the bash session ({' '.join(self.argv[:3])} ...) {reason}; its output:\n"
                f"{output}{junk}"
            ) from None
        await asyncio.to_thread(wire.resolve_pids)
        wire.parser.take_junk()  # bash's notes about job control
        if self.pty and wire.pty_slave is None:
            await self.close()
            raise EnvStartError(
                "pty: true needs a pseudo-terminal and this machine gives none (/dev/ptmx, "
                "devpts); set pty: false"
            )
        return self._render_now(line.output)

    async def close(self) -> None:
        """Kill bash and everything in its process group; safe to call twice."""
        if self._wire is not None:
            await self._wire.close()

    # -- commands ---------------------------------------------------------------------
    async def run(self, command: str, timeout: float | None = None) -> tuple[str, int]:
        """Run ``command``; its output (stdout and stderr merged) and exit code.

        Raises :class:`CommandEncodingError` (nothing sent) for text bash cannot
        receive, :class:`ActionSyntaxError` (nothing ran), :class:`CommandTimeoutError`
        (the command still runs: call :meth:`interrupt`), :class:`SessionProtocolError`
        when the command interfered with the control channel, and
        :class:`TerminalNotAliveError` when bash is gone (its subclass
        :class:`ShellKilledError` when the command ended or disabled the shell).
        """
        prepared = await _prepare(command)
        async with self._lock:
            await self._settle()
            if self._interactive is not None:
                raise EnvError(
                    "an interactive program is running in this session; send it input "
                    "(is_interactive_command), end it (is_interactive_quit) or interrupt it"
                )
            line = self._send_command(prepared, interactive=self.pty)
            try:
                result = await wait_for(asyncio.shield(line.done), timeout)
            except asyncio.TimeoutError:
                self._timed_out = line
                raise CommandTimeoutError(
                    f"timeout after {timeout:g} s while running {command[:200]!r}; the command "
                    "still runs: send BashInterruptAction"
                ) from None
            except asyncio.CancelledError:
                self._abandon(line)
                raise
        output, code = await self._finish(line, result, command)
        if self.pty:  # a terminal's \r\n and control codes, as interactive output is cleaned
            output = await _clean(output)
        return output, code

    async def run_interactive(
        self,
        text: str,
        expect: Sequence[str] = (),
        timeout: float | None = None,
        *,
        quit: bool = False,
    ) -> tuple[str, int | None, str]:
        """Start an interactive program, or type a line to the running one.

        The program runs on a pseudo-terminal. Returns when its output matches
        one of ``expect`` (regular expressions, as pexpect's): (output before
        the match, 0, the matched text); or when it ends: (its output, its exit
        code, ""). ``quit``: ``text`` ends the program; wait for that.
        """
        patterns = [re.compile(p.encode("utf-8")) for p in expect]
        prepared = await _prepare(text)
        async with self._lock:
            await self._settle()
            line = self._interactive
            typed = line is not None  # input to a running program may be echoed back
            if line is None:
                if quit:
                    raise EnvError("no interactive program is running in this session")
                if self.wire.pty_slave is None:
                    raise EnvError("this machine has no pseudo-terminals for interactive programs")
                line = self._send_command(prepared, interactive=True)
                self._interactive = line
            else:
                self.wire.write_pty(prepared.raw + b"\n")
            line.expect = [] if quit else patterns
            try:
                matched = await self._await_expect(line, timeout, text)
            except asyncio.CancelledError:
                self._abandon(line)
                raise
        if matched is None:  # the program ended
            self._interactive = None
            output, code = await self._finish(line, line.done.result(), text)
            return clean_output(output), code, ""
        before, found = matched
        out = clean_output(before.decode("utf-8", "backslashreplace"))
        if typed and out.lstrip().startswith(text):
            out = out.lstrip()[len(text) :].lstrip("\n")
        return out, 0, found.decode("utf-8", "backslashreplace")

    async def _await_expect(
        self, line: Line, timeout: float | None, text: str
    ) -> tuple[bytes, bytes] | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not line.done.done():
            matched = self._take_match(line)
            if matched is not None:
                return matched
            left = 3600.0 if deadline is None else deadline - time.monotonic()
            if left <= 0:
                self._timed_out = line
                raise CommandTimeoutError(
                    f"timeout after {timeout:g} s while running {text[:200]!r} interactively; "
                    "it still runs: send BashInterruptAction"
                )
            await line.wait_change(left)
        return None

    @staticmethod
    def _take_match(line: Line) -> tuple[bytes, bytes] | None:
        """(output before, matched text) of the first expect pattern found; keeps what follows."""
        for pattern in line.expect:
            match = line.output.find(pattern)
            if match is not None:
                head, _, tail = line.output.take()
                data = head + tail
                line.output.feed(data[match.end() :])  # pexpect keeps what follows the match
                return data[: match.start()], match.group()
        return None

    async def _finish(
        self, line: Line, result: tuple[Marker, bool], command: str
    ) -> tuple[str, int]:
        end, cut_short = result
        code, ran, trailer_ran = _status(line, end, cut_short)
        output = await self._render(line.output, code)
        if line.tamper:
            raise SessionProtocolError(line.tamper, partial_output=output)
        if trailer_ran is False:
            raise SessionProtocolError(
                "the command kept the session from recording its end (it disabled or "
                "shadowed a shell builtin, e.g. `enable -n read` or a function named "
                "`command`, which the session restored; or a DEBUG trap with extdebug); "
                f"its exit status was {code}",
                partial_output=output,
            )
        if not ran:
            raise ActionSyntaxError(_BASH_PATH_PREFIX.sub("bash: ", output).strip(), command)
        if code is None:
            raise SessionProtocolError(
                f"the session received no exit status for the command ({end.raw!r})",
                partial_output=output,
            )
        return output, code

    async def interrupt(
        self, timeout: float = 1.0, n_retry: int = 2, expect: Sequence[str] = ()
    ) -> str:
        """Stop what runs and get the prompt back; returns the output since the command began.

        ``timeout`` is the escalation window (see :mod:`uniagent.env.bash_stop`):
        how long a signalled program may sleep without exiting, or use CPU,
        before the next signal (SIGINT ``n_retry`` times, SIGTERM, SIGKILL of
        the foreground programs). While the machine shows progress the window
        stretches, up to ``max(30, 20 * timeout)`` s overall. If bash cannot be
        brought back, the session is closed and :class:`TerminalNotAliveError`
        raised. ``expect``: see :meth:`interrupt_expecting`.
        """
        return (await self.interrupt_expecting(timeout, n_retry, expect))[0]

    async def interrupt_expecting(
        self, timeout: float = 1.0, n_retry: int = 2, expect: Sequence[str] = ()
    ) -> tuple[str, str]:
        """:meth:`interrupt`, leaving an interactive program running once its output matches
        one of ``expect`` (a REPL back at its prompt after Ctrl-C).

        Returns (the output before the match, the matched text), or (all the
        output, "") when the program was stopped.
        """
        patterns = [re.compile(p.encode("utf-8")) for p in expect]
        async with self._lock:
            if self._cleanup is not None:
                with contextlib.suppress(Exception):
                    await asyncio.shield(self._cleanup)
                self._cleanup = None
            self._check_usable()
            line = self._timed_out or self._interactive
            if line is None:
                return "", ""
            self._timed_out = None
            line.expect = patterns
            task = asyncio.ensure_future(self._stop(line, max(timeout, 0.05), n_retry))
            self._cleanup = task
            try:
                await asyncio.shield(task)
            finally:
                if task.done():
                    self._cleanup = None
            if not line.done.done():  # an expect pattern showed up: the program runs on
                matched = self._take_match(line)
                if matched is not None:
                    before, found = matched
                    out = clean_output(before.decode("utf-8", "backslashreplace"))
                    return out, found.decode("utf-8", "backslashreplace")
        end, cut_short = line.done.result()
        output = await self._render(line.output, _status(line, end, cut_short)[0])
        return (await _clean(output) if self.pty else output), ""

    async def _stop(self, line: Line, window: float, n_retry: int) -> None:
        try:
            await bash_stop.stop(self.wire, line, window, n_retry)
            if line.kind == "interactive" and line.done.done():
                self.wire.reset_pty()  # the stopped program may have left it raw
        except TerminalNotAliveError:
            raise
        except Exception as exc:  # never leave a half-stopped session behind
            partial = self._render_now(line.output)
            await self.close()
            raise TerminalNotAliveError(
                f"stopping the command failed ({type(exc).__name__}: {exc}); the session was "
                "closed",
                partial_output=partial,
            ) from exc
        finally:
            if line is self._interactive and line.done.done():
                self._interactive = None

    def _abandon(self, line: Line) -> None:
        """The caller gave up on ``line``: stop it in the background, before anything else."""
        if line is self._interactive:
            self._interactive = None
        elif line.done.done():
            return
        self._timed_out = None
        line.expect = []
        task = asyncio.ensure_future(self._stop(line, 1.0, 1))
        task.add_done_callback(lambda t: t.cancelled() or t.exception())
        self._cleanup = task

    def _orphan_prompt(self, line: Line) -> None:
        """bash is back at its prompt without the line's trailer and nobody stops it."""
        bash_stop.start_resync(self.wire, line, time.monotonic() + 30)

    async def _settle(self) -> None:
        """Before a command: finish stopping an abandoned one, let every line in flight (a
        resync) end, so that output is never attributed to the wrong line; report a
        violation seen since."""
        if self._cleanup is not None:
            task, self._cleanup = self._cleanup, None
            with contextlib.suppress(Exception):
                await asyncio.shield(task)
        if self._timed_out is None and self._interactive is None:
            for line in list(self.wire.lines):
                with contextlib.suppress(Exception):
                    await asyncio.shield(line.done)
        self._check_usable()
        if self._timed_out is not None:
            raise CommandTimeoutError(
                "the previous command timed out and still runs; send BashInterruptAction first"
            )
        wire = self.wire
        if wire.tampered is not None:
            reason, wire.tampered = wire.tampered, None
            raise SessionProtocolError(
                f"{reason}; the previous command's output and exit code were unreliable. "
                "This command was not run; send it again"
            )

    def _check_usable(self) -> None:
        wire = self.wire
        if wire.closed or wire.exited.is_set():
            raise TerminalNotAliveError(wire.death_message())
        if wire.broken is not None:
            raise ShellKilledError(wire.broken)

    def _send_command(self, prepared: _Prepared, *, interactive: bool) -> Line:
        wire = self.wire
        before, after = command_prefix(
            check=prepared.check, pty_fd=wire.pty_slave, interactive=interactive
        )
        nonce, generation = wire.new_ids()
        data = b"".join(
            (before.encode(), prepared.quoted, after.encode(), trailer(nonce, generation).encode())
        )
        return wire.send_line(
            "interactive" if interactive else "run", nonce, generation, data, None
        )

    # -- output -----------------------------------------------------------------------
    async def _render(self, buffer: OutputBuffer, exit_code: int | None) -> str:
        head, dropped, tail = buffer.take()
        return await self._render_parts(head, dropped, tail, exit_code)

    async def _render_parts(
        self, head: bytes, dropped: int, tail: bytes, exit_code: int | None
    ) -> str:
        if len(head) + len(tail) > _THREAD_DECODE:  # megabytes: not on the event loop
            return await asyncio.to_thread(
                render_output, head, dropped, tail, self.buffer_limit, exit_code
            )
        return render_output(head, dropped, tail, self.buffer_limit, exit_code)

    def _render_now(self, buffer: OutputBuffer) -> str:
        head, dropped, tail = buffer.take()
        return render_output(head, dropped, tail, self.buffer_limit, None)


async def _clean(text: str) -> str:
    if len(text) > _THREAD_DECODE:  # megabytes: not on the event loop
        return await asyncio.to_thread(clean_output, text)
    return clean_output(text)


def _status(line: Line, end: Marker, cut_short: bool) -> tuple[int | None, bool, bool | None]:
    """(exit status, whether the command ran, whether its trailer ran) from ``line``'s end.

    A cut-short line ends with its resync's marker: the status is ``$?`` after the
    abort (130), unless the line's own trailer saved one before failing (then
    "trailer ran" is False: the command disabled part of the protocol).
    """
    if not cut_short:
        if end.generation != line.generation:  # the save was skipped, the read was not
            return None, True, False
        return end.exit_code, end.ran, None
    if end.previous is not None and end.previous[2] == line.generation:
        return end.previous[0], end.previous[1], False
    return end.exit_code, True, None


@dataclass(frozen=True)
class _Prepared:
    """A command checked and quoted for the wire."""

    raw: bytes
    quoted: bytes
    check: bool  # whether bash -n must vouch for it first


async def _prepare(command: str) -> _Prepared:
    """``command`` ready to send, or :class:`CommandEncodingError` (nothing is sent)."""
    if len(command) > _THREAD_CHARS:  # quoting megabytes would stall the event loop
        return await asyncio.to_thread(_prepare_sync, command)
    return _prepare_sync(command)


def _prepare_sync(command: str) -> _Prepared:
    check_encodable(command)
    raw = command.encode("utf-8")
    return _Prepared(raw, quote(command).encode("utf-8"), not obviously_valid(command))
