"""The sandbox protocols: a :class:`Deployment` and its :class:`Runtime` (SWE-ReX's calls).

The models mirror ``swerex.runtime.abstract`` field for field (same names,
defaults and ``action_type``/``session_type`` discriminators), so they can be
sent to a SWE-ReX ``RemoteRuntime`` unchanged and SWE-ReX's own models can be
given to our host runtime. They are defined here so that the core does not
depend on ``swe-rex`` (an optional extra: ``pip install 'uniagent[swerex]'``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

from pydantic import BaseModel


class IsAliveResponse(BaseModel):
    """Whether a runtime answers; true in a boolean context when alive."""

    is_alive: bool
    message: str = ""

    def __bool__(self) -> bool:
        return self.is_alive


class CreateBashSessionRequest(BaseModel):
    """Open a persistent bash session named ``session``."""

    startup_source: list[str] = []
    session: str = "default"
    session_type: Literal["bash"] = "bash"
    startup_timeout: float = 1.0


class CreateBashSessionResponse(BaseModel):
    """What the session printed while starting."""

    output: str = ""
    session_type: Literal["bash"] = "bash"


class BashAction(BaseModel):
    """Run ``command`` in a session; ``timeout`` None waits forever."""

    command: str
    session: str = "default"
    timeout: float | None = None
    is_interactive_command: bool = False
    is_interactive_quit: bool = False
    check: Literal["silent", "raise", "ignore"] = "raise"
    error_msg: str = ""
    expect: list[str] = []
    action_type: Literal["bash"] = "bash"


class BashInterruptAction(BaseModel):
    """Interrupt what runs in a session (after a timeout) and get the shell back."""

    session: str = "default"
    timeout: float = 0.2
    n_retry: int = 3
    expect: list[str] = []
    action_type: Literal["bash_interrupt"] = "bash_interrupt"


class BashObservation(BaseModel):
    """A command's merged stdout/stderr and exit code (None when unknown)."""

    output: str = ""
    exit_code: int | None = None
    failure_reason: str = ""
    expect_string: str = ""
    session_type: Literal["bash"] = "bash"


class CloseBashSessionRequest(BaseModel):
    """Close the session named ``session``."""

    session: str = "default"
    session_type: Literal["bash"] = "bash"


class CloseBashSessionResponse(BaseModel):
    """Answer to :class:`CloseBashSessionRequest`."""

    session_type: Literal["bash"] = "bash"


class Command(BaseModel):
    """A one-off subprocess, like ``subprocess.run`` (not in the persistent session)."""

    command: str | list[str]
    timeout: float | None = None
    shell: bool = False
    check: bool = False
    error_msg: str = ""
    env: dict[str, str] | None = None
    cwd: str | None = None
    merge_output_streams: bool = False


@dataclass(frozen=True)
class BoundedRun:
    """What a bounded run of a command saw (``AgentEnv.run_bounded``): the output kept, the
    exit status (137 where it was killed at the time-out, 128 + N where signal N ended it),
    whether it timed out, how many bytes were cut, and whether the output was held open
    past the grace."""

    output: bytes
    exit_code: int | None
    timed_out: bool
    cut: int
    held: bool


class CommandResponse(BaseModel):
    """Result of a :class:`Command`."""

    stdout: str = ""
    stderr: str = ""
    exit_code: int | None = None


class ReadFileRequest(BaseModel):
    """Read a text file inside the sandbox."""

    path: str
    encoding: str | None = None
    errors: str | None = None


class ReadFileResponse(BaseModel):
    """The file's text."""

    content: str = ""


class WriteFileRequest(BaseModel):
    """Write a text file inside the sandbox (parents are created)."""

    content: str
    path: str


class WriteFileResponse(BaseModel):
    """Answer to :class:`WriteFileRequest`."""


class UploadRequest(BaseModel):
    """Copy a local file or directory to ``target_path`` inside the sandbox."""

    source_path: str
    target_path: str


class UploadResponse(BaseModel):
    """Answer to :class:`UploadRequest`."""


class CloseResponse(BaseModel):
    """Answer to ``close``."""


@runtime_checkable
class Runtime(Protocol):
    """What :class:`uniagent.env.AgentEnv` needs from a runtime (SWE-ReX's ``AbstractRuntime``).

    Typed with this module's models; SWE-ReX's models have the same fields and
    discriminators, so a SWE-ReX runtime serves too (the wire format is the same).
    """

    async def is_alive(self, *, timeout: float | None = None) -> IsAliveResponse:
        """Whether the runtime answers (truthy when alive)."""
        ...

    async def create_session(self, request: CreateBashSessionRequest) -> CreateBashSessionResponse:
        """Open a persistent bash session."""
        ...

    async def run_in_session(self, action: BashAction | BashInterruptAction) -> BashObservation:
        """Run a command in a session, or interrupt what runs there."""
        ...

    async def close_session(self, request: CloseBashSessionRequest) -> CloseBashSessionResponse:
        """Close a session."""
        ...

    async def execute(self, command: Command) -> CommandResponse:
        """Run a one-off subprocess (not in the persistent session)."""
        ...

    async def read_file(self, request: ReadFileRequest) -> ReadFileResponse:
        """Read a text file inside the sandbox."""
        ...

    async def write_file(self, request: WriteFileRequest) -> WriteFileResponse:
        """Write a text file inside the sandbox."""
        ...

    async def upload(self, request: UploadRequest) -> UploadResponse:
        """Copy a local file or directory into the sandbox."""
        ...

    async def close(self) -> CloseResponse:
        """Close the runtime and every session."""
        ...


class Deployment(Protocol):
    """A sandbox backend, built by ``DeploymentSpec.factory(config)``.

    :class:`uniagent.env.AgentEnv` drives it: :meth:`start`, then the
    :attr:`runtime` (a :class:`Runtime`), then :meth:`stop`. SWE-ReX
    deployments provide the first four members; a uniagent deployment adds the
    rest (``None`` / :meth:`is_alive` / a no-op where a backend cannot do more,
    said in its docs). Optionally, ``async ended_from_inside() -> bool`` says that a
    sandbox that stopped answering ended on its own (its server killed from inside:
    the policy's doing, see :meth:`uniagent.env.AgentEnv.ended_from_inside`).
    """

    async def start(self) -> None:
        """Create the sandbox and make :attr:`runtime` usable."""
        ...

    async def stop(self) -> None:
        """Tear the sandbox down, every process in it too; safe twice and after a failed start."""
        ...

    @property
    def runtime(self) -> Runtime:
        """The runtime (after :meth:`start`)."""
        ...

    async def is_alive(self) -> bool:
        """Whether the sandbox runs and its sessions answer."""
        ...

    async def sandbox_alive(self) -> bool:
        """Whether the sandbox itself runs, whatever became of its shell sessions.

        Tells a shell the agent's own command ended (the sandbox lives on:
        ``agent_killed_shell``) from a sandbox that died under it (infrastructure).
        """
        ...

    async def kill_processes(self) -> None:
        """End every process in the sandbox but the runtime serving it; files stay (grading)."""
        ...

    @property
    def workdir(self) -> str | None:
        """The episode's work dir, if the backend chose one (``EnvConfig.workdir`` overrides)."""
        ...

    @property
    def tools_dir(self) -> str | None:
        """Where tool scripts go, if the backend chose (``EnvConfig.tools_dir`` overrides)."""
        ...
