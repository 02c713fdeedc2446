"""Screening of ``execute_bash`` commands that would hang or detach the shell session.

The agent's commands run one after another in one persistent bash session, so a
command that waits for keyboard input (``vim``, ``less``, a bare ``python``),
never exits (``tail -f``, ``watch``, ``top``), writes into later observations
(an unredirected background job ``cmd &``) or ends the shell (``exit``) would
break every later step. :func:`screen` finds such commands before they run.

A rule is a regular expression searched in each *simple command* of the call
(``a && b | c`` has three), after quotes are removed, leading ``VAR=value``
assignments and wrappers (``sudo``, ``env``, ``nohup``, ``time``, ``nice``, ...)
are skipped and the program's directory is dropped (``/usr/bin/vim`` → ``vim``).
Two markers make pipes and background jobs visible to the patterns: a command
that reads a pipe starts with ``"| "`` and one sent to the background ends with
``" &"``. Heredoc bodies, comments and quoted text are never matched. Commands
run under ``timeout`` start with ``timeout`` and so match none of the default
rules: they cannot hang.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

#: Wrappers that run another program; the program after them is what is matched.
_WRAPPERS = frozenset({"sudo", "env", "nohup", "time", "command", "builtin", "nice", "stdbuf"})
#: Wrapper options that take a separate value (``sudo -u user cmd``).
_WRAPPER_OPTION_VALUES = {"sudo": {"-u", "-g", "-p", "-C", "-D", "-U", "-h", "-r", "-t", "-T"},
                          "nice": {"-n"}, "env": {"-u", "-C"}}
#: Shell keywords and grouping words that may precede a command.
_KEYWORDS = frozenset({"!", "{", "}", "if", "then", "else", "elif", "do", "while", "until"})
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\[[^\]]*\])?\+?=")
_SHOWN_CHARS = 120


class BlockRule(BaseModel):
    """One kind of command that ``execute_bash`` refuses to run, and what to do instead."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(description="Short id, used to remove a rule from the defaults.")
    label: str = Field(description="What the rule catches, listed in the tool description.")
    pattern: str = Field(description="Regex searched in each normalised simple command.")
    reason: str = Field(description="Why the command is refused and what to run instead.")
    top_level_only: bool = Field(
        default=False,
        description="Only catch commands of the session's own shell, not inside ( ) or $( ).",
    )

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, pattern: str) -> str:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"invalid regular expression {pattern!r}: {exc}") from None
        return pattern

    def matches(self, simple_command: str) -> bool:
        """Whether this rule catches one normalised simple command."""
        return re.search(self.pattern, simple_command) is not None


_HANG = "would hang the shell session that runs all your commands"

DEFAULT_BLOCKED: tuple[BlockRule, ...] = (
    BlockRule(
        name="editor",
        label="interactive editors (vim, nano, emacs)",
        pattern=r"^(vi|vim|nvim|view|vimdiff|nano|pico|micro|joe|mcedit|emacsclient"
        r"|emacs(?!.*\s--?batch\b))(\s|$)",
        reason=f"Interactive editors wait for keyboard input and {_HANG}. View and edit files "
        "with str_replace_editor, or use sed, or write a whole file with a heredoc: "
        "cat > FILE <<'EOF' ... EOF.",
    ),
    BlockRule(
        name="git-interactive",
        label="git commands that open an editor or prompt (git commit without -m, "
        "git rebase -i, git add -p)",
        pattern=r"^git\s+(.*\s)?(commit\b(?!.*\s(-[a-zA-Z]*m|--message|-F|--file|--no-edit|-C"
        r"|--reuse-message|--fixup)\S*)|rebase\s+(.*\s)?(-i|--interactive)\b"
        r"|add\s+(.*\s)?(-p|--patch|-i|--interactive)\b)",
        reason=f"This git command opens an editor or asks questions and {_HANG}. Give the "
        "message on the command line (`git commit -m MSG`, `--no-edit`) and stage files by "
        "name (`git add FILE`).",
    ),
    BlockRule(
        name="pager",
        label="pagers (less, more)",
        pattern=r"^(\| )?(less|more|most)(\s|$)",
        reason=f"Pagers wait for keyboard input and {_HANG}. Print with cat, or show parts "
        "with head, tail, grep -n or sed -n 'START,ENDp'; for git use `git --no-pager ...`.",
    ),
    BlockRule(
        name="monitor",
        label="full-screen monitors (top, htop)",
        pattern=r"^(top(?!.*\s-\w*b)|htop|atop|btop|iotop|nmon|glances)(\s|$)",
        reason=f"Full-screen monitors never exit and {_HANG}. Take a snapshot instead: "
        "`top -b -n 1` or `ps aux`.",
    ),
    BlockRule(
        name="follow",
        label="following logs (tail -f, journalctl -f)",
        pattern=r"^(\| )?(tail|journalctl|(docker|podman|kubectl) logs)\b.*\s(-\w*[fF]|--follow)\b",
        reason=f"Following output never exits and {_HANG}. Show the end once with "
        "`tail -n 50 FILE`, or bound it: `timeout 10 tail -f FILE`.",
    ),
    BlockRule(
        name="watch",
        label="watch",
        pattern=r"^watch(\s|$)",
        reason=f"`watch` never exits and {_HANG}. Run the command once, or a few times in a "
        "loop: for i in 1 2 3; do CMD; sleep 2; done.",
    ),
    BlockRule(
        name="repl",
        label="interpreters and shells started without a script (python, node, bash)",
        pattern=r"^(python[0-9.]*|pypy[0-9.]*|ipython[0-9]*|bpython|node|nodejs|irb|ghci|lua"
        r"|julia|bash|sh|dash|zsh|ksh|fish)(\s+-i\b.*)?$|^su(?!.*\s(-c|--command)\b)(\s.*)?$",
        reason=f"An interactive interpreter or shell waits for keyboard input and {_HANG}. "
        "Run code with `python3 -c '...'`, a script file, or a heredoc: "
        "python3 - <<'EOF' ... EOF.",
    ),
    BlockRule(
        name="background",
        label="background jobs (cmd &) whose output is not redirected to a file",
        pattern=r"^(?!.*(^|\s)(1?>>?|&>>?)\s*[^\s&]).*\s&$",
        reason="A background job whose output is not redirected would write into later "
        "observations and may outlive the command. Run it in the foreground (bound it with "
        "`timeout` if it may not finish), or redirect its output to a file: "
        "CMD > /tmp/cmd.log 2>&1 &",
    ),
    BlockRule(
        name="session",
        label="commands that end or replace the shell (exit, logout, exec, set -e)",
        pattern=r"^(exit|logout|exec|set\s+(.*\s)?(-[a-zA-Z]*e[a-zA-Z]*|-o\s+errexit))(\s|$)",
        reason="This would end or take over the persistent shell session that runs all your "
        "commands. It is not needed: the exit code of every command is reported to you.",
        top_level_only=True,
    ),
)


@dataclass(frozen=True)
class SimpleCommand:
    """One simple command of a bash command line, as :func:`split_commands` found it."""

    words: tuple[str, ...]
    piped: bool = False
    background: bool = False
    subshell: bool = False

    def normalized(self) -> str:
        """The text the rules match: wrappers dropped, with the ``| `` and `` &`` markers."""
        words = list(self.words)
        i = 0
        while i < len(words):
            word = words[i]
            if word in _KEYWORDS or _ASSIGNMENT.match(word):
                i += 1
            elif word in _WRAPPERS:
                takes_value = _WRAPPER_OPTION_VALUES.get(word, set())
                i += 1
                while i < len(words) and (words[i].startswith("-") or _ASSIGNMENT.match(words[i])):
                    i += 2 if words[i] in takes_value else 1
            else:
                break
        rest = words[i:]
        if not rest:
            return ""
        rest[0] = rest[0].rsplit("/", 1)[-1] or rest[0]
        text = " ".join(rest)
        if self.piped:
            text = "| " + text
        if self.background:
            text += " &"
        return text


@dataclass(frozen=True)
class Blocked:
    """Why a command was refused: the rule and the simple command it caught."""

    rule: BlockRule
    simple_command: str

    def message(self) -> str:
        """The explanation shown to the model instead of the command's output."""
        shown = self.simple_command
        if len(shown) > _SHOWN_CHARS:
            shown = shown[: _SHOWN_CHARS - 3] + "..."
        return (
            f"execute_bash refused to run this command, so nothing was executed: `{shown}`\n"
            f"{self.rule.reason}"
        )


def coerce_rules(rules: Iterable[BlockRule | Mapping[str, Any]]) -> tuple[BlockRule, ...]:
    """Rules from ``BlockRule`` objects or config mappings (``name, label, pattern, reason``)."""
    return tuple(r if isinstance(r, BlockRule) else BlockRule.model_validate(r) for r in rules)


def screen(command: str, rules: Sequence[BlockRule] = DEFAULT_BLOCKED) -> Blocked | None:
    """The first rule that catches a simple command of ``command``, or ``None`` to run it."""
    for simple in split_commands(command):
        text = simple.normalized()
        if not text:
            continue
        for rule in rules:
            if rule.top_level_only and simple.subshell:
                continue
            if rule.matches(text):
                return Blocked(rule=rule, simple_command=text)
    return None


def split_commands(script: str) -> list[SimpleCommand]:
    """Split a bash command line into simple commands (a small lexer, never raises).

    Separators are ``; && || | |& & newline ( ) $( `` and backticks; quotes are
    removed, comments and heredoc bodies skipped, ``2>&1``/``&>`` kept as words.
    """
    return _Lexer(script).run()


class _Lexer:
    def __init__(self, script: str) -> None:
        self.s = script
        self.i = 0
        self.commands: list[SimpleCommand] = []
        self.words: list[str] = []
        self.word: list[str] | None = None
        self.piped = False
        self.depth = 0  # nesting of ( ), $( ) and backticks
        self.backtick = False
        self.heredocs: list[tuple[str, bool]] = []

    def run(self) -> list[SimpleCommand]:
        s, n = self.s, len(self.s)
        while self.i < n:
            c = s[self.i]
            if c == "\\":
                if s.startswith("\\\n", self.i):
                    self.i += 2
                    continue
                self._add(s[self.i + 1 : self.i + 2])
                self.i += 2
            elif c == "'":
                end = s.find("'", self.i + 1)
                end = n if end == -1 else end
                self._add(s[self.i + 1 : end])
                self.i = end + 1
            elif c == '"':
                self._double_quoted()
            elif c == "#" and self.word is None:
                end = s.find("\n", self.i)
                self.i = n if end == -1 else end
            elif c in " \t\r":
                self._end_word()
                self.i += 1
            elif c == "\n":
                self._end_command()
                self.i += 1
                self._skip_heredoc_bodies()
            elif s.startswith("<<<", self.i):
                self._add("<<<")
                self.i += 3
            elif s.startswith("<<", self.i):
                self._heredoc_operator()
            else:
                self._operator_or_char(c)
        self._end_command()
        return self.commands

    def _operator_or_char(self, c: str) -> None:
        s = self.s
        if s.startswith(("&&", "||"), self.i):
            self._end_command()
            self.i += 2
        elif c == "&":
            if s.startswith("&>", self.i) or (self.word and self.word[-1][-1:] in ("<", ">")):
                self._add("&")  # a redirection: &>file, 2>&1, >&2
            else:
                self._end_command(background=True)
            self.i += 1
        elif c == "|":
            self._end_command(next_piped=True)
            self.i += 2 if s.startswith("|&", self.i) else 1
        elif c == ";":
            self._end_command()
            self.i += 1
        elif c == "(" or s.startswith("$(", self.i):
            self._end_command()
            self.depth += 1
            self.i += 1 if c == "(" else 2
        elif c == ")":
            self._end_command()
            self.depth = max(0, self.depth - 1)
            self.i += 1
        elif c == "`":
            self._end_command()
            self.backtick = not self.backtick
            self.i += 1
        else:
            self._add(c)
            self.i += 1

    def _double_quoted(self) -> None:
        s, n = self.s, len(self.s)
        j, buf = self.i + 1, []
        while j < n and s[j] != '"':
            if s[j] == "\\" and j + 1 < n and s[j + 1] in '"\\$`\n':
                buf.append(s[j + 1])
                j += 2
            else:
                buf.append(s[j])
                j += 1
        self._add("".join(buf))
        self.i = j + 1

    def _heredoc_operator(self) -> None:
        s, n = self.s, len(self.s)
        self._end_word()
        self.words.append("<<")
        self.i += 2
        strip_tabs = self.i < n and s[self.i] == "-"
        if strip_tabs:
            self.i += 1
        while self.i < n and s[self.i] in " \t":
            self.i += 1
        start = self.i
        while self.i < n and s[self.i] not in " \t\n;&|()<>":
            self.i += 1
        delimiter = re.sub(r"[\"'\\]", "", s[start : self.i])
        if delimiter:
            self.words.append(delimiter)
            self.heredocs.append((delimiter, strip_tabs))

    def _skip_heredoc_bodies(self) -> None:
        s = self.s
        for delimiter, strip_tabs in self.heredocs:
            while self.i < len(s):
                end = s.find("\n", self.i)
                end = len(s) if end == -1 else end
                line = s[self.i : end]
                self.i = end + 1
                if (line.lstrip("\t") if strip_tabs else line) == delimiter:
                    break
        self.heredocs = []

    def _add(self, text: str) -> None:
        if self.word is None:
            self.word = []
        self.word.append(text)

    def _end_word(self) -> None:
        if self.word is not None:
            self.words.append("".join(self.word))
            self.word = None

    def _end_command(self, *, background: bool = False, next_piped: bool = False) -> None:
        self._end_word()
        if self.words:
            subshell = self.depth > 0 or self.backtick
            self.commands.append(
                SimpleCommand(tuple(self.words), self.piped, background, subshell)
            )
        elif background and self.commands:  # `( ... ) &`: the group goes to the background
            last = self.commands[-1]
            self.commands[-1] = SimpleCommand(last.words, last.piped, True, last.subshell)
        self.words = []
        self.piped = next_piped
