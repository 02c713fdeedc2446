"""``AgentEnv``: one episode's sandbox, as the interaction loop and rewards see it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import posixpath
import re
import secrets
import shlex
import warnings
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from pydantic import BaseModel

from uniagent.env.aio import use_pidfd_child_watcher, wait_for
from uniagent.env.config import DEFAULT_TOOLS_DIR, EnvConfig
from uniagent.env.errors import (
    ActionSyntaxError,
    ActionTimeoutError,
    EnvError,
    EnvStartError,
    NonZeroExitError,
    ShellKilledError,
    TerminalNotAliveError,
    ToolInstallError,
    check_encodable,
    setup_failure,
)
from uniagent.env.open_envs import OpenEnvs, close_open_envs, env_scope, opened, stopped
from uniagent.env.output import fit_output
from uniagent.env.runtime import (
    BashAction,
    BashInterruptAction,
    BoundedRun,
    CloseBashSessionRequest,
    Command,
    CommandResponse,
    CreateBashSessionRequest,
    Deployment,
    ReadFileRequest,
    UploadRequest,
    WriteFileRequest,
)
from uniagent.specs import ToolSpec

log = logging.getLogger(__name__)

__all__ = ["AgentEnv", "Fork", "Observation", "OpenEnvs", "close_open_envs", "env_scope"]

SESSION = "default"
#: Outputs longer than this are cleaned on a worker thread, not on the event loop.
_THREAD_CLEAN_CHARS = 65_536

# Exception class names (ours and SWE-ReX's, matched by name so swe-rex stays optional).
_SYNTAX = {"ActionSyntaxError", "BashIncorrectSyntaxError"}
_DEAD = {
    "TerminalNotAliveError",
    "EOF",  # pexpect: SWE-ReX's shell died
    "SessionDoesNotExistError",
    "SessionNotInitializedError",
    "ConnectionError",
    "ClientConnectionError",  # aiohttp: the sandbox's server is gone
}


@dataclass(frozen=True)
class Observation:
    """A command's output (cleaned, truncated) and exit code (None when unknown)."""

    output: str
    exit_code: int | None


# SWE-ReX's pexpect session ends a command at its prompt (``SHELLPS1PREFIX``), then asks
# for the exit status with one more line and waits 0.1 s for the prompt after it: on a
# busy machine that prompt comes later, the status is lost (None), and the prompt left
# over answers the next command before it ran. So on SWE-ReX's sessions the status is put
# in the prompt itself, in front of SWE-ReX's mark, and a command is run with
# check="ignore": one line sent, one prompt awaited, with the command's own timeout (what
# bashlex cannot split is sent line by line and awaited by SWE-ReX's own mark: the last
# prompt before it says the status, the one after it is read: AgentEnv._status_in_output).
_SWEREX_PS1 = "SHELLPS1PREFIX"
_RC_PS1 = f"UNIAGENTRC$?;{_SWEREX_PS1}"
_RC_AT_END = re.compile(r"UNIAGENTRC(\d+);\Z")
_RC_PROMPT = re.compile(rf"UNIAGENTRC(\d+);{_SWEREX_PS1}")
_RC_MARKS = re.compile(rf"UNIAGENTRC\d+;(?:{_SWEREX_PS1})?")


def _speaks_swerex(runtime: Any) -> bool:
    """Whether ``runtime`` is SWE-ReX's (a pexpect bash session behind it), by class."""
    return any(cls.__module__.split(".")[0] == "swerex" for cls in type(runtime).__mro__)


#: SWE-ReX's own mark (1.4): a command that bashlex cannot split is sent line by line with
#: one more line that prints it, and awaited by it, past the prompts of the lines before.
_SWEREX_MARK = "UNIQUESTRING29234"
#: Commands SWE-ReX's bashlex cannot split: one of them is awaited by SWE-ReX's own mark,
#: past any prompt left over (:meth:`AgentEnv._align`).
_UNSPLIT = ("[[ 1 ]]", "(( 1 ))", "case 1 in 1) ;; esac")


def _kind(exc: BaseException) -> str | None:
    names = {cls.__name__ for cls in type(exc).__mro__}
    if names & _SYNTAX:
        return "syntax"
    if "CommandTimeoutError" in names:  # the command still runs: interrupt it
        return "timeout"
    if names & _DEAD:
        return "dead"
    if "TimeoutError" in names:  # e.g. an HTTP timeout: try to interrupt, probe, else dead
        return "timeout"
    return None


def _syntax_message(exc: BaseException) -> str:
    extra = getattr(exc, "extra_info", None) or {}
    return str(extra.get("bash_stderr") or exc).strip()


class AgentEnv:
    """A started sandbox with one persistent bash session, tools on ``PATH``.

    Use ``async with uniagent.open_env({"type": "host"}) as env:``; or call
    :meth:`start` and, in a ``finally``, :meth:`close` (idempotent, never raises).
    """

    def __init__(
        self, deployment: Deployment, config: EnvConfig | Mapping[str, Any] | None = None
    ) -> None:
        self.deployment = deployment
        self.config = (
            config if isinstance(config, EnvConfig) else EnvConfig.model_validate(config or {})
        )
        self._started = False
        self._closed = False
        self._dead: str | None = None
        self._workdir: str | None = None
        self._tools_dir: str = DEFAULT_TOOLS_DIR
        self._installed: set[str] = set()
        self._stop_task: asyncio.Task[None] | None = None
        self._agent_stopped = False
        self._scope: OpenEnvs | None = None
        self._forked = False
        self._rc_in_prompt = False  # a SWE-ReX session whose prompt says the exit status

    @classmethod
    def from_config(
        cls,
        deployment_config: Mapping[str, Any] | BaseModel,
        env_config: EnvConfig | Mapping[str, Any] | None = None,
    ) -> AgentEnv:
        """Deprecated (until 0.4): :func:`uniagent.open_env` opens a sandbox from config.

        The sandbox layer does not look plugins up; this forwards to the front door.
        """
        import uniagent

        warnings.warn(
            "AgentEnv.from_config is deprecated since uniagent 0.3 and goes in 0.4: "
            "use uniagent.open_env(deployment, settings)",
            DeprecationWarning,
            stacklevel=2,
        )
        return uniagent.open_env(deployment_config, env_config)

    # -- properties -------------------------------------------------------------------
    @property
    def runtime(self) -> Any:
        """The deployment's runtime (SWE-ReX's ``AbstractRuntime`` interface)."""
        return self.deployment.runtime

    @property
    def workdir(self) -> str | None:
        """The episode's work dir (the session's cwd at start), if known."""
        return self._workdir

    @property
    def cwd(self) -> str | None:
        """Alias of :attr:`workdir`."""
        return self._workdir

    @property
    def tools_dir(self) -> str:
        """Where tool scripts are installed (on the session's ``PATH``)."""
        return self._tools_dir

    # -- life cycle -------------------------------------------------------------------
    async def start(self) -> None:
        """Start the sandbox, open the session, export the environment, run ``post_setup``."""
        if self._started:
            raise EnvError("this AgentEnv was already started; make a new one per episode")
        self._started = True
        self._scope = opened(self)  # so that an interrupted run can close it
        use_pidfd_child_watcher()  # no thread per subprocess on Python 3.11 (safe, idempotent)
        try:
            await wait_for(self._start(), self.config.start_timeout)
        except BaseException as exc:
            await self.close()
            if isinstance(exc, EnvStartError) or not isinstance(exc, Exception):
                raise
            if isinstance(exc, asyncio.TimeoutError):
                raise EnvStartError(
                    f"the sandbox did not start within {self.config.start_timeout:g} s "
                    "(env.start_timeout); raise it, or check the deployment"
                ) from exc
            raise EnvStartError(
                f"the sandbox failed to start: {type(exc).__name__}: {exc}"
            ) from exc

    async def _start(self) -> None:
        await self.deployment.start()
        await self.runtime.create_session(
            CreateBashSessionRequest(session=SESSION, startup_timeout=self.config.start_timeout)
        )
        await self._align(self.config.setup_timeout)
        self._workdir = self.config.workdir or self.deployment.workdir
        self._tools_dir = self.config.tools_dir or self.deployment.tools_dir or DEFAULT_TOOLS_DIR
        q = shlex.quote
        exports = " ".join(f"{k}={q(v)}" for k, v in self.config.session_env().items())
        # `test -d ... ||`: no mkdir process when the directories are there (the host
        # backend's are). Written without braces and brackets, so that the session knows
        # its syntax without `bash -n` (a process, uniagent.env.syntax); `a && b || c && d`
        # is `((a && b) || c) && d` to bash.
        tools = q(self._tools_dir)
        dirs = [tools] + ([q(self._workdir)] if self._workdir else [])
        tests = " && ".join(f"test -d {d}" for d in dirs)
        setup = f'{tests} || mkdir -p {" ".join(dirs)} && export PATH={tools}:"$PATH"'
        setup = self._status_in_prompt() + setup
        if exports:
            setup += f" && export {exports}"
        if self._workdir:
            setup += f" && cd {dirs[1]}"
        for command in (setup, *self.config.post_setup):
            obs = await self.run_action(command, timeout=self.config.setup_timeout)
            if obs.exit_code != 0:
                log.info("setup command %r exited with %s; its output:\n%s", command,
                         obs.exit_code, obs.output)  # fmt: skip
                places = getattr(self.deployment, "writable_places", None)
                raise EnvStartError(setup_failure(command, obs.exit_code, obs.output, places))

    def sees_host_files(self) -> bool:
        """Whether a path in the sandbox is the host's file at the same path (the host backend
        without isolation): this process may then read and check it directly. False by
        default, and before the sandbox starts."""
        probe = getattr(self.deployment, "sees_host_files", None)
        return bool(probe()) if probe is not None else False

    def read_only_source(self, path: str) -> str | None:
        """The host path that ``path`` shows when the sandbox (and every other of this
        process) cannot change anything at or below it, so a check of it need not be
        repeated per episode; ``None`` (the default, and always without isolation): it may
        change. The host backend under bubblewrap answers for its read-only binds."""
        probe = getattr(self.deployment, "read_only_source", None)
        return probe(path) if probe is not None else None

    async def close(self) -> None:
        """Stop the sandbox; idempotent, safe in ``finally``, logs instead of raising."""
        if self._stop_task is None:
            self._closed = True
            self._stop_task = asyncio.ensure_future(self._stop())
        # Shielded: a cancelled episode still tears its sandbox down.
        await asyncio.shield(self._stop_task)

    async def _stop(self) -> None:
        try:
            await wait_for(self.deployment.stop(), self.config.close_timeout)
        except Exception as exc:
            log.warning("stopping the sandbox failed: %s: %s", type(exc).__name__, exc)
        finally:
            stopped(self, self._scope)

    async def __aenter__(self) -> AgentEnv:
        if not (self._started and self._forked):  # a fork is started already
            await self.start()
        elif self._closed:
            raise TerminalNotAliveError("this forked environment was closed")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def is_alive(self) -> bool:
        """Whether the sandbox runs and the session has not died."""
        if self._closed or self._dead or not self._started:
            return False
        try:
            return bool(await self.deployment.is_alive())
        except Exception:
            return False

    async def sandbox_alive(self) -> bool:
        """Whether the sandbox itself still runs, whatever became of the agent's shell.

        This tells a shell the agent's own command ended (the sandbox lives on) from a
        sandbox that died under it (infrastructure). Deployments may provide
        ``sandbox_alive()``; otherwise their ``is_alive()`` is asked (for SWE-ReX
        servers that is the server, not the session).
        """
        if self._closed or not self._started:
            return False
        try:
            return bool(await self.deployment.sandbox_alive())
        except Exception:
            return False

    async def ended_from_inside(self) -> bool:
        """Whether a sandbox that is gone ended on its own, not stopped or lost from outside.

        A container whose server was killed from inside (the agent's command, or the
        tested code while grading) is the policy's doing, like a shell the agent ended
        on the host. Deployments may provide ``ended_from_inside()``; without it a
        sandbox that died counts as infrastructure.
        """
        if self._closed or not self._started:
            return False
        probe = getattr(self.deployment, "ended_from_inside", None)
        if probe is None:
            return False
        try:
            return bool(await probe())
        except Exception:
            return False

    async def stop_agent(self) -> None:
        """End the agent's session and every process it started; the sandbox's files stay.

        After this, :meth:`run_action` refuses: grading uses one-off clean shells
        (:meth:`execute`). The deployment's ``kill_processes()`` ends the processes
        that left the session's process group (``setsid``, daemons). Called again
        (a second grading), it ends whatever an earlier grading's commands left running.
        """
        if self._closed or not self._started:
            self._agent_stopped = True
            return
        if not self._agent_stopped:
            self._agent_stopped = True
            with contextlib.suppress(Exception):
                await wait_for(
                    self.runtime.close_session(CloseBashSessionRequest(session=SESSION)),
                    self.config.close_timeout,
                )
        await wait_for(self.deployment.kill_processes(), self.config.close_timeout)

    async def execute(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None,
        cwd: str | None = None,
        timeout: float | None = None,
    ) -> CommandResponse:
        """Run a one-off process in the sandbox with exactly ``env`` (nothing inherited).

        It is not the agent's session: no shell state, functions, aliases or
        variables of the agent reach it. ``env=None`` gives the sandbox's own
        start-up environment (the deployment's, never the session's). stdout and
        stderr are merged.
        """
        self._check_running()
        command = Command(
            command=list(argv),
            env=dict(env) if env is not None else None,
            cwd=cwd,
            timeout=timeout,
            merge_output_streams=True,
        )
        response: CommandResponse = await self._gone_or_raise(self.runtime.execute(command))
        return response

    def _check_running(self) -> None:
        if self._closed:
            raise TerminalNotAliveError("this environment was closed")
        if not self._started:
            raise EnvError("the environment is not started; await env.start() first")

    async def _gone_or_raise(self, work: Awaitable[Any]) -> Any:
        """``work``'s result; its failure as :class:`TerminalNotAliveError` where the
        sandbox is gone."""
        try:
            return await work
        except Exception as exc:
            if _kind(exc) == "dead" or not await self.sandbox_alive():
                raise TerminalNotAliveError(
                    f"the sandbox is gone: {type(exc).__name__}: {exc}"
                ) from exc
            raise

    async def run_bounded(
        self,
        command: str,
        *,
        env: Mapping[str, str],
        cwd: str | None,
        timeout: float,
        max_bytes: int,
        hold_grace: float,
    ) -> BoundedRun | None:
        """Run ``command`` with ``bash -c`` in the sandbox with its bounds kept by this
        process (a process group of its own, the output cut after ``max_bytes`` bytes,
        killed after ``timeout`` s, the reading stopped ``hold_grace`` s after it ended where
        a process it left holds the output): the grader's one-off commands without their
        wrapper's processes. ``None`` where the backend gives no such run (bubblewrap, where
        the command's processes are in a PID namespace of their own, containers, Modal)."""
        self._check_running()
        run = getattr(self.runtime, "run_bounded", None)
        if run is None:
            return None
        bounds = {"timeout": timeout, "max_bytes": max_bytes, "hold_grace": hold_grace}
        done: BoundedRun | None = await self._gone_or_raise(
            run(command, env=dict(env), cwd=cwd, **bounds)
        )
        return done

    async def spawn_private(
        self, argv: Sequence[str], *, env: Mapping[str, str], cwd: str = "/"
    ) -> asyncio.subprocess.Process | None:
        """A long-running process in the sandbox that the agent's processes cannot reach (a
        PID namespace of its own), with stdin and stdout pipes to this process and exactly
        ``env``; ``None`` where the backend gives none (no isolation, containers, Modal).
        The grader's resident shell (:mod:`uniagent.grading.sandbox`)."""
        self._check_running()
        spawn = getattr(self.runtime, "spawn_private", None)
        if spawn is None:
            return None
        process: asyncio.subprocess.Process | None = await spawn(list(argv), env=dict(env), cwd=cwd)
        return process

    async def start_environment(self) -> dict[str, str]:
        """The sandbox's own start-up environment: what :meth:`execute` with ``env=None``
        gives a process. Known to some deployments without running anything (the host's);
        elsewhere ``env -0`` in the sandbox reports it."""
        if self._closed:
            raise TerminalNotAliveError("this environment was closed")
        if not self._started:
            raise EnvError("the environment is not started; await env.start() first")
        known = getattr(self.deployment, "start_environment", None)
        found = known() if known is not None else None
        if found is not None:
            return dict(found)
        started = await self.execute(["env", "-0"], env=None, timeout=60)
        return dict(item.split("=", 1) for item in started.stdout.split("\0") if "=" in item)

    # -- fork -------------------------------------------------------------------------
    async def fork(self) -> Fork:
        """A new, independent sandbox in this one's state: its own started :class:`AgentEnv`.

        Its file system is a copy of this one's at the call (the work dir, the tools, the
        home and temp dirs); its shell starts in this shell's working directory with its
        exported variables and umask (not its unexported variables, functions, aliases or
        options). Processes are not carried: this shell's background jobs are listed in
        :attr:`Fork.background`. After the fork neither sees the other's writes; closing
        one leaves the other running. Fork between commands: a process of this sandbox
        that writes during the fork may leave the copy half written.

        Raises :class:`EnvError` for a backend that cannot fork (its deployment has no
        ``fork()``), and before :meth:`start` or after :meth:`stop_agent`.
        """
        self._check_usable()
        fork = getattr(self.deployment, "fork", None)
        if fork is None:
            raise EnvError(f"the {_backend(self.deployment)} sandbox backend cannot fork")
        state, cwd, umask, jobs = await self._shell_state()
        q = shlex.quote
        try:
            child = AgentEnv(await fork(), self.config)
            moved = dict(getattr(child.deployment, "moved_from", None) or {})
            try:
                await child._start_forked(self, state, moved, cwd, umask)
            except BaseException:
                await child.close()
                raise
        finally:  # (after the child's start: a backend may share files with its forks)
            with contextlib.suppress(Exception):
                await self.run_action(f"rm -f {q(state)}")
        return Fork(env=child, background=tuple(line for line in jobs if line.strip()))

    async def snapshot(self) -> Snapshot:
        """This sandbox's state, kept to start sandboxes from later (search: go back to a
        state and try again). The snapshot is a fork that nothing runs in (:meth:`fork`:
        the same files, cwd, exports and umask; no processes); each :meth:`restore` is a
        fork of it, so a layered sandbox's snapshots and restores cost what was written.
        Raises as :meth:`fork` for a backend that cannot fork."""
        return Snapshot(await self.fork())

    async def restore(self, snapshot: Snapshot) -> AgentEnv:
        """A new started sandbox in ``snapshot``'s state (this sandbox is not changed: a
        restore never rewinds a running sandbox, whose processes could not follow)."""
        return await snapshot.restore()

    async def layered(self) -> AgentEnv | None:
        """This sandbox as a layered one whose forks cost what is written from now on, not
        the size of its files; ``None`` where the backend cannot (``host`` needs bubblewrap
        and overlay mounts, i.e. root) or this sandbox is layered already.

        The returned sandbox is a fork (:meth:`fork`) whose work dir is an overlay on this
        one's. This sandbox is frozen by it: its processes are ended and :meth:`run_action`
        refuses from now on; close it after the layered one, as usual (its files stay until
        every sandbox layered on them is closed). Call it before the agent's first command:
        background processes are not carried (listed nowhere: there should be none yet).
        """
        self._check_usable()
        layered = getattr(self.deployment, "layered", None)
        can_layer = getattr(self.deployment, "can_layer", None)
        if layered is None or can_layer is None or not can_layer():
            return None
        state, cwd, umask, _ = await self._shell_state()
        self._agent_stopped = True  # frozen: nothing may write to the layers' base again
        child = AgentEnv(await layered(), self.config)
        try:
            await child._start_forked(self, state, {}, cwd, umask)
        except BaseException:
            await child.close()
            raise
        return child

    async def _shell_state(self) -> tuple[str, str, str, list[str]]:
        """This shell's state, to carry into a fork: a file (in the tools dir) with its
        exports, its cwd (shell-quoted), its umask and its background jobs."""
        q = shlex.quote
        state = posixpath.join(self._tools_dir, f".uniagent-fork-{secrets.token_hex(6)}")
        token = secrets.token_hex(6)
        mark, end = f"@@uniagent-fork-{token}@@", f"@@uniagent-fork-end-{token}@@"
        # In this shell (its state is what is carried): the exports to a file the copy
        # takes along, the cwd (shell-quoted), umask and jobs on the output, between two
        # marks; the second only when every step succeeded. The marks, not the exit status,
        # say it worked: SWE-ReX's session loses the status (None) when its prompt comes
        # late on a busy machine, and leaves the prompt in the output after them.
        capture = (
            f"export -p > {q(state)} && printf '{mark}%q\\n' \"$PWD\" && umask && jobs -l"
            f" && echo {end}"
        )
        captured = await self.run_action(capture, timeout=self.config.setup_timeout)
        _, found, tail = captured.output.partition(mark)
        body, ended, _ = tail.partition(end)
        if captured.exit_code not in (0, None) or not found or not ended:
            with contextlib.suppress(Exception):
                await self.run_action(f"rm -f {q(state)}")
            raise EnvError(f"could not read the shell's state to fork: {captured.output}")
        cwd, umask, *jobs = body.rstrip("\n").split("\n")
        return state, cwd, umask, jobs

    async def _start_forked(
        self, parent: AgentEnv, state: str, moved: Mapping[str, str], cwd: str, umask: str
    ) -> None:
        """Start on a deployment forked from ``parent``'s: its session in the parent's state."""

        def move(path: str) -> str:
            for old, new in moved.items():
                if path == old or path.startswith(old.rstrip("/") + "/"):
                    return new + path[len(old) :]
            return path

        self._started = self._forked = True
        self._scope = opened(self)
        await wait_for(
            self.runtime.create_session(
                CreateBashSessionRequest(session=SESSION, startup_timeout=self.config.start_timeout)
            ),
            self.config.start_timeout,
        )
        await self._align(self.config.setup_timeout)
        self._workdir = move(parent._workdir) if parent._workdir else None
        self._tools_dir = move(parent._tools_dir)
        self._installed = set(parent._installed)
        state = move(state)
        # cwd is shell-quoted (printf %q: backslashes, or $'...' for a control character):
        # the shell reads it back, and swaps a moved root at its start for the copy's.
        q = shlex.quote
        arms = "".join(
            f"{q(old.rstrip('/'))}/*) __ua_cwd={q(new.rstrip('/'))}"
            f'"${{__ua_cwd#{q(old.rstrip("/"))}}}";; '
            for old, new in moved.items()
        )
        # The exports name the parent's root where the copy's is meant: each value is
        # rewritten by the shell once read (``export -p`` quotes a value with `$`, `"` or
        # a backslash in it, so its text need not hold the root as written).
        swaps = "".join(
            f"__ua_old={q(old)} __ua_new={q(new)}; for __ua_v in $(compgen -e); do "
            'case "${!__ua_v}" in *"$__ua_old"*) '
            'export "$__ua_v=${!__ua_v//"$__ua_old"/"$__ua_new"}" 2>/dev/null;; esac; done; '
            for old, new in moved.items()
        )
        file = q(state)
        # (the prompt's status set again once the parent's exports replaced this shell's)
        prompt = self._status_in_prompt()
        restore = (
            f"if [ -r {file} ]; then "
            'for __ua_v in $(compgen -e); do unset "$__ua_v" 2>/dev/null; done; '
            f". {file} 2>/dev/null; {prompt}{swaps}unset __ua_v __ua_old __ua_new; rm -f {file}; "
            f"__ua_cwd={cwd}; "
            + (f'case "$__ua_cwd/" in {arms}esac; ' if arms else "")
            + f'cd -- "$__ua_cwd" && unset __ua_cwd && umask {q(umask)}; '
            "else echo 'the fork has no copy of its parent state file'; false; fi"
        )
        obs = await self.run_action(restore, timeout=self.config.setup_timeout)
        if obs.exit_code != 0:
            raise EnvStartError(f"the forked shell could not take its parent's state: {obs.output}")

    # -- commands ---------------------------------------------------------------------
    def _status_in_prompt(self) -> str:
        """The assignment that puts the exit status in a SWE-ReX session's prompt, to run
        first in the session's setup (the prompt after it has it); ``""`` elsewhere."""
        if not _speaks_swerex(self.runtime):
            return ""
        self._rc_in_prompt = True
        return f"PS1={shlex.quote(_RC_PS1)}; "

    async def _align(self, timeout: float) -> str:
        """Leave no prompt of a SWE-ReX session unread (a no-op elsewhere); what the shell
        printed meanwhile. SWE-ReX's start leaves one where the shell's first prompt is its
        mark already (no start-up file sets another ``PS1``), and a command that prints the
        mark one: a command awaiting a prompt would then be answered before it ran, and
        every later one too. A command that bashlex cannot split is awaited by SWE-ReX's own
        mark, past any prompt; exactly one prompt follows it (:meth:`_read_prompt`)."""
        if not _speaks_swerex(self.runtime):
            return ""
        for unsplit in _UNSPLIT:
            read = await self.runtime.run_in_session(
                BashAction(command=unsplit, session=SESSION, timeout=timeout, check="ignore")
            )
            if read.expect_string == _SWEREX_MARK:
                await self._read_prompt(timeout)
                return str(read.output)
        return ""  # (a bashlex that splits them all: as SWE-ReX leaves it)

    async def _read_prompt(self, timeout: float) -> None:
        """Read the one prompt that follows SWE-ReX's own mark, making none: a lone backslash
        is a continued line to the shell (``PS2`` is empty: nothing printed), which the next
        command completes (a backslash-newline is nothing to bash)."""
        backslash = BashAction(
            command="\\", session=SESSION, timeout=timeout, check="ignore",
            is_interactive_command=True,
        )  # fmt: skip
        await self.runtime.run_in_session(backslash)

    def _bash_action(self, command: str, timeout: float | None) -> BashAction:
        check = "ignore" if self._rc_in_prompt else "silent"
        return BashAction(command=command, session=SESSION, timeout=timeout, check=check)

    async def _status_in_output(self, output: str, mark: str) -> tuple[str, int | None]:
        """A SWE-ReX command's output and status, from the prompts in it (``check: ignore``;
        ``mark``: what SWE-ReX awaited); the session left with no prompt unread."""
        if mark == _SWEREX_MARK:
            # Sent line by line (bashlex could not split it): the last prompt before
            # SWE-ReX's own line says the status; the one after that line is read here.
            prompts = list(_RC_PROMPT.finditer(output))
            try:
                await self._read_prompt(self.config.probe_timeout)
            except Exception as exc:
                raise await self._death(
                    f"reading the session's prompt failed: {type(exc).__name__}: {exc}", output
                ) from exc
            return output, int(prompts[-1].group(1)) if prompts else None
        found = _RC_AT_END.search(output)
        if found is not None:
            return output[: found.start()], int(found.group(1))
        # SWE-ReX's mark in the output (`env`, `set`: PS1's value) taken for the prompt, or
        # the agent's own PS1: the rest of the output up to the prompt that says the status
        # (none: the agent's PS1), the session aligned again.
        log.info("the output holds the prompt's mark; re-aligning the session")
        rest = await self._aligned()
        prompt = _RC_PROMPT.search(rest)
        # (the mark taken for the prompt, then the rest)
        output += _SWEREX_PS1 + (rest if prompt is None else rest[: prompt.start()])
        return output, None if prompt is None else int(prompt.group(1))

    async def run_action(self, command: str, timeout: float | None = None) -> Observation:
        """Run ``command`` in the persistent session; errors are :mod:`uniagent.env.errors`'.

        Output is stdout and stderr merged, without ANSI codes or ``\\r``, cut to
        ``max_output_chars`` (head and tail). On timeout the command is
        interrupted, the session checked, and :class:`ActionTimeoutError`
        raised with the partial output.
        """
        self._check_usable()
        check_encodable(command)
        timeout = timeout if timeout is not None else self.config.action_timeout
        action = self._bash_action(command, timeout)
        try:
            obs = await self.runtime.run_in_session(action)
        except Exception as exc:
            kind = _kind(exc)
            if kind == "syntax":
                raise ActionSyntaxError(_syntax_message(exc), command) from None
            if kind == "timeout":
                partial = await self._recover()
                raise ActionTimeoutError(command, timeout, await self._clean(partial)) from None
            if kind == "dead" and self._agent_stopped:  # stop_agent() closed it under the command
                raise EnvError("the agent's session was stopped while the command ran") from exc
            if kind == "dead":
                raise await self._death(
                    f"the shell session is gone: {exc or type(exc).__name__}",
                    getattr(exc, "partial_output", ""),
                ) from exc
            raise
        output, exit_code = obs.output, obs.exit_code
        if action.check == "ignore":  # a SWE-ReX session: the status is the prompt's
            output, exit_code = await self._status_in_output(output, obs.expect_string)
        elif exit_code is None:
            # SWE-ReX's own status step returns None when its last prompt came late (0.1 s
            # budget under load) and then answers the next command from the stale prompt
            # (only before the session's set-up put the status in the prompt).
            # Interrupting drains its buffer and re-aligns it; our host runtime never
            # gets here.
            log.info("exit code unknown; re-synchronising the session")
            await self._recover()
        if self._rc_in_prompt:
            output = _RC_MARKS.sub("", output)
        return Observation(output=await self._clean(output), exit_code=exit_code)

    async def _death(self, message: str, partial: str) -> TerminalNotAliveError:
        """The error for a session that died under a command: the agent's doing or not."""
        self._dead = message
        partial = await self._clean(partial)
        if await self.sandbox_alive():
            return ShellKilledError(
                f"{message} (the sandbox still runs: the command itself ended or wedged the shell)",
                partial,
            )
        if await self.ended_from_inside():
            return ShellKilledError(
                f"{message} (the sandbox's server ended from inside during the command: the "
                "command itself ended it)",
                partial,
            )
        return TerminalNotAliveError(message, partial)

    async def _aligned(self) -> str:
        """:meth:`_align`, the session's death where it does not answer."""
        try:
            return await self._align(self.config.probe_timeout)
        except Exception as exc:
            raise await self._death(
                f"re-aligning the session failed: {type(exc).__name__}: {exc}",
                getattr(exc, "partial_output", ""),
            ) from exc

    async def _recover(self) -> str:
        """Interrupt the timed-out command and probe the session; the output so far."""
        runtime, config = self.runtime, self.config
        try:
            obs = await runtime.run_in_session(
                BashInterruptAction(
                    session=SESSION,
                    timeout=config.interrupt_timeout,
                    n_retry=config.interrupt_retries,
                )
            )
            # (SWE-ReX's interrupt takes the first prompt, a late one may follow it)
            await self._align(config.probe_timeout)
            token = secrets.token_hex(8)
            probe = await runtime.run_in_session(
                self._bash_action(f"echo {token}", config.probe_timeout)
            )
        except Exception as exc:
            raise await self._death(
                f"interrupting a timed-out command failed: {type(exc).__name__}: {exc}",
                getattr(exc, "partial_output", ""),
            ) from exc
        if token not in probe.output:
            raise await self._death(
                f"the session did not answer the liveness probe (got {probe.output[:200]!r})",
                obs.output,
            )
        return _RC_MARKS.sub("", obs.output) if self._rc_in_prompt else obs.output

    async def communicate(
        self, command: str, timeout: float | None = None, check: bool = False
    ) -> str:
        """Run ``command``, return its output; ``check`` raises :class:`NonZeroExitError`."""
        obs = await self.run_action(command, timeout=timeout)
        if check and obs.exit_code != 0:
            raise NonZeroExitError(command, obs.exit_code, obs.output)
        return obs.output

    def _check_usable(self, *, files: bool = False) -> None:
        if self._closed:
            raise TerminalNotAliveError("this environment was closed")
        if self._agent_stopped and not files:
            raise EnvError("the agent's session was stopped for grading; use execute()")
        if not self._started:
            raise EnvError(
                "the environment is not started; await env.start() (or use `async with`)"
            )
        if self._dead:
            raise TerminalNotAliveError(f"the shell session is gone: {self._dead}")

    async def _clean(self, text: str) -> str:
        if not text:
            return ""
        if len(text) > _THREAD_CLEAN_CHARS:
            return await asyncio.to_thread(self._clean_sync, text)
        return self._clean_sync(text)

    def _clean_sync(self, text: str) -> str:
        return fit_output(text, self.config.max_output_chars)

    # -- files and tools --------------------------------------------------------------
    def _path(self, path: str | Path) -> str:
        path = str(path)
        if not posixpath.isabs(path) and self._workdir:
            return posixpath.join(self._workdir, path)
        return path

    async def read_file(
        self, path: str | Path, encoding: str = "utf-8", errors: str | None = None
    ) -> str:
        """A text file of the sandbox (relative paths are under :attr:`workdir`)."""
        self._check_usable(files=True)
        request = ReadFileRequest(path=self._path(path), encoding=encoding, errors=errors)
        return (await self.runtime.read_file(request)).content

    async def write_file(self, path: str | Path, content: str) -> None:
        """Write a text file in the sandbox, creating parent dirs."""
        self._check_usable(files=True)
        await self.runtime.write_file(WriteFileRequest(path=self._path(path), content=content))

    async def upload(self, local: str | Path, remote: str | Path) -> None:
        """Copy a local file to ``remote``, or a local directory's contents into ``remote``."""
        self._check_usable(files=True)
        request = UploadRequest(source_path=str(local), target_path=self._path(remote))
        await self.runtime.upload(request)

    async def install_tools(self, tools: Sequence[ToolSpec]) -> None:
        """Upload tool scripts into :attr:`tools_dir` (executable); run each ``install`` once.

        ``install`` runs in a subshell of the session (its cwd and environment;
        an ``exit`` in it cannot end the session, its variables do not persist).
        """
        self._check_usable()
        owners: dict[str, str] = {}
        for tool in tools:
            for script in tool.scripts:
                other = owners.setdefault(Path(script).name, tool.name)
                if other != tool.name:
                    raise ToolInstallError(
                        tool.name,
                        f"its script {Path(script).name!r} has the same name as one of "
                        f"tool {other!r}; rename one of them",
                    )
        pending = [tool for tool in tools if tool.name not in self._installed]
        await self._upload_scripts(pending)
        for tool in pending:
            await self._install(tool)
            self._installed.add(tool.name)

    async def _upload_scripts(self, tools: Sequence[ToolSpec]) -> None:
        """Every tool's scripts into the tools dir, made executable by one ``chmod``."""
        targets: list[str] = []
        current = tools[0].name if tools else ""
        try:
            for tool in tools:
                current = tool.name
                for script in tool.scripts:
                    if not Path(script).is_file():
                        raise ToolInstallError(
                            tool.name, f"script {str(script)!r} does not exist locally"
                        )
                    target = posixpath.join(self._tools_dir, Path(script).name)
                    await self.upload(script, target)
                    targets.append(target)
            chmod = getattr(self.runtime, "make_executable", None)
            if targets and chmod is not None:  # the host backend: no process for it
                await chmod([self._path(target) for target in targets])
            elif targets:
                paths = " ".join(map(shlex.quote, targets))
                await self.communicate(f"chmod +x {paths}", check=True)
        except ToolInstallError:
            raise
        except Exception as exc:
            raise _install_error(current, exc) from exc

    async def _install(self, tool: ToolSpec) -> None:
        if not tool.install:
            return
        try:
            # In a subshell: an `exit` or `set -e` in it must not end the session.
            await self.communicate(
                f"(\n{tool.install}\n)", timeout=self.config.setup_timeout, check=True
            )
        except ToolInstallError:
            raise
        except Exception as exc:
            raise _install_error(tool.name, exc) from exc


@dataclass(frozen=True)
class Fork:
    """What :meth:`AgentEnv.fork` made: the started child, and what it did not carry."""

    env: AgentEnv
    #: The parent shell's background jobs at the fork (``jobs -l``), which the child does
    #: not have: processes are not carried.
    background: tuple[str, ...] = ()


class Snapshot:
    """A sandbox's state kept to start new sandboxes from later (:meth:`AgentEnv.snapshot`,
    :meth:`AgentEnv.restore`): a fork of it, idle, that nothing runs in. Close it when no
    more restores are wanted (what was restored from it runs on)."""

    def __init__(self, kept: Fork) -> None:
        self._kept = kept
        #: The background jobs the snapshot did not carry (as :attr:`Fork.background`).
        self.background = kept.background

    @property
    def closed(self) -> bool:
        return self._kept.env._closed

    async def restore(self) -> AgentEnv:
        """A new started sandbox in the snapshot's state (see :meth:`AgentEnv.restore`)."""
        if self.closed:
            raise EnvError("this snapshot is closed; nothing can be restored from it")
        return (await self._kept.env.fork()).env

    async def close(self) -> None:
        await self._kept.env.close()

    async def __aenter__(self) -> Snapshot:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def _backend(deployment: Any) -> str:
    """The backend's name (its config's ``type``), else its class name."""
    config = getattr(deployment, "config", None) or getattr(deployment, "_config", None)
    return str(getattr(config, "type", None) or type(deployment).__name__)


def _install_error(tool: str, exc: Exception) -> ToolInstallError:
    """A failure while installing ``tool``, as the :class:`ToolInstallError` it means."""
    if isinstance(exc, NonZeroExitError):
        return ToolInstallError(tool, f"{exc.command!r} exited with {exc.exit_code}", exc.output)
    if isinstance(exc, ActionTimeoutError | ActionSyntaxError | TerminalNotAliveError):
        return ToolInstallError(tool, str(exc), getattr(exc, "partial_output", ""))
    return ToolInstallError(tool, f"{type(exc).__name__}: {exc}")
