"""Making command output fit for a model: no terminal control codes, bounded length."""

from __future__ import annotations

import re
import signal

# CSI (colours, cursor moves), OSC (titles, hyperlinks) and two-byte escapes.
_ANSI = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"
    r"|\x1b[PX^_][^\x1b]*(?:\x1b\\)?"
    r"|\x1b[@-Z\\-_]"
    r"|\x9b[0-?]*[ -/]*[@-~]"
)
# Control characters other than \t \n \r \b, which are handled separately.
_CONTROL = re.compile(r"[\x00-\x07\x0b\x0c\x0e-\x1f\x7f]")
_NEEDS_WORK = re.compile(r"[\x00-\x08\x0b-\x1f\x7f\x9b]")

#: What a runtime inserts where it dropped the middle of a huge output.
RUNTIME_DROP_NOTE = (
    "\n[... {n} bytes of output dropped: the command printed more than {limit} bytes ...]\n"
)
#: What :func:`fit_output` inserts where it dropped the middle before cleaning.
CLEAN_DROP_NOTE = (
    "\n[... {n} characters of output dropped: the command printed more than {limit} "
    "characters ...]\n"
)
_RUNTIME_DROP = re.compile(
    r"\n\[\.\.\. (\d+) (?:bytes|characters) of output dropped: the command printed more than "
    r"\d+ (?:bytes|characters) \.\.\.\]\n"
)
#: :func:`fit_output` cleans at most this many times ``limit`` characters of each end.
RAW_WINDOW = 4


def clean_output(text: str) -> str:
    """Remove ANSI codes and control characters, turn ``\\r\\n`` into ``\\n``, resolve ``\\r``.

    A line rewritten with ``\\r`` (progress bars, spinners) keeps its last
    non-empty version, which is what a terminal shows once the line settles.
    """
    if not _NEEDS_WORK.search(text):
        return text
    text = _ANSI.sub("", text)
    text = text.replace("\r\n", "\n")
    if "\r" in text:
        text = "\n".join(_last_version(line) for line in text.split("\n"))
    if "\x08" in text:
        text = _apply_backspaces(text)
    return _CONTROL.sub("", text)


def _apply_backspaces(text: str) -> str:
    """Each backspace erases the character before it on its line (none at a line's start).

    One pass, linear in ``text``: the agent controls these bytes, and erasing one pair
    at a time until nothing changes took time quadratic in a run of backspaces.
    """
    lines = []
    for line in text.split("\n"):
        pieces = line.split("\x08")
        kept = list(pieces[0])
        for piece in pieces[1:]:
            if kept:
                kept.pop()
            kept.extend(piece)
        lines.append("".join(kept))
    return "\n".join(lines)


def _last_version(line: str) -> str:
    if "\r" not in line:
        return line
    for version in reversed(line.split("\r")):
        if version:
            return version
    return ""


def truncate_output(text: str, limit: int) -> tuple[str, int]:
    """Keep the head and tail of ``text`` within ``limit`` characters; also return how many went.

    The count includes bytes a runtime had already dropped (see
    :data:`RUNTIME_DROP_NOTE`) inside the part cut here.
    """
    if limit <= 0 or len(text) <= limit:
        return text, 0
    head = limit // 2
    tail = limit - head
    middle = text[head : len(text) - tail]
    dropped = len(middle)
    for match in _RUNTIME_DROP.finditer(middle):  # count what the note stands for, not the note
        dropped += int(match.group(1)) - len(match.group())
    note = (
        f"\n\n[... {dropped} characters of output omitted: the output was longer than "
        f"{limit} characters ...]\n\n"
    )
    return text[:head] + note + text[len(text) - tail :], dropped


def fit_output(text: str, limit: int) -> str:
    """:func:`clean_output`, then :func:`truncate_output` to ``limit`` characters, in time
    bounded by ``limit``: the raw text is first cut to its first and last
    ``RAW_WINDOW * limit`` characters (cleaning only removes characters, so what is kept
    still fills the limit unless the ends are mostly control codes), the middle replaced
    by a note of how much went. ``limit`` <= 0: no limit."""
    keep = RAW_WINDOW * limit
    if limit <= 0 or len(text) <= 2 * keep:
        return truncate_output(clean_output(text), limit)[0]
    middle = text[keep : len(text) - keep]
    dropped = len(middle)
    for match in _RUNTIME_DROP.finditer(middle):  # what a runtime dropped already, counted
        dropped += int(match.group(1)) - len(match.group())
    note = CLEAN_DROP_NOTE.format(n=dropped, limit=2 * keep)
    cleaned = clean_output(text[:keep]) + note + clean_output(text[len(text) - keep :])
    return truncate_output(cleaned, limit)[0]


# What an interactive bash without a terminal prints where a terminal's bash would
# report a foreground program killed by a signal (it fails to restore the tty).
_SIGNAL_NOTE = re.compile(r"bash: \[\d+: \d+ \(\d+\)\] tcsetattr: Inappropriate ioctl for device\n")
# Deaths a terminal does not report (bash's DONT_REPORT_SIGPIPE, and Ctrl-C's SIGINT).
_SILENT_SIGNALS = {signal.SIGINT, signal.SIGPIPE}


def signal_messages(text: str, exit_code: int | None) -> str:
    """Show fatal signals the way a terminal does ("Killed", "Segmentation fault").

    bash leaves a note where a foreground program died of a signal. The note
    of the command line's last program becomes the terminal's message for the
    signal in ``exit_code`` (128 + N); notes that cannot be attributed to a
    signal are removed rather than guessed.
    """
    if "tcsetattr" not in text:
        return text
    notes = list(_SIGNAL_NOTE.finditer(text))
    if not notes:
        return text
    last = notes[-1]
    message = ""
    if exit_code is not None and exit_code > 128:
        try:
            sig = signal.Signals(exit_code - 128)
        except ValueError:
            sig = None
        if sig is not None and sig not in _SILENT_SIGNALS:
            message = (signal.strsignal(sig) or sig.name) + "\n"
    return _SIGNAL_NOTE.sub("", text[: last.start()]) + message + text[last.end() :]


def render_output(head: bytes, dropped: int, tail: bytes, limit: int, exit_code: int | None) -> str:
    """Decode a runtime's kept output (invalid UTF-8 escaped) within ``limit`` characters.

    ``head``/``tail`` are the kept first and last bytes, ``dropped`` the count
    of bytes between them; escaping can lengthen text, so the result is cut
    again to ``limit`` characters (plus the note saying what was dropped).
    """
    text = tail.decode("utf-8", "backslashreplace")
    if head or dropped:
        first = head.decode("utf-8", "backslashreplace")
        half = limit // 2
        if len(first) > half:
            dropped += len(first) - half
            first = first[:half]
        if len(text) > limit - half:
            dropped += len(text) - (limit - half)
            text = text[len(text) - (limit - half) :]
        if dropped:
            text = first + RUNTIME_DROP_NOTE.format(n=dropped, limit=limit) + text
        else:
            text = first + text
    elif len(text) > limit:
        cut = len(text) - limit
        half = limit // 2
        text = text[:half] + RUNTIME_DROP_NOTE.format(n=cut, limit=limit) + text[half + cut :]
    return signal_messages(text, exit_code)
