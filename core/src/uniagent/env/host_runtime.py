"""The ``host`` deployment's runtime: bash sessions and file operations in one episode's sandbox.

:class:`HostRuntime` answers SWE-ReX's runtime calls (sessions, commands, files)
inside the paths and sandbox that :class:`~uniagent.env.host.HostDeployment`
laid out for it (:class:`~uniagent.env.host.EpisodeLayout`); the deployment
owns the episode directory and cgroup, the runtime what runs in them.
"""

from __future__ import annotations

import asyncio
import asyncio.subprocess
import contextlib
import os
import shlex
import shutil
import signal
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from uniagent.env.aio import wait_for
from uniagent.env.bash_session import BASH_FLAGS, BashSession
from uniagent.env.child_signals import login_signals
from uniagent.env.errors import CommandTimeoutError, EnvError, EnvStartError, NonZeroExitError
from uniagent.env.runtime import (
    BashObservation,
    BoundedRun,
    CloseBashSessionResponse,
    CloseResponse,
    CommandResponse,
    CreateBashSessionResponse,
    IsAliveResponse,
    ReadFileResponse,
    UploadResponse,
    WriteFileResponse,
)

if TYPE_CHECKING:  # pragma: no cover
    from uniagent.env.host import EpisodeLayout, HostDeploymentConfig

#: Bytes a one-off command (``execute``) may print, stdout and stderr each; beyond it the
#: command is killed: what a sandbox prints never grows this process's memory unbounded.
EXECUTE_OUTPUT_LIMIT = 1 << 30


class _OutputTooLarge(Exception):
    pass


async def _read_bounded(stream: asyncio.StreamReader | None) -> bytes:
    if stream is None:
        return b""
    chunks: list[bytes] = []
    size = 0
    while chunk := await stream.read(1 << 20):
        size += len(chunk)
        if size > EXECUTE_OUTPUT_LIMIT:
            raise _OutputTooLarge
        chunks.append(chunk)
    return b"".join(chunks)


def _close_pipes(proc: asyncio.subprocess.Process) -> None:
    """Stop reading ``proc``'s output: a process it left behind may hold the pipes open, and
    asyncio's ``wait()`` waits for them to close as well as for the exit."""
    transport = getattr(proc, "_transport", None)
    if transport is not None:
        with contextlib.suppress(Exception):
            transport.close()


async def _abandon(proc: asyncio.subprocess.Process) -> None:
    """Kill ``proc``'s process group and stop waiting for anything else that holds its output."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    _close_pipes(proc)
    with contextlib.suppress(asyncio.TimeoutError):
        await wait_for(proc.wait(), 30)


async def _bounded_communicate(proc: asyncio.subprocess.Process) -> tuple[bytes, bytes]:
    """``proc.communicate()`` that gives up past :data:`EXECUTE_OUTPUT_LIMIT` bytes."""
    out, err = await asyncio.gather(_read_bounded(proc.stdout), _read_bounded(proc.stderr))
    await proc.wait()
    return out, err


class _ExitProtocol(asyncio.subprocess.SubprocessStreamProtocol):
    """asyncio's protocol of a subprocess, with the moment the process itself exited
    (``exited``): its ``wait()`` also waits for the pipes, which a process it left behind
    may hold open."""

    def __init__(self, limit: int, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(limit=limit, loop=loop)
        self.exited: asyncio.Future[None] = loop.create_future()

    def process_exited(self) -> None:
        super().process_exited()
        if not self.exited.done():
            self.exited.set_result(None)


class HostRuntime:
    """SWE-ReX's runtime interface over :class:`BashSession` s and host file operations."""

    def __init__(self, layout: EpisodeLayout, config: HostDeploymentConfig) -> None:
        self.layout = layout
        self.config = config
        self.sessions: dict[str, BashSession] = {}
        #: Processes of :meth:`spawn_private` (ended with the sessions).
        self._spawned: set[asyncio.subprocess.Process] = set()
        self._closed = False

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    async def is_alive(self, *, timeout: float | None = None) -> IsAliveResponse:
        """Alive while not closed and no session has died."""
        if self._closed:
            return IsAliveResponse(is_alive=False, message="the runtime was closed")
        dead = [name for name, s in self.sessions.items() if not s.alive]
        if dead:
            return IsAliveResponse(is_alive=False, message=f"session(s) ended: {', '.join(dead)}")
        return IsAliveResponse(is_alive=True)

    async def create_session(self, request: Any) -> CreateBashSessionResponse:
        """Start a bash session (sourcing ``startup_source`` files)."""
        name = request.session
        if self._closed:
            raise EnvError("the host runtime is closed")
        if name in self.sessions:
            raise EnvError(f"session {name!r} already exists")
        cwd = self.layout.workdir if self.layout.bwrap is None else str(self.layout.root)
        session = BashSession(
            self.layout.wrap([self.config.bash, *BASH_FLAGS]),
            cwd=cwd,
            env=self.layout.env,
            buffer_limit=self.config.max_output_bytes,
            pty=self.config.pty,
        )
        timeout = max(request.startup_timeout, self.config.shell_start_timeout)
        output = await session.start(timeout=timeout)
        self.sessions[name] = session
        for path in request.startup_source:
            text, code = await session.run(f"source {_sh_quote(path)}", timeout=timeout)
            output += text
            if code != 0:
                raise EnvStartError(f"sourcing {path!r} failed (exit {code}): {text}")
        return CreateBashSessionResponse(output=output)

    def _session(self, name: str) -> BashSession:
        try:
            return self.sessions[name]
        except KeyError:
            raise EnvError(f"no session named {name!r}; call create_session first") from None

    async def run_in_session(self, action: Any) -> BashObservation:
        """Run a ``BashAction`` (``bash -n`` checked first) or a ``BashInterruptAction``.

        SWE-ReX's semantics: ``is_interactive_command`` starts a program on a
        terminal, or sends a line to the running one, and returns at one of the
        ``expect`` patterns (``expect_string`` says which) or when it ends;
        ``is_interactive_quit`` sends the line and waits for the program to end.
        """
        session = self._session(action.session)
        expect = list(getattr(action, "expect", None) or [])
        if getattr(action, "action_type", "bash") == "bash_interrupt":
            output, matched = await session.interrupt_expecting(
                timeout=action.timeout, n_retry=action.n_retry, expect=expect
            )
            return BashObservation(output=output, exit_code=0, expect_string=matched)
        if action.is_interactive_command or action.is_interactive_quit:
            output, code, matched = await session.run_interactive(
                action.command, expect, action.timeout, quit=action.is_interactive_quit
            )
            return BashObservation(output=output, exit_code=code, expect_string=matched)
        if expect:
            raise EnvError(
                "expect strings need is_interactive_command=True (a program that prompts)"
            )
        # The session checks the syntax itself (ActionSyntaxError), see bash_session.
        output, code = await session.run(action.command, timeout=action.timeout)
        if action.check == "raise" and code != 0:
            raise NonZeroExitError(action.command, code, output)
        return BashObservation(output=output, exit_code=None if action.check == "ignore" else code)

    async def close_session(self, request: Any) -> CloseBashSessionResponse:
        """Close one session (kills its process group); an unknown name is an error."""
        session = self.sessions.pop(request.session, None)
        if session is None:
            raise EnvError(f"no session named {request.session!r} to close")
        await session.close()
        return CloseBashSessionResponse()

    async def execute(self, command: Any) -> CommandResponse:
        """Run a one-off subprocess (inside the sandbox with bwrap)."""
        text = command.command
        if command.shell:
            argv = ["bash", "-c", text if isinstance(text, str) else shlex.join(text)]
        else:  # like subprocess.run: a string is one program name
            argv = [text] if isinstance(text, str) else list(text)
        cwd = command.cwd or self.layout.workdir
        # Like subprocess: a given env is the whole environment (grading relies on it).
        env = dict(command.env) if command.env is not None else dict(self.layout.env)
        if self.layout.bwrap is not None:
            argv, cwd = self.layout.wrap(argv, cwd), str(self.layout.root)
        else:
            argv = self.layout.wrap(argv)
        merge = (
            asyncio.subprocess.STDOUT if command.merge_output_streams else asyncio.subprocess.PIPE
        )
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=merge,
            cwd=cwd,
            env=env,
            start_new_session=True,
            preexec_fn=login_signals(),
        )
        try:
            out, err = await wait_for(_bounded_communicate(proc), command.timeout)
        except asyncio.TimeoutError:
            await _abandon(proc)
            raise CommandTimeoutError(
                f"{text!r} did not finish within {command.timeout} s"
            ) from None
        except _OutputTooLarge:
            await _abandon(proc)
            raise EnvError(
                f"{text!r} printed more than {EXECUTE_OUTPUT_LIMIT} bytes; it was killed"
            ) from None
        except BaseException:  # cancelled: leave nothing running
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            _close_pipes(proc)
            raise
        result = CommandResponse(
            stdout=out.decode("utf-8", "backslashreplace"),
            stderr=(err or b"").decode("utf-8", "backslashreplace"),
            exit_code=proc.returncode,
        )
        if command.check and proc.returncode != 0:
            raise NonZeroExitError(
                str(command.command), proc.returncode, result.stdout + result.stderr
            )
        return result

    async def run_bounded(
        self,
        command: str,
        *,
        env: dict[str, str],
        cwd: str | None,
        timeout: float,
        max_bytes: int,
        hold_grace: float,
    ) -> BoundedRun | None:
        """Run ``command`` with ``bash -c`` as the grader's wrapper
        (:data:`uniagent.grading.sandbox._BOUNDED`) runs it, its bounds kept here instead of
        by processes of its own: a process group of its own, stdin from ``/dev/null``, the
        output merged and cut after ``max_bytes`` bytes (the rest read and counted), killed
        with its group after ``timeout`` s, what is left of the group killed when it ends,
        and the reading stopped ``hold_grace`` s after that where a process that left the
        group holds the output open. ``None`` under bubblewrap (the wrapper runs inside)."""
        if self._closed:
            raise EnvError("the host runtime is closed")
        if self.layout.bwrap is not None:
            return None
        loop = asyncio.get_running_loop()
        transport, protocol = await loop.subprocess_exec(
            lambda: _ExitProtocol(1 << 16, loop),
            *self.layout.wrap(["bash", "--norc", "--noprofile", "-c", command]),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            cwd=cwd or self.layout.workdir,
            env=env,
            start_new_session=True,
            preexec_fn=login_signals(),
        )
        proc = asyncio.subprocess.Process(transport, protocol, loop)
        kept: list[bytes] = []
        more = [0]

        async def read() -> None:
            assert proc.stdout is not None
            room = max_bytes
            while chunk := await proc.stdout.read(1 << 20):
                if room > 0:
                    kept.append(chunk[:room])
                more[0] += max(0, len(chunk) - room)
                room -= len(chunk)

        reading = asyncio.ensure_future(read())
        try:
            timed_out = False
            try:
                await wait_for(asyncio.shield(protocol.exited), timeout)
            except asyncio.TimeoutError:
                timed_out = True
            with contextlib.suppress(ProcessLookupError):  # it, or what it left in its group
                os.killpg(proc.pid, signal.SIGKILL)
            await protocol.exited
            done, _ = await asyncio.wait({reading}, timeout=hold_grace)
            held = not done
            if done:
                reading.result()
        except BaseException:  # cancelled: leave nothing running
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            raise
        finally:
            if not reading.done():
                reading.cancel()
                _close_pipes(proc)
        code = transport.get_returncode()
        if code is not None and code < 0:  # killed by a signal: as bash reports it
            code = 128 - code
        return BoundedRun(b"".join(kept), 137 if timed_out else code, timed_out, more[0], held)

    async def spawn_private(
        self, argv: list[str], *, env: dict[str, str], cwd: str
    ) -> asyncio.subprocess.Process | None:
        """A long-running process in the sandbox, in a PID namespace of its own (a
        ``bwrap`` of its own: the agent's processes cannot see, signal or open its pipes
        through ``/proc``), with stdin and stdout pipes to this process (stderr dropped)
        and exactly ``env``. ``None`` without isolation: there every process of the
        sandbox could reach it. The caller ends it (closing stdin, then the process group)."""
        if self._closed:
            raise EnvError("the host runtime is closed")
        if self.layout.bwrap is None:
            return None
        process = await asyncio.create_subprocess_exec(
            *self.layout.wrap(argv, cwd),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
            cwd=str(self.layout.root),
            env=env,
            start_new_session=True,
            preexec_fn=login_signals(),
        )
        self._spawned = {p for p in self._spawned if p.returncode is None} | {process}
        return process

    async def read_file(self, request: Any) -> ReadFileResponse:
        """Read a text file (host-side, through the sandbox's mounts)."""
        path = self.layout.to_host(request.path)
        text = await asyncio.to_thread(
            path.read_text, encoding=request.encoding or "utf-8", errors=request.errors or "strict"
        )
        return ReadFileResponse(content=text)

    async def write_file(self, request: Any) -> WriteFileResponse:
        """Write a text file, creating parent dirs."""
        path = self.layout.to_host(request.path, write=True)

        def write() -> None:
            self.layout.make_parents(path)
            path.write_text(request.content, encoding="utf-8")
            self.layout.own(path)

        await asyncio.to_thread(write)
        return WriteFileResponse()

    async def upload(self, request: Any) -> UploadResponse:
        """Copy a local file to ``target_path``, or a directory's contents into it."""
        source = Path(request.source_path)
        target = self.layout.to_host(request.target_path, write=True)

        def copy() -> None:
            if source.is_dir():
                self.layout.make_parents(target)
                shutil.copytree(source, target, symlinks=True, dirs_exist_ok=True)
                if self.layout.uid is not None:
                    self.layout.own(target)
                    for here, dirs, files in os.walk(target):
                        for name in (*dirs, *files):
                            self.layout.own(Path(here, name))
            elif source.is_file():
                self.layout.make_parents(target)
                shutil.copy2(source, target)
                self.layout.own(target)
            else:
                raise EnvError(f"cannot upload {str(source)!r}: no such file or directory")

        await asyncio.to_thread(copy)
        return UploadResponse()

    async def make_executable(self, paths: Sequence[str]) -> None:
        """``chmod a+x`` on each path (files this sandbox was just given), without a process:
        each opened without following a symlink or waiting on a FIFO, and changed through
        its descriptor only if it is a regular file."""

        def chmod() -> None:
            for path in paths:
                flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK
                fd = os.open(self.layout.to_host(path, write=True), flags)
                try:
                    mode = os.fstat(fd).st_mode
                    if not stat.S_ISREG(mode):
                        raise EnvError(f"{path!r} is not a regular file; not made executable")
                    os.fchmod(fd, mode | 0o111)
                finally:
                    os.close(fd)

        await asyncio.to_thread(chmod)

    async def kill_processes(self) -> None:
        """End every session and every process of the sandbox (its cgroup); files stay."""
        sessions, self.sessions = list(self.sessions.values()), {}
        await asyncio.gather(*(s.close() for s in sessions), return_exceptions=True)
        spawned, self._spawned = self._spawned, set()
        for process in (p for p in spawned if p.returncode is None):  # (not reaped yet)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
        if self.layout.cgroup is not None:
            await asyncio.to_thread(self.layout.cgroup.kill)

    async def close(self) -> CloseResponse:
        """Close every session and end every process of the sandbox; idempotent."""
        self._closed = True
        await self.kill_processes()
        return CloseResponse()


def _sh_quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"
