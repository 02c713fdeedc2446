"""Errors of the sandbox layer.

:class:`EnvStartError`, :class:`ToolInstallError`: ``env_error`` (infrastructure; the
episode ends). Each error of running one of the agent's actions is an
:class:`ActionError`, which carries what the model is shown
(:meth:`ActionError.observation`) or the exit reason that ends the episode
(``ends_with``), so an agent's loop handles them all in one place:

- :class:`ActionSyntaxError`: fed back (nothing ran; bash's message goes back to the
  model and the episode goes on).
- :class:`CommandEncodingError`: nothing ran; fed back to the model.
- :class:`SessionProtocolError`: the command interfered with the session's control
  channel; its output and exit code are unreliable, the session was resynchronised and
  the message goes back to the model.
- :class:`ActionTimeoutError`: the command was interrupted, the session kept; fed back
  (the loop ends the episode with ``timeout_error`` once its timeout budget is spent).
- :class:`TerminalNotAliveError`: ``terminal_not_alive`` (the episode ends, masked); its
  subclass :class:`ShellKilledError`: ``agent_killed_shell`` (the agent's own command
  ended the shell; trained on).
"""

from __future__ import annotations

import re
from typing import ClassVar

from uniagent.errors import UniAgentError
from uniagent.exit import ExitReason


class EnvError(UniAgentError):
    """Base class of the sandbox errors."""


class EnvStartError(EnvError):
    """The sandbox could not be started (deployment, session or setup commands)."""


class ToolInstallError(EnvError):
    """A tool's scripts could not be uploaded or its ``install`` command failed."""

    def __init__(self, tool: str, message: str, output: str = "") -> None:
        self.tool = tool
        self.output = output
        text = f"installing tool {tool!r} failed: {message}"
        if output:
            text += f"\n---- output ----\n{output}"
        super().__init__(text)


class ActionError(EnvError):
    """One of the agent's actions did not run as asked.

    ``ends_with``: the exit reason that ends the episode (``None``: the episode goes on and
    the model is shown :meth:`observation`); ``outcome``: a few words for the episode log;
    ``counted_as``: the :class:`~uniagent.interaction.metrics.EpisodeMetrics` counter it
    adds one to, if any.
    """

    ends_with: ClassVar[ExitReason | None] = None
    outcome: ClassVar[str] = "failed"
    counted_as: ClassVar[str | None] = None

    def observation(self) -> str:
        """What the model is shown in place of the action's output."""
        return str(self)


class ActionTimeoutError(ActionError, TimeoutError):
    """A command ran past its timeout; it was interrupted and the session kept.

    ``partial_output`` is what the command printed before it was stopped.
    """

    outcome = "timed out"
    counted_as = "timeouts"

    def __init__(self, command: str, timeout: float, partial_output: str = "") -> None:
        self.command = command
        self.timeout = timeout
        self.partial_output = partial_output
        super().__init__(
            f"the command did not finish within {timeout:g} s and was interrupted; the shell "
            "(working directory, variables) is still usable"
        )

    def observation(self) -> str:
        return (
            f"{self.partial_output or ''}\n"
            f"The command timed out after {self.timeout:g} s and was interrupted; the shell is "
            "still usable. Run long jobs with a smaller input, or in the background with "
            "output to a file."
        ).lstrip("\n")


class ActionSyntaxError(ActionError):
    """``bash -n`` rejected the command; nothing was run. The message is bash's."""

    outcome = "not run: a syntax error"
    counted_as = "syntax_errors"

    def __init__(self, message: str, command: str = "") -> None:
        self.command = command
        self.bash_message = message
        super().__init__(message)

    def observation(self) -> str:
        return f"Your command was not run: bash reports a syntax error.\n{self}"


class TerminalNotAliveError(ActionError):
    """The shell session died (``exit``, a crash) or could not be recovered after a timeout."""

    ends_with = ExitReason.TERMINAL_NOT_ALIVE
    outcome = "the terminal died"

    def __init__(self, message: str, partial_output: str = "") -> None:
        self.partial_output = partial_output
        super().__init__(message)


class ShellKilledError(TerminalNotAliveError):
    """The agent's own command ended (or wedged) the shell while the sandbox itself lives on.

    ``exit``, ``kill $$``, ``exec``, a shell that ignores every interrupt: a policy
    outcome (exit reason ``agent_killed_shell``), never an infrastructure failure.
    """

    ends_with = ExitReason.AGENT_KILLED_SHELL
    outcome = "its shell ended"


class CommandEncodingError(ActionError):
    """The command cannot be sent to a shell (a NUL byte, characters not encodable as UTF-8).

    Nothing was run; the session is untouched. The interaction loop feeds the
    message back to the model.
    """

    outcome = "not run: cannot be encoded"
    counted_as = "syntax_errors"

    def __init__(self, message: str, command: str = "") -> None:
        self.command = command
        super().__init__(message)

    def observation(self) -> str:
        return f"Your command was not run: {self}"


def check_encodable(command: str) -> None:
    """Raise :class:`CommandEncodingError` unless ``command`` can be written to a shell."""
    if "\x00" in command:
        at = command.index("\x00")
        raise CommandEncodingError(
            f"the command contains a NUL byte (character {at}); bash cannot receive it, so "
            "nothing was run. Remove it (write binary data with printf '\\0' instead).",
            command,
        )
    try:
        command.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise CommandEncodingError(
            f"the command contains characters that are not valid Unicode text "
            f"({exc.object[exc.start : exc.end]!r} at character {exc.start}: {exc.reason}); "
            "nothing was run. Use plain UTF-8 text.",
            command,
        ) from None


class SessionProtocolError(ActionError):
    """The command forged or suppressed the session's control messages.

    Its output (``partial_output``) and exit code cannot be trusted; the
    session was resynchronised and stays usable (the model sees its output and
    what went wrong: its own doing).
    """

    outcome = "the shell was resynchronised"

    def __init__(self, message: str, partial_output: str = "") -> None:
        self.partial_output = partial_output
        super().__init__(message)

    def observation(self) -> str:
        return f"{self.partial_output.rstrip()}\n[the shell reports: {self}]".lstrip("\n")


class NonZeroExitError(EnvError):
    """``communicate(..., check=True)`` ran a command that exited non-zero."""

    def __init__(self, command: str, exit_code: int | None, output: str) -> None:
        self.command = command
        self.exit_code = exit_code
        self.output = output
        super().__init__(f"command {command!r} exited with code {exit_code}; its output:\n{output}")


class CommandTimeoutError(EnvError, TimeoutError):
    """Runtime level: the command is still running; send ``BashInterruptAction`` to recover.

    Same name and meaning as ``swerex.exceptions.CommandTimeoutError``.
    :class:`uniagent.env.AgentEnv` turns it into :class:`ActionTimeoutError`.
    """


#: What a command says when it could not write where it tried (a read-only sandbox root).
_WRITE_FAILED = re.compile(
    r"read-only file system|cannot create|cannot touch|permission denied|no such file or "
    r"directory",
    re.IGNORECASE,
)


def setup_failure(
    command: str, exit_code: int | None, output: str, writable: list[str] | None = None
) -> str:
    """One line for a failed set-up command: its status, the end of its output and, when it
    could not write, the places of the sandbox that are ``writable`` (if the backend says)."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    tail = " / ".join(lines[-3:])
    tail = tail if len(tail) <= 400 else "..." + tail[-397:]
    message = f"setup command {command!r} exited with {exit_code}" + (
        f": {tail}" if tail else " (no output)"
    )
    if writable and _WRITE_FAILED.search(output):
        message += (
            f"; in this sandbox only {', '.join(writable)} are writable (the rest is "
            "read-only): write there, or bind a host directory there with `binds`"
        )
    return message
