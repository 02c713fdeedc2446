"""The control protocol between :class:`~uniagent.env.bash_session.BashSession` and its bash.

Channels. bash reads its input from a Unix socket (fd 0) and prints its
prompts, the protocol's only messages, to a second Unix socket (its fd 2).
Commands run with stdin ``/dev/null`` and stdout/stderr on a separate output
pipe, so nothing a command prints can look like a message. ``/proc/PID/fd/N``
of a socket cannot be opened, so no other process can read the session's input
or write its messages; subshells and programs do not inherit them (bash keeps
its saved copies close-on-exec and closes them in subshells).

One command is one line: ``__ua_b=1; command eval -- '<command>' <redirections>``
followed, on the same line, by a trailer that saves ``$?``, resets the prompt
variables (a command may have changed them) and reads the line's nonce from a
here-string, then by an empty line. bash then prints its prompt, ``PS1``,
when the line is done and again for the empty line:
``\\x1eE<nonce>|<status> <ran> <generation>\\x1e`` twice. (``PS0`` stays
empty: a message per line start would cost a wake-up per command.)

Prompts are printed by bash's reader, not by commands: functions, aliases,
``enable -n``, ``set -x`` or a DEBUG trap cannot suppress, alter or fake them.
The nonce is fresh for every line and unknown to the command while it runs: it
is a here-string on a group command, parsed with the line but only expanded and
read by the trailer's last statement, so it is in no variable, no
``$BASH_COMMAND`` and no history entry before the command ends. A marker
carrying a nonce the session never issued, two different end markers for one
line, or an earlier nonce after a line completed are protocol violations (see
:class:`~uniagent.env.errors.SessionProtocolError`).

``HISTSIZE=0`` (reset after every command) and ``BASH_ENV=`` before the syntax
check keep a command from reading the protocol through the history or running
code in the checker. ``command`` before ``eval`` and ``read`` skips shell
functions of those names; a leading backslash skips aliases.
"""

from __future__ import annotations

import re
import secrets
import signal
from collections import deque
from dataclasses import dataclass

#: The signal whose bash trap aborts the rest of a command line once the
#: foreground program has ended (bash's own SIGINT handling trusts programs that
#: catch SIGINT and exit normally, and then runs the rest of the line).
ABORT_SIGNAL = signal.SIGRTMIN + 5
_ABORT_NAME = "RTMIN+5"

RUN_FLAG = "__ua_b"  # 1 while the agent's command runs (until the trailer or a prompt)
STATUS = "__ua_r"  # "$? ran generation" of the last line
NONCE = "__ua_s"
COMMAND = "__ua_c"  # the command text when it is syntax-checked first
SAVED_INT = "__ua_t"  # the command's SIGINT trap, while an abort overrides it
SAVED_STATUS = "__ua_q"

PS0 = ""
# The prompt also zeroes the run flag (through an array subscript, which expands to
# nothing): the abort trap must never act while bash reads its input (bash 5.2
# crashes on a SIGINT raised by a trap at the prompt).
PS1 = r"\036E${" + NONCE + r"}|${" + STATUS + r"}\036${__ua_z[$((" + RUN_FLAG + r"=0))]}"

_MARKER = re.compile(rb"\x1e([ES])([^\x1e]{0,200})\x1e")
_NONCE = re.compile(r"[0-9a-f]{16}")
_JUNK_KEEP = 64 * 1024


def quote(text: str) -> str:
    """``text`` as one single-quoted bash word."""
    return "'" + text.replace("'", "'\\''") + "'"


def new_nonce() -> str:
    """A fresh 64-bit nonce in hex."""
    return secrets.token_hex(8)


def trailer(nonce: str, generation: str, status: str | None = None) -> str:
    """Save the status, reset the prompt variables, read ``nonce``; then an empty line.

    One assignment statement saves ``$? ran generation`` (or ``status``) and
    resets what a command may have changed (the prompts; ``HISTSIZE=0`` so the
    next line, nonce included, never enters the history); the nonce comes last,
    from a here-string on a group, so no DEBUG trap or ``$BASH_COMMAND`` sees it
    before the prompt is printed.
    """
    if status is None:
        status = f"$? ${{{RUN_FLAG}}} {generation}"
    return (
        f'{STATUS}="{status}" {RUN_FLAG}=0 '
        f"PS1='{PS1}' PS0='{PS0}' PS2= PROMPT_COMMAND=() HISTSIZE=0; "
        f"{{ IFS= \\command \\read -r -N {len(nonce)} {NONCE}; }} <<< {nonce}\n\n"
    )


# Run by bash on ABORT_SIGNAL: while the agent's command line runs, abort it with a
# SIGINT that bash acts on even when the command trapped or ignored SIGINT (its
# SIGINT trap is saved here and restored by the resync line).
_ABORT_TRAP = (
    f"(( {RUN_FLAG} )) && {{ {RUN_FLAG}=0 {SAVED_INT}=$(\\command \\trap -p INT); "
    "\\command \\trap - INT; \\command \\kill -s INT $$; }"
)


def init_line(nonce: str, generation: str) -> str:
    """The first line: no history, the abort trap, then a trailer."""
    return f"set +o history +H; \\trap -- {quote(_ABORT_TRAP)} {_ABORT_NAME}; " + trailer(
        nonce, generation
    )


def resync_line(nonce: str, generation: str) -> str:
    """After a cut-short line: restore what the abort changed and the builtins used; a trailer.

    Its end marker also carries what the cut-short line's trailer saved, in case
    it got that far (then the nonce read failed: the command disabled something).
    """
    repair = (
        f'{SAVED_STATUS}="$? ${RUN_FLAG}"; '
        f'[[ -n ${SAVED_INT} ]] && \\command \\eval "${SAVED_INT}"; {SAVED_INT}=; '
        "\\enable command eval read kill trap 2>/dev/null; "
        "\\builtin unset -f command 2>/dev/null; "
    )
    return repair + trailer(nonce, generation, f"${SAVED_STATUS} {generation} ${STATUS}")


def command_prefix(*, check: bool, pty_fd: int | None, interactive: bool) -> tuple[str, str]:
    """The text before and after the quoted command (the trailer follows).

    ``check``: run ``bash -n`` on the command first (the command is then stored
    in a variable, so it appears once in the line). ``interactive``: stdin,
    stdout and stderr on the session's terminal (fd ``pty_fd``).
    """
    if interactive:
        assert pty_fd is not None
        redirs = f"<&{pty_fd} >&{pty_fd} 2>&{pty_fd} {pty_fd}>&-"
    else:
        # stdin /dev/null; stdout and stderr on the output pipe, both restored after
        # the command, so `exec >/dev/null` or `exec 2>&-` last until it ends.
        redirs = "</dev/null 2>&1 1>&2" + (f" {pty_fd}>&-" if pty_fd is not None else "")
    if not check:
        return f"{RUN_FLAG}=1; \\command \\eval -- ", f" {redirs}; "
    closed = f" {pty_fd}>&-" if pty_fd is not None else ""
    after = (
        f'; {RUN_FLAG}=0; if BASH_ENV= "$BASH" -n <<<"${COMMAND}" 2>&1 1>&2{closed}; then '
        f'{RUN_FLAG}=1; \\command \\eval -- "${COMMAND}" {redirs}; fi; '
    )
    return f"{COMMAND}=", after


@dataclass(frozen=True)
class Marker:
    """One message of bash: ``S`` (a line starts) or ``E`` (a prompt: a line ended)."""

    kind: str
    nonce: str = ""
    exit_code: int | None = None
    ran: bool = False
    generation: str = ""
    #: In a resync's end: (status, ran, generation) the cut-short line's trailer saved.
    previous: tuple[int | None, bool, str] | None = None
    raw: str = ""


class MarkerParser:
    """Splits the control stream into markers and junk (bash's own messages, foreign prompts)."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self.junk: deque[bytes] = deque()
        self._junk_len = 0

    def feed(self, data: bytes) -> list[Marker]:
        """Markers completed by ``data``, in order."""
        buf = self._buf
        buf += data
        markers: list[Marker] = []
        pos = 0
        while True:
            start = buf.find(b"\x1e", pos)
            if start < 0:
                self._keep_junk(bytes(buf[pos:]))
                pos = len(buf)
                break
            if start > pos:
                self._keep_junk(bytes(buf[pos:start]))
            match = _MARKER.match(buf, start)
            if match is None:
                end = buf.find(b"\x1e", start + 1)
                if end < 0 and len(buf) - start < 256:
                    pos = start  # a marker cut in two: wait for the rest
                    break
                self._keep_junk(b"\x1e")
                pos = start + 1
                continue
            markers.append(
                _parse(match.group(1).decode(), match.group(2).decode("ascii", "replace"))
            )
            pos = match.end()
        del buf[:pos]
        return markers

    def _keep_junk(self, data: bytes) -> None:
        if not data:
            return
        self.junk.append(data)
        self._junk_len += len(data)
        while self._junk_len > _JUNK_KEEP and len(self.junk) > 1:
            self._junk_len -= len(self.junk.popleft())

    def take_junk(self) -> str:
        """What arrived besides markers since the last call (bash's own messages)."""
        text = b"".join(self.junk).decode("utf-8", "backslashreplace")
        self.junk.clear()
        self._junk_len = 0
        return text


def _parse(kind: str, body: str) -> Marker:
    if kind == "S":
        return Marker("S", raw=body)
    nonce, bar, status = body.partition("|")
    fields = status.split(" ")  # "rc ran generation[ rc ran generation]", ran may be ""
    if not bar or not _NONCE.fullmatch(nonce) or len(fields) < 3:
        return Marker("E", raw=body)  # forged or mangled: no nonce of ours
    previous = None
    if len(fields) == 6:
        previous = (_int(fields[3]), fields[4] == "1", fields[5])
    return Marker(
        "E",
        nonce=nonce,
        exit_code=_int(fields[0]),
        ran=fields[1] == "1",
        generation=fields[2],
        previous=previous,
        raw=body,
    )


def _int(text: str) -> int | None:
    return int(text) if text.isdigit() else None


class OutputBuffer:
    """A command's output with a hard size limit: the first and last ``limit / 2`` bytes.

    Memory stays within ``limit`` plus one read chunk whatever the command prints.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._half = limit // 2
        self._tail_cap = limit - self._half
        self.head = bytearray()
        self._tail: deque[bytes] = deque()
        self._tail_len = 0
        self.dropped = 0
        self.total = 0

    def feed(self, data: bytes) -> None:
        """Append ``data``."""
        if not data:
            return
        self.total += len(data)
        room = self._half - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
            if not data:
                return
        self._tail.append(data)
        self._tail_len += len(data)
        while self._tail_len - len(self._tail[0]) >= self._tail_cap:
            self.dropped += len(self._tail[0])
            self._tail_len -= len(self._tail.popleft())

    def __len__(self) -> int:
        return len(self.head) + self._tail_len

    def take(self) -> tuple[bytes, int, bytes]:
        """(head, bytes dropped in between, tail), and empty the buffer."""
        tail = b"".join(self._tail)
        dropped = self.dropped
        if len(tail) > self._tail_cap:
            dropped += len(tail) - self._tail_cap
            tail = tail[len(tail) - self._tail_cap :]
        head = bytes(self.head)
        self.head = bytearray()
        self._tail.clear()
        self._tail_len = self.dropped = self.total = 0
        return head, dropped, tail

    def find(self, pattern: re.Pattern[bytes]) -> re.Match[bytes] | None:
        """``pattern`` in the buffered bytes when nothing was dropped yet (for expect strings)."""
        if self.dropped:
            return None
        return pattern.search(bytes(self.head) + b"".join(self._tail))
