"""Screening of ``execute_bash`` commands that would hang or detach the shell session.

The agent's commands run one after another in one persistent bash session, so a
command that waits for keyboard input (``vim``, ``less`` on the terminal, a bare
``python``), never exits (``tail -f``, ``watch``, ``top``), writes into later
observations (an unredirected background job ``cmd &``) or ends the shell
(``exit``) would break every later step. :func:`screen` finds such commands
before they run.

The command line is parsed with bashlex (see :mod:`uniagent_tools_swe.shell`),
and the rules look at the words bash would run as commands: in pipelines,
lists, groups, subshells, ``$( )``, ``if``/``for``/``while`` bodies and
``bash -c``/``eval`` strings, once ``sudo``, ``env X=1``, ``nohup``,
``timeout N`` and other wrappers are looked through. A rule refuses only what
blocks: ``python`` reading the terminal is refused, ``echo 1 | python`` or
``python3 - <<'EOF'`` is not; ``less`` writing the terminal is refused, ``less
f | head`` is not. Words that only name programs (``for n in python python3``,
``command -v vim``, ``git commit-tree -m msg``) are never commands. Commands
run under ``timeout`` cannot hang, so the rules about hanging let them through.

When bashlex cannot parse a command line the command is run unscreened (see
:func:`screen`). The screen is a safety net for common mistakes, not a
security boundary.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from uniagent_tools_swe.checks import (
    TRIGGERS,
    Trigger,
    editor,
    ends_session,
    follows,
    git_interactive,
    monitor,
    pager,
    repl,
    unredirected_background,
    watch,
)
from uniagent_tools_swe.shell import SimpleCommand, parse_commands, split_commands

__all__ = [
    "DEFAULT_BLOCKED",
    "BlockRule",
    "Blocked",
    "BuiltinRule",
    "SimpleCommand",
    "coerce_rules",
    "may_block",
    "screen",
    "split_commands",
]

_SHOWN_CHARS = 120


class BlockRule(BaseModel):
    """One kind of command that ``execute_bash`` refuses to run, and what to do instead.

    A rule from the config has a ``pattern``: a regular expression searched in the
    normalised text of each simple command (:meth:`SimpleCommand.normalized`: the
    program without its directory and its arguments, wrappers and assignments
    dropped, then its redirections; ``"| "`` first when it reads a pipe, ``" &"``
    last when it is sent to the background). The default rules are
    :class:`BuiltinRule` s, which look at the parsed words instead.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(description="Short id, used to remove a rule from the defaults.")
    label: str = Field(description="What the rule catches, listed in the tool description.")
    pattern: str | None = Field(
        default=None, description="Regex searched in each normalised simple command."
    )
    reason: str = Field(description="Why the command is refused and what to run instead.")
    top_level_only: bool = Field(
        default=False,
        description="Only catch commands of the session's own shell, not inside ( ), $( ), "
        "a pipeline or a background job.",
    )
    hangs: bool = Field(
        default=True,
        description="The rule catches commands that would hang the session: let them through "
        "where they cannot (run under `timeout`, or in a background job).",
    )

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, pattern: str | None) -> str | None:
        if pattern is not None:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"invalid regular expression {pattern!r}: {exc}") from None
        return pattern

    @model_validator(mode="after")
    def _has_a_test(self) -> BlockRule:
        if self.pattern is None and not isinstance(self, BuiltinRule):
            raise ValueError("a rule needs a `pattern` (a regular expression)")
        return self

    def matches(self, simple_command: str) -> bool:
        """Whether this rule catches one normalised simple command."""
        return self.pattern is not None and re.search(self.pattern, simple_command) is not None

    def catches(self, command: SimpleCommand) -> bool:
        """Whether this rule catches a simple command found by :func:`split_commands`."""
        if (self.top_level_only and command.subshell) or (
            self.hangs and (command.bounded or command.detached)
        ):
            return False
        return self._test(command)

    def _test(self, command: SimpleCommand) -> bool:
        return self.matches(command.normalized())


class BuiltinRule(BlockRule):
    """A rule decided by a Python function of the parsed command (the default rules)."""

    _check: Callable[[SimpleCommand], bool] = PrivateAttr()

    def __init__(self, check: Callable[[SimpleCommand], bool], **data: Any) -> None:
        super().__init__(**data)
        self._check = check

    @functools.cached_property
    def trigger(self) -> Trigger | None:
        """What a command line must contain for the rule to catch one of its commands
        (:data:`~uniagent_tools_swe.checks.TRIGGERS`); ``None``: anything may be caught.
        Cached: a private attribute costs microseconds a read, this a dict lookup."""
        return TRIGGERS.get(self._check)

    def matches(self, simple_command: str) -> bool:
        """Whether this rule catches a command line given as text (parsed first)."""
        return any(self.catches(c) for c in split_commands(simple_command))

    def _test(self, command: SimpleCommand) -> bool:
        return command.known and self._check(command)


_HANG = "would hang the shell session that runs all your commands"

DEFAULT_BLOCKED: tuple[BlockRule, ...] = (
    BuiltinRule(
        editor,
        name="editor",
        label="interactive editors (vim, nano, emacs)",
        reason=f"Interactive editors wait for keyboard input and {_HANG}. View and edit files "
        "with str_replace_editor, or use sed, or write a whole file with a heredoc: "
        "cat > FILE <<'EOF' ... EOF.",
    ),
    BuiltinRule(
        git_interactive,
        name="git-interactive",
        label="git commands that open an editor or prompt (git commit without -m, "
        "git rebase -i, git add -p)",
        reason=f"This git command opens an editor or asks questions and {_HANG}. Give the "
        "message on the command line (`git commit -m MSG`, `--no-edit`) and stage files by "
        "name (`git add FILE`).",
    ),
    BuiltinRule(
        pager,
        name="pager",
        label="pagers (less, more) writing to the terminal",
        reason=f"Pagers wait for keyboard input and {_HANG}. Print with cat, or show parts "
        "with head, tail, grep -n or sed -n 'START,ENDp'; for git use `git --no-pager ...`.",
    ),
    BuiltinRule(
        monitor,
        name="monitor",
        label="full-screen monitors (top, htop)",
        reason=f"Full-screen monitors never exit and {_HANG}. Take a snapshot instead: "
        "`top -b -n 1` or `ps aux`.",
    ),
    BuiltinRule(
        follows,
        name="follow",
        label="following logs (tail -f, journalctl -f)",
        reason=f"Following output never exits and {_HANG}. Show the end once with "
        "`tail -n 50 FILE`, or bound it: `timeout 10 tail -f FILE`.",
    ),
    BuiltinRule(
        watch,
        name="watch",
        label="watch",
        reason=f"`watch` never exits and {_HANG}. Run the command once, or a few times in a "
        "loop: for i in 1 2 3; do CMD; sleep 2; done.",
    ),
    BuiltinRule(
        repl,
        name="repl",
        label="interpreters and shells started without a script (python, node, bash)",
        reason=f"An interactive interpreter or shell waits for keyboard input and {_HANG}. "
        "Run code with `python3 -c '...'`, a script file, or a heredoc: "
        "python3 - <<'EOF' ... EOF.",
    ),
    BuiltinRule(
        unredirected_background,
        name="background",
        label="background jobs (cmd &) whose output is not redirected to a file",
        reason="A background job whose output is not redirected would write into later "
        "observations and may outlive the command. Run it in the foreground (bound it with "
        "`timeout` if it may not finish), or redirect its output to a file: "
        "CMD > /tmp/cmd.log 2>&1 &",
        hangs=False,
    ),
    BuiltinRule(
        ends_session,
        name="session",
        label="commands that end or replace the shell (exit, logout, exec, set -e)",
        reason="This would end or take over the persistent shell session that runs all your "
        "commands. It is not needed: the exit code of every command is reported to you.",
        top_level_only=True,
        hangs=False,
    ),
)


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


# What bash removes from a word before it names a program: quotes, backslashes and
# backslash-newline (``v"i"m``, ``\\vim`` and ``vi\\<newline>m`` all run vim).
_CONTINUATION = re.compile(r"\\\n")
_QUOTING = str.maketrans("", "", "\"'\\")
# The ``&`` that sends no job to the background: `` && `` between spaces (an operator, or
# quoted text) and an unescaped ``>&N`` (a redirection, or quoted text). Any other ``&``
# may be one (``'&'&``, ``\\>&1``), and the line is parsed.
_NOT_BACKGROUND = re.compile(r" && |(?<!\\)>&[0-9-]")
_WORD = re.compile(r"\w+")


def may_block(command: str, rules: Sequence[BlockRule] = DEFAULT_BLOCKED) -> bool:
    """Whether a rule of ``rules`` could catch a simple command of ``command``: ``False``
    only where no rule's :attr:`~BuiltinRule.trigger` is found in it once its quoting is
    removed, which needs no parse (a parse costs milliseconds: bashlex is pure Python).

    Sound for :func:`screen`: a program a check catches is named by a word of the
    command line, and that word's unquoted text is the name. ``$'...'`` (whose escapes
    can spell a name) and a rule without a trigger (a ``pattern`` from the config) always
    answer ``True``.
    """
    if "$'" in command:
        return True
    text = _NOT_BACKGROUND.sub(" ", _CONTINUATION.sub("", command)).translate(_QUOTING)
    words = frozenset(_WORD.findall(text))
    for rule in rules:
        trigger = rule.trigger if isinstance(rule, BuiltinRule) else None
        if trigger is None or not words.isdisjoint(trigger.names):
            return True
        if any(t in text for t in trigger.texts):
            return True
    return False


def screen(command: str, rules: Sequence[BlockRule] = DEFAULT_BLOCKED) -> Blocked | None:
    """The first rule that catches a simple command of ``command``, or ``None`` to run it."""
    if not may_block(command, rules):
        return None  # the verdict of the parse below, without it
    return _screen_parsed(command, rules)


def _screen_parsed(command: str, rules: Sequence[BlockRule]) -> Blocked | None:
    """:func:`screen` with every command line parsed."""
    commands = parse_commands(command)
    if commands is None:
        # bashlex could not parse it. Either it is not bash at all, and bash reports the
        # syntax error itself when the command runs, or it is bash that bashlex does not
        # implement (`case`, `select`, `for ((...))`, ...). Guessing at commands from the
        # raw text is what refused `for n in python python3` and `git commit-tree`: a
        # refusal of a valid command teaches the policy to avoid it, while a command that
        # does hang only costs the action timeout, after which the session is usable
        # again. So an unparsable command runs unscreened.
        return None
    for simple in commands:
        text = simple.normalized()
        if not text:
            continue
        for rule in rules:
            if rule.catches(simple):
                return Blocked(rule=rule, simple_command=text)
    return None
