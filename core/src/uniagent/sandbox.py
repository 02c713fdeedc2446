"""For sandbox backend authors: the typed protocols, their request models, and helpers.

A backend plugin yields a :class:`uniagent.DeploymentSpec` whose ``factory(config)``
returns a :class:`Deployment`; :class:`uniagent.AgentEnv` drives it through its
:class:`Runtime`. The models mirror SWE-ReX's field for field, so a SWE-ReX runtime
serves unchanged (:func:`make_runtime`, :func:`retrying_runtime_class`). The helpers
are what the built-in backends use: stopping every process but the runtime's own
(:func:`kill_all_but_ancestors`), and the uid bubblewrap sandboxes run as
(:data:`SANDBOX_UID`). Importing this module imports the sandbox layer, not the runner.
"""

from __future__ import annotations

from uniagent.env.config import renamed_keys
from uniagent.env.errors import (
    ActionError,
    ActionSyntaxError,
    ActionTimeoutError,
    CommandEncodingError,
    CommandTimeoutError,
    EnvError,
    EnvStartError,
    NonZeroExitError,
    ShellKilledError,
    TerminalNotAliveError,
    ToolInstallError,
)
from uniagent.env.host import SANDBOX_UID, HostDeployment, HostDeploymentConfig
from uniagent.env.killall import kill_all_but_ancestors
from uniagent.env.remote import make_runtime, retrying_runtime_class
from uniagent.env.runtime import (
    BashAction,
    BashInterruptAction,
    BashObservation,
    CloseBashSessionRequest,
    CloseBashSessionResponse,
    CloseResponse,
    Command,
    CommandResponse,
    CreateBashSessionRequest,
    CreateBashSessionResponse,
    Deployment,
    IsAliveResponse,
    ReadFileRequest,
    ReadFileResponse,
    Runtime,
    UploadRequest,
    UploadResponse,
    WriteFileRequest,
    WriteFileResponse,
)

__all__ = [
    "SANDBOX_UID",
    "ActionError",
    "ActionSyntaxError",
    "ActionTimeoutError",
    "BashAction",
    "BashInterruptAction",
    "BashObservation",
    "CloseBashSessionRequest",
    "CloseBashSessionResponse",
    "CloseResponse",
    "Command",
    "CommandEncodingError",
    "CommandResponse",
    "CommandTimeoutError",
    "CreateBashSessionRequest",
    "CreateBashSessionResponse",
    "Deployment",
    "EnvError",
    "EnvStartError",
    "HostDeployment",
    "HostDeploymentConfig",
    "IsAliveResponse",
    "NonZeroExitError",
    "ReadFileRequest",
    "ReadFileResponse",
    "Runtime",
    "ShellKilledError",
    "TerminalNotAliveError",
    "ToolInstallError",
    "UploadRequest",
    "UploadResponse",
    "WriteFileRequest",
    "WriteFileResponse",
    "kill_all_but_ancestors",
    "make_runtime",
    "renamed_keys",
    "retrying_runtime_class",
]
