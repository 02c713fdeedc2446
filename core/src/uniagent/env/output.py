"""Making command output fit for a model: no terminal control codes, bounded length."""

from __future__ import annotations

import re

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
_BACKSPACE = re.compile(r"[^\n\x08]\x08")

#: What a runtime inserts where it dropped the middle of a huge output.
RUNTIME_DROP_NOTE = (
    "\n[... {n} bytes of output dropped: the command printed more than {limit} bytes ...]\n"
)
_RUNTIME_DROP = re.compile(
    r"\n\[\.\.\. (\d+) bytes of output dropped: the command printed more than \d+ bytes \.\.\.\]\n"
)


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
        previous = None
        while previous != text:
            previous, text = text, _BACKSPACE.sub("", text)
        text = text.replace("\x08", "")
    return _CONTROL.sub("", text)


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
