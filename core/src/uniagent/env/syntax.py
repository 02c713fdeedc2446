"""Knowing without a process that a command's bash syntax is valid.

``bash -n`` costs a process start (about 2.5 ms here, see ``bench/sandbox.py``),
several times the round trip of a command in a persistent session. Most agent
commands are simple (``ls -la``, ``cd /x && python t.py | tail -5``) and
provably well-formed, so :func:`obviously_valid` accepts those; anything it
is not sure about is checked by ``bash -n`` in the session (see
:mod:`uniagent.env.bash_session`). The property that matters (tested against
real ``bash -n``, also by hypothesis): it never accepts a command that
``bash -n`` rejects. Long commands (over :data:`MAX_CHARS`) always go to
``bash -n``: tokenizing megabytes in Python would cost seconds of CPU (holding
the GIL, so a worker thread would stall the event loop too) and gigabytes of
memory, against a few milliseconds for the real parser.
"""

from __future__ import annotations

import re

#: Longer commands are left to ``bash -n``.
MAX_CHARS = 4096

# Words at command position that start or end a compound command: a command
# beginning with one of them needs the real parser.
_RESERVED = frozenset(
    {"if", "then", "else", "elif", "fi", "case", "esac", "for", "select", "while", "until"}
    | {"do", "done", "in", "function", "time", "coproc", "{", "}", "[[", "]]", "!"}
)
# Word pieces: plain characters (no parentheses, braces, brackets -- ``ls[`` at
# command position starts an array subscript --, comment or history marks),
# simple parameter references, and quoted strings whose content cannot break
# the syntax (single quotes: anything but a quote; double quotes: no
# backslash, backquote, ``!`` or ``$`` other than a simple reference).
# Non-ASCII text is plain word characters to bash. One line only.
_PLAIN = r"[A-Za-z0-9_\-./=:,+@%~^*?\u0080-\U0010ffff]"
_VAR = r"\$(?:[A-Za-z_][A-Za-z0-9_]*|\{[A-Za-z_][A-Za-z0-9_]*\}|[0-9?])"
_SQUOTED = r"'[^'\n\x00]*'"
_DQUOTED = r'"(?:[^"$`\\!\n\x00]|' + _VAR + r')*"'
_TOKEN = re.compile(
    r"(?P<space>[ \t]+)"
    r"|(?P<dup>[0-9]*(?:>&|<&)(?:[0-9]+|-)(?![^\s|;&<>]))"
    r"|(?P<redirect>&>>|&>|[0-9]*(?:>>|>\||<>|>|<))"
    r"|(?P<op>&&|\|\||\|&|\||;|&)"
    rf"|(?P<word>(?:{_PLAIN}|{_VAR}|{_SQUOTED}|{_DQUOTED})+)"
)


def obviously_valid(command: str) -> bool:
    """True only for one-line commands whose syntax is certainly valid (words, simple quotes
    and ``$NAME``, pipes, lists, simple redirections); False means "ask ``bash -n``"."""
    if len(command) > MAX_CHARS or "\n" in command or ";&" in command or not command.strip():
        return False  # (";&" is bash's case fall-through operator, one token)
    tokens = []
    position = 0
    for match in _TOKEN.finditer(command):
        if match.start() != position:
            return False  # a character the tokenizer does not vouch for
        position = match.end()
        if match.lastgroup != "space":
            tokens.append((match.lastgroup, match.group()))
    if position != len(command):
        return False
    command_len = 0  # tokens in the current simple command
    need_word = False  # after a redirection operator
    last_op = ";"  # a virtual separator before the first command
    for kind, text in tokens:
        if need_word:
            # "name=value" right after a redirection is an assignment to bash before the
            # command word (a syntax error there); do not reason about where.
            if kind != "word" or "=" in text:
                return False
            need_word = False
            command_len += 1
            continue
        if kind == "word":
            if command_len == 0 and text in _RESERVED:
                return False
            command_len += 1
        elif kind == "dup":
            command_len += 1
        elif kind == "redirect":
            need_word = True
            command_len += 1
        else:  # an operator ends a simple command, which must not be empty
            if command_len == 0:
                return False
            command_len = 0
            last_op = text
    if need_word:
        return False
    # A list may end with ';' or '&', but not with '|', '&&' or '||'.
    return command_len > 0 or last_op in (";", "&")
