"""The descriptors between this process and one bash: spawning, sending lines, routing replies.

:class:`BashWire` owns the input socket, the control socket, the output pipe,
the pseudo-terminal for interactive programs and the exit watch (a pidfd). It
turns bash's control messages (see :mod:`uniagent.env.bash_protocol`) into the
state of each :class:`Line` sent: ended, cut short, or tampered with.
It knows nothing of commands, timeouts or interrupts (see ``bash_session`` and
``bash_stop``).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import itertools
import logging
import os
import re
import signal
import socket
import struct
import subprocess
import termios
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from uniagent.env import procfs
from uniagent.env.aio import pidfd_supported, wait_for
from uniagent.env.bash_protocol import Marker, MarkerParser, OutputBuffer, new_nonce
from uniagent.env.child_signals import login_signals
from uniagent.env.errors import EnvError, ShellKilledError, TerminalNotAliveError
from uniagent.env.output import render_output

log = logging.getLogger(__name__)

_READ_CHUNK = 256 * 1024
_KNOWN_NONCES = 256


class Line:
    """One line sent to bash and what came back for it."""

    def __init__(self, kind: str, nonce: str, generation: str, output: OutputBuffer) -> None:
        self.kind = kind  # "init", "run", "interactive", "resync"
        self.nonce = nonce
        self.generation = generation
        self.output = output
        self.first_end: Marker | None = None
        self.at_prompt = False  # bash printed a prompt without running this line's trailer
        self.tamper: str | None = None
        self.written_at = time.monotonic()
        # (end marker, cut short: the line was aborted and the marker is its resync's)
        self.done: asyncio.Future[tuple[Marker, bool]] = asyncio.get_running_loop().create_future()
        self.changed = asyncio.Event()
        self.expect: list[re.Pattern[bytes]] = []
        self.signalled = False
        self.resync: asyncio.Future[None] | None = None

    def poke(self) -> None:
        """Wake whoever waits for news of this line."""
        self.changed.set()

    @property
    def back(self) -> bool:
        """Whether bash is done with the line (ended, or back at its prompt without it)."""
        return self.done.done() or self.at_prompt

    def expect_hit(self) -> bool:
        """Whether the output holds one of the line's expect patterns."""
        return any(self.output.find(p) is not None for p in self.expect)

    async def wait_change(self, timeout: float) -> bool:
        """Wait until something happens for the line (or ``timeout``); False on timeout."""
        if timeout <= 0:
            return False
        self.changed.clear()
        try:
            await wait_for(self.changed.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        return True


class BashWire:
    """The channels to one bash process, and the lines in flight on them."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        cwd: str | None,
        env: Mapping[str, str],
        buffer_limit: int,
        on_orphan_prompt: Callable[[Line], None],
    ) -> None:
        self.argv = list(argv)
        self.cwd = cwd
        self.env = dict(env)
        self.buffer_limit = buffer_limit
        self._on_orphan_prompt = on_orphan_prompt
        self.generation = itertools.count(1)
        self.proc: subprocess.Popen[bytes] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._input: socket.socket | None = None
        self._control: socket.socket | None = None
        self._out_fd: int | None = None
        self._pty_fd: int | None = None  # our end of the terminal for interactive programs
        self.pty_slave: int | None = None  # its descriptor number inside bash
        self._pty_modes: list[Any] | None = None  # the terminal's modes at start
        self._pidfd: int | None = None
        self._pending_write = bytearray()
        self.parser = MarkerParser()
        self.lines: deque[Line] = deque()
        self._known: deque[str] = deque(maxlen=_KNOWN_NONCES)
        self.known: set[str] = set()
        self.latest = ""
        self._stray = OutputBuffer(buffer_limit)
        self.exited = asyncio.Event()
        self.closed = False
        self.broken: str | None = None  # the control channel is gone (why)
        self.tampered: str | None = None  # a violation seen between commands
        self.pid: int | None = None  # bash itself
        self.pgid: int | None = None  # bash's process group (the commands run in it)
        self.protected: set[int] = set()  # bash and its wrappers: never signalled singly

    # -- life cycle -------------------------------------------------------------------
    async def spawn(self) -> None:
        """Start the process (on a thread) and watch its descriptors and exit."""
        loop = self._loop = asyncio.get_running_loop()
        self.proc = await asyncio.to_thread(self._spawn)
        assert self._control is not None and self._out_fd is not None
        loop.add_reader(self._control.fileno(), self._on_control)
        loop.add_reader(self._out_fd, self._on_output)
        if self._pty_fd is not None:
            loop.add_reader(self._pty_fd, self._on_pty)
        if pidfd_supported():
            self._pidfd = os.pidfd_open(self.proc.pid)
            loop.add_reader(self._pidfd, self._reap)
        else:  # Linux < 5.3: one waiting thread per session, like asyncio's default
            proc = self.proc
            threading.Thread(
                target=lambda: (proc.wait(), loop.call_soon_threadsafe(self._on_exit)),
                daemon=True,
            ).start()

    def _spawn(self) -> subprocess.Popen[bytes]:
        ours_in, theirs_in = socket.socketpair()
        ours_ctl, theirs_ctl = socket.socketpair()
        out_r, out_w = os.pipe()
        slave = None
        try:
            self._pty_fd, slave = os.openpty()
            _configure_pty(slave)
            with contextlib.suppress(termios.error):
                self._pty_modes = termios.tcgetattr(slave)
        except OSError as exc:  # no ptys here: interactive programs are unavailable
            log.info("no pseudo-terminal for interactive commands: %s", exc)
        try:
            proc = subprocess.Popen(
                self.argv,
                stdin=theirs_in.fileno(),
                stdout=out_w,
                stderr=theirs_ctl.fileno(),
                pass_fds=(slave,) if slave is not None else (),
                cwd=self.cwd,
                env=self.env,
                start_new_session=True,  # its own process group: signals reach all it runs
                preexec_fn=login_signals(),  # no signal blocked or ignored
            )
        except BaseException:
            ours_in.close()
            ours_ctl.close()
            os.close(out_r)
            if self._pty_fd is not None:
                os.close(self._pty_fd)
                self._pty_fd = None
            raise
        finally:
            theirs_in.close()
            theirs_ctl.close()
            os.close(out_w)
            if slave is not None:
                os.close(slave)
        self.pty_slave = slave
        # One-way channels: bash writing to its stdin or reading its stderr gets EPIPE/EOF.
        ours_in.shutdown(socket.SHUT_RD)
        ours_ctl.shutdown(socket.SHUT_WR)
        ours_in.setblocking(False)
        ours_ctl.setblocking(False)
        os.set_blocking(out_r, False)
        if self._pty_fd is not None:
            os.set_blocking(self._pty_fd, False)
        self._input, self._control, self._out_fd = ours_in, ours_ctl, out_r
        return proc

    def resolve_pids(self) -> None:
        """Find bash below its wrappers (bwrap), and its process group."""
        assert self.proc is not None
        # bash is the program given just before its flags; wrappers (a cgroup shell, bwrap)
        # exec into it or run it as a descendant.
        name = next(
            (os.path.basename(a)[:15] for a, b in zip(self.argv, self.argv[1:]) if b == "--norc"),
            "bash",
        )
        chain = [self.proc.pid]
        while procfs.comm(chain[-1]) != name and len(chain) < 8:
            kids = procfs.children(chain[-1])
            if not kids:
                break
            chain.append(kids[0])
        self.pid = chain[-1]
        self.protected = set(chain)
        # bash and all it starts never preempt this process on waking (SCHED_BATCH: no
        # wake-up preemption). Each write of a command to bash wakes it; as a normal task
        # it would take the CPU from the event loop at once, so that a thousand sessions
        # cost a thousand context switches per round and each stalls every other session.
        with contextlib.suppress(OSError, AttributeError):
            os.sched_setscheduler(self.pid, os.SCHED_BATCH, os.sched_param(0))
        try:
            self.pgid = os.getpgid(self.pid)
        except ProcessLookupError:
            self.pgid = self.proc.pid

    def _reap(self) -> None:
        assert self.proc is not None and self._pidfd is not None and self._loop is not None
        self._loop.remove_reader(self._pidfd)
        os.close(self._pidfd)
        self._pidfd = None
        try:
            _, status = os.waitpid(self.proc.pid, 0)
            self.proc.returncode = os.waitstatus_to_exitcode(status)
        except ChildProcessError:  # reaped elsewhere
            self.proc.returncode = 255
        self._on_exit()

    def still_running(self) -> bool:
        """Whether the spawned process runs (peeked at, not reaped: the exit watch reaps)."""
        if self.closed or self.exited.is_set() or self.proc is None:
            return False
        try:
            flags = os.WEXITED | os.WNOHANG | os.WNOWAIT
            return os.waitid(os.P_PID, self.proc.pid, flags) is None
        except ChildProcessError:
            return False

    def death_message(self) -> str:
        """Why the session cannot run commands."""
        if self.closed:
            return "the bash session was closed"
        code = self.proc.returncode if self.proc else None
        how = f"exit status {code}" if code is None or code >= 0 else f"signal {-code}"
        return f"the bash session ended ({how})"

    async def close(self) -> None:
        """Kill bash and everything in its process group; safe to call twice."""
        if self.closed:
            return
        self.closed = True
        self.fail_all(TerminalNotAliveError("the bash session was closed"))
        proc = self.proc
        if proc is None:
            return
        # The spawned process leads its own group (start_new_session), so killing the
        # group kills it (bash, or bwrap, whose sandbox dies with it).
        for pgid in {self.pgid, proc.pid} - {None}:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)  # type: ignore[arg-type]
        try:
            await wait_for(self.exited.wait(), 10)
        except asyncio.TimeoutError:
            log.warning("bash session pid %s did not exit after SIGKILL", proc.pid)
        # Closed on a worker thread: closing a pseudo-terminal's master hangs it up, about
        # half a millisecond of the kernel's (a thousand sessions closing at once: half a
        # second of the event loop).
        held = self._release()
        try:
            await asyncio.to_thread(_close_all, held)
        except RuntimeError:  # the loop's executor is shut down (the loop is ending)
            _close_all(held)

    def _release(self) -> list[int | socket.socket]:
        """Stop watching the session's descriptors; the descriptors and sockets to close."""
        loop = self._loop
        usable = loop is not None and not loop.is_closed()
        held: list[int | socket.socket] = []
        for fd in (self._out_fd, self._pty_fd):
            if fd is not None:
                if usable:
                    loop.remove_reader(fd)  # type: ignore[union-attr]
                held.append(fd)
        self._out_fd = self._pty_fd = None
        for sock in (self._input, self._control):
            if sock is not None:
                if usable:
                    loop.remove_reader(sock.fileno())  # type: ignore[union-attr]
                    loop.remove_writer(sock.fileno())  # type: ignore[union-attr]
                held.append(sock)
        self._input = self._control = None
        return held

    # -- sending ----------------------------------------------------------------------
    def new_ids(self) -> tuple[str, str]:
        """A fresh (nonce, generation) for the next line."""
        return new_nonce(), str(next(self.generation))

    def send_line(
        self, kind: str, nonce: str, generation: str, data: bytes, output: OutputBuffer | None
    ) -> Line:
        """Write ``data`` (one line, whose trailer reads ``nonce``) and track it."""
        buffer = output or OutputBuffer(self.buffer_limit)
        if output is None and len(self._stray):  # background output since the last line
            head, dropped, tail = self._stray.take()
            buffer.feed(head)
            buffer.dropped += dropped
            buffer.feed(tail)
        line = Line(kind, nonce, generation, buffer)
        if len(self._known) == self._known.maxlen:
            self.known.discard(self._known[0])
        self._known.append(nonce)
        self.known.add(nonce)
        self.lines.append(line)
        if self.exited.is_set() or self._input is None:
            self.resolve_error(line, TerminalNotAliveError(self.death_message()))
        else:
            self._write(data)  # one write: bash reads and parses the line in one go
        return line

    def _write(self, data: bytes) -> None:
        sock = self._input
        assert sock is not None and self._loop is not None
        if self._pending_write:
            self._pending_write += data
            return
        try:
            sent = sock.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as exc:
            self.fail_all(TerminalNotAliveError(f"{self.death_message()}: {exc}"))
            return
        if sent < len(data):
            self._pending_write += data[sent:]
            self._loop.add_writer(sock.fileno(), self._flush)

    def _flush(self) -> None:
        sock = self._input
        if sock is None or self._loop is None:
            return
        try:
            sent = sock.send(self._pending_write)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._pending_write.clear()
            self._loop.remove_writer(sock.fileno())
            self.fail_all(TerminalNotAliveError(f"{self.death_message()}: {exc}"))
            return
        del self._pending_write[:sent]
        if not self._pending_write:
            self._loop.remove_writer(sock.fileno())

    def unread(self) -> int:
        """Bytes sent to bash that it has not read yet."""
        if self._pending_write:
            return len(self._pending_write)
        if self._input is None:
            return 0
        try:
            buf = fcntl.ioctl(self._input.fileno(), termios.TIOCOUTQ, b"\0\0\0\0")
        except OSError:
            return 0
        return int(struct.unpack("i", buf)[0])

    def write_pty(self, data: bytes) -> None:
        """Type ``data`` on the interactive program's terminal."""
        if self._pty_fd is None:
            raise EnvError("the session's terminal is gone")
        view = memoryview(data)
        while view:  # interactive input is small; a full terminal buffer means a stuck program
            try:
                n = os.write(self._pty_fd, view)
            except BlockingIOError:
                raise EnvError("the interactive program does not read its input") from None
            view = view[n:]

    def reset_pty(self) -> None:
        """Give the terminal back its modes of the start (a killed program may leave it raw)."""
        if self._pty_fd is not None and self._pty_modes is not None:
            with contextlib.suppress(termios.error, OSError):  # on the master: the slave's
                termios.tcsetattr(self._pty_fd, termios.TCSANOW, self._pty_modes)

    # -- receiving --------------------------------------------------------------------
    def _on_output(self) -> None:
        self._drain(self._out_fd, eof_is_break=True)

    def _on_pty(self) -> None:
        self._drain(self._pty_fd, eof_is_break=False)

    def _drain(self, fd: int | None, *, eof_is_break: bool, limit: int = 64) -> None:
        for _ in range(limit):
            if fd is None:
                return
            try:
                data = os.read(fd, _READ_CHUNK)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # a terminal whose other side is closed
                data = b""
            if not data:
                if self._loop is not None:
                    self._loop.remove_reader(fd)
                if eof_is_break and self.still_running():
                    self.broken = "the command closed the shell's output descriptor"
                return
            if self.lines:
                self.lines[0].output.feed(data)
                self.lines[0].poke()
            else:
                self._stray.feed(data)
            if fd == self._out_fd and len(data) < _READ_CHUNK:
                # A short read empties a pipe: no read to learn that. Not a terminal's: a pty
                # master returns at most ~4 KiB a read however much waits, and the explicit
                # drains (a line's marker, the shell's exit) must read all of it.
                return

    def _on_control(self) -> None:
        sock = self._control
        if sock is None:
            return
        try:
            data = sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            if self._loop is not None:
                self._loop.remove_reader(sock.fileno())
            if self.still_running():
                self.broken = "the command closed the shell's control descriptor"
                self.fail_all(ShellKilledError(self.broken))
            return
        for marker in self.parser.feed(data):
            self._on_marker(marker)

    def _on_marker(self, marker: Marker) -> None:
        lines = self.lines
        if marker.kind != "E":
            return
        index = next((i for i, ln in enumerate(lines) if ln.nonce == marker.nonce), None)
        if index is not None:
            line = lines[index]
            if line.first_end is None:  # the line's prompt; the empty line's comes next
                line.first_end = marker
                line.poke()
                return
            if marker.raw != line.first_end.raw:
                line.tamper = (
                    "the command forged an end marker of the session (two different ones "
                    "arrived); its output and exit code are unreliable"
                )
            # Everything the line printed came before its prompt: read it now.
            self._drain(self._out_fd, eof_is_break=True, limit=16)
            self._drain(self._pty_fd, eof_is_break=False, limit=16)
            for _ in range(index):  # lines before it were cut short (interrupted)
                skipped = lines.popleft()
                skipped.at_prompt = True
                if not skipped.done.done():
                    skipped.done.set_result((marker, True))
                skipped.poke()
            done = lines.popleft()
            self.latest = done.nonce
            if not done.done.done():
                done.done.set_result((marker, False))
            done.poke()
            return
        if marker.nonce in self.known:
            if lines:  # bash back at its prompt without the trailer: the line was aborted
                head = lines[0]
                head.at_prompt = True
                head.poke()
                if head.kind in ("run", "interactive") and not head.signalled:
                    self._on_orphan_prompt(head)  # aborted by itself (`kill -INT $$`)
            elif marker.nonce != self.latest:
                self.tampered = "an end marker of an earlier command arrived between commands"
            return
        reason = "a message the session never issued reached its control channel (forged)"
        if lines:
            lines[0].tamper = f"the command wrote to the session's control channel: {reason}"
            lines[0].poke()
        else:
            self.tampered = reason

    def resolve_error(self, line: Line, exc: BaseException) -> None:
        """End ``line`` with ``exc``."""
        if not line.done.done():
            line.done.set_exception(exc)
            line.done.exception()  # retrieved: the caller may have gone
        line.poke()

    def fail_all(self, exc: TerminalNotAliveError) -> None:
        """End every line in flight: the shell is gone (their commands' doing, unless closed)."""
        while self.lines:
            line = self.lines.popleft()
            head, dropped, tail = line.output.take()
            partial = render_output(head, dropped, tail, self.buffer_limit, None)
            if line.kind in ("run", "interactive") and not self.closed:
                error: TerminalNotAliveError = ShellKilledError(
                    f"the command ended the shell: {exc}", partial_output=partial
                )
            else:
                error = type(exc)(str(exc), partial_output=partial)
            self.resolve_error(line, error)

    def _on_exit(self) -> None:
        self.exited.set()
        # Output and messages still in the pipes arrive before the waiters fail.
        self._drain(self._out_fd, eof_is_break=False, limit=16)
        self._drain(self._pty_fd, eof_is_break=False, limit=16)
        if self._control is not None:
            with contextlib.suppress(OSError):
                while data := self._control.recv(65536):
                    for marker in self.parser.feed(data):
                        self._on_marker(marker)
        self.fail_all(TerminalNotAliveError(self.death_message()))

    def diagnose(self) -> str:
        """Why bash stopped answering, as far as /proc tells."""
        base = "the shell no longer answers its control protocol"
        if self.pid is None:
            return base
        for fd in (0, 2):
            target = procfs.fd_target(self.pid, fd)
            if target is None or not target.startswith("socket:"):
                return (
                    f"{base}: the command closed or replaced the shell's descriptor {fd} "
                    f"(now {target or 'closed'})"
                )
        return (
            f"{base}: a command disabled it (a read-only PS1 or PROMPT_COMMAND, a DEBUG trap "
            "with extdebug, or a disabled builtin)"
        )


def _configure_pty(fd: int) -> None:
    """A wide terminal that does not echo (programs with readline echo themselves)."""
    with contextlib.suppress(OSError):
        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 200, 0, 0))
    with contextlib.suppress(termios.error):
        attrs = termios.tcgetattr(fd)
        attrs[3] &= ~(termios.ECHO | termios.ECHONL)
        termios.tcsetattr(fd, termios.TCSANOW, attrs)


def _close_all(held: list[int | socket.socket]) -> None:
    """Close descriptors and sockets (each once; one that fails does not stop the rest)."""
    for item in held:
        with contextlib.suppress(OSError):
            if isinstance(item, socket.socket):
                item.close()
            else:
                os.close(item)
