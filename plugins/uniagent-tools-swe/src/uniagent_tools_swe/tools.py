"""The four SWE tools as ``ToolSpec`` records: argument models, descriptions, builders.

Contract with the interaction loop:

- ``execute_bash`` runs ``command`` itself in the persistent session. A command
  that would hang or detach the session is not run: the rendered command prints
  why (see :mod:`uniagent_tools_swe.blocking`) and exits with
  :data:`BLOCKED_EXIT_CODE`, so the model reads the explanation as the
  observation and the loop goes on.
- ``str_replace_editor`` runs the standalone script ``str_replace_editor``
  (``--name value`` arguments, see ``ToolSpec.to_command``).
- ``submit`` and ``finish`` end the episode (``ends_episode=True``); the output
  of their command is what the loop records as the episode's ``submission``:
  the ``git diff`` of the work repository for ``submit``, the answer itself for
  ``finish``.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from uniagent import ToolSpec

from uniagent_tools_swe.blocking import DEFAULT_BLOCKED, BlockRule, coerce_rules, screen

#: Directory of the scripts uploaded into the sandbox (package data of this wheel).
SCRIPTS_DIR = Path(__file__).resolve().parent / "scripts"
#: Exit code of a refused ``execute_bash`` command (126: "cannot execute" in bash).
BLOCKED_EXIT_CODE = 126
#: The python the editor needs in the sandbox; checked once when the tools are installed.
EDITOR_INSTALL_CHECK = (
    "python3 -c 'import sys; sys.exit(0 if sys.version_info >= (3, 6) else "
    '"str_replace_editor needs python3 >= 3.6 in the sandbox, found " + sys.version.split()[0])\''
)


def _plain_optional(schema: dict[str, Any]) -> None:
    """Show ``X | None = None`` fields as plain ``X`` (optional = not required) to the model."""
    schema.pop("description", None)  # the model's docstring is for developers, not the LLM
    for prop in schema.get("properties", {}).values():
        options = prop.get("anyOf")
        if not options or {"type": "null"} not in options:
            continue
        rest = [o for o in options if o != {"type": "null"}]
        if len(rest) == 1:
            del prop["anyOf"]
            prop.update(rest[0])
        else:
            prop["anyOf"] = rest
        if prop.get("default", ...) is None:
            del prop["default"]


class ToolArguments(BaseModel):
    """Base of the argument models: unknown arguments are errors, optional means omittable."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=_plain_optional)


# -- execute_bash ----------------------------------------------------------------------
class ExecuteBashArguments(ToolArguments):
    """Arguments of ``execute_bash``."""

    command: str = Field(
        description="The bash command to run, e.g. `cd /testbed && python -m pytest -x tests/`. "
        "Several commands can be chained with `&&` or `;`, and multi-line scripts and heredocs "
        "are allowed. It runs in the same shell session as earlier calls."
    )


EXECUTE_BASH_DESCRIPTION = (
    "Execute a bash command in the terminal.\n"
    "* The command runs in a persistent shell session: the working directory (`cd`), "
    "environment variables and activated virtual environments persist between calls.\n"
    "* The output (stdout and stderr) and the exit code are returned. Very long output is "
    "truncated, so filter it with `grep`, `head` or `tail`, or redirect it to a file and look"
    " at parts of it.\n"
    "* Commands must finish on their own and must not wait for keyboard input. Use "
    "non-interactive flags (`git --no-pager log`, `apt-get install -y`, `top -b -n 1`) and "
    "bound commands that may not finish with `timeout`, e.g. `timeout 60 python server.py`.\n"
    "* To view, create and edit files prefer the `str_replace_editor` tool."
)


def _refusal(message: str) -> str:
    return f"printf '%s\\n' {shlex.quote(message)}; (exit {BLOCKED_EXIT_CODE})"


def render_execute_bash(
    arguments: Mapping[str, Any], blocked: Iterable[BlockRule] = DEFAULT_BLOCKED
) -> str:
    """The bash command for an ``execute_bash`` call: the command itself, or a refusal."""
    command = str(arguments.get("command") or "")
    if not command.strip():
        return _refusal(
            "execute_bash got an empty command, so nothing was executed. "
            "Pass the bash command to run in `command`."
        )
    verdict = screen(command, tuple(blocked))
    if verdict is not None:
        return _refusal(verdict.message())
    return command


class ExecuteBashSettings(BaseModel):
    """Settings of ``execute_bash`` in the agent config (``tools: [{name, settings}]``)."""

    model_config = ConfigDict(extra="forbid")

    blocked: list[BlockRule] | None = Field(
        None,
        description="the rules of refused commands, replacing the defaults ([] refuses nothing); "
        "null: the defaults",
    )
    allow: list[str] = Field(
        default_factory=list,
        description="names of default rules to drop (editor, git-interactive, pager, monitor, "
        "follow, watch, repl, background, session)",
    )
    extra: list[BlockRule] = Field(
        default_factory=list, description="rules refused besides the defaults (or `blocked`)"
    )

    @field_validator("allow")
    @classmethod
    def _known_rules(cls, names: list[str]) -> list[str]:
        known = [r.name for r in DEFAULT_BLOCKED]
        unknown = [n for n in names if n not in known]
        if unknown:
            raise ValueError(f"no default rule named {unknown[0]!r}; they are: {', '.join(known)}")
        return names

    def rules(self) -> tuple[BlockRule, ...]:
        """The rules in force."""
        base = DEFAULT_BLOCKED if self.blocked is None else tuple(self.blocked)
        return (*(r for r in base if r.name not in self.allow), *self.extra)


def make_execute_bash(
    blocked: Iterable[BlockRule | Mapping[str, Any]] | None = None,
) -> ToolSpec:
    """The ``execute_bash`` tool, refusing the commands caught by ``blocked`` rules.

    ``blocked=None`` uses :data:`DEFAULT_BLOCKED`; ``blocked=()`` runs every
    command; config mappings (``name, label, pattern, reason``) are accepted.
    """
    rules = DEFAULT_BLOCKED if blocked is None else coerce_rules(blocked)
    description = EXECUTE_BASH_DESCRIPTION
    if rules:
        labels = "; ".join(rule.label for rule in rules)
        description += (
            "\n* These commands would hang or break the session and are refused with an "
            f"explanation instead of being run: {labels}."
        )

    def render(arguments: Mapping[str, Any]) -> str:
        return render_execute_bash(arguments, rules)

    return ToolSpec(
        name="execute_bash",
        description=description,
        arguments=ExecuteBashArguments,
        render=render,
        settings=ExecuteBashSettings,
        configure=_configure_execute_bash,
    )


def _configure_execute_bash(settings: ExecuteBashSettings) -> ToolSpec:
    return make_execute_bash(settings.rules())


# -- str_replace_editor ----------------------------------------------------------------
class StrReplaceEditorArguments(ToolArguments):
    """Arguments of ``str_replace_editor``."""

    command: Literal["view", "create", "str_replace", "insert", "undo_edit"] = Field(
        description="The command to run. Allowed options are: `view`, `create`, `str_replace`, "
        "`insert`, `undo_edit`."
    )
    path: str = Field(
        description="Absolute path to a file or directory, e.g. `/testbed/file.py` or `/testbed`."
    )
    file_text: str | None = Field(
        default=None,
        description="Required parameter of `create` command, with the content of the file to "
        "be created.",
    )
    old_str: str | None = Field(
        default=None,
        description="Required parameter of `str_replace` command containing the string in "
        "`path` to replace. It must match exactly one place in the file, including whitespace "
        "and indentation.",
    )
    new_str: str | None = Field(
        default=None,
        description="Optional parameter of `str_replace` command containing the new string (if "
        "not given, `old_str` is deleted). Required parameter of `insert` command containing "
        "the string to insert.",
    )
    insert_line: int | None = Field(
        default=None,
        ge=0,
        description="Required parameter of `insert` command. The `new_str` will be inserted "
        "AFTER the line `insert_line` of `path`; 0 inserts at the top of the file.",
    )
    view_range: list[int] | None = Field(
        default=None,
        min_length=2,
        max_length=2,
        description="Optional parameter of `view` command when `path` points to a file. If "
        "none is given, the full file is shown. If provided, the file will be shown in the "
        "indicated line number range, e.g. [11, 12] will show lines 11 and 12. Indexing at 1 "
        "to start. Setting `[start_line, -1]` shows all lines from `start_line` to the end of "
        "the file.",
    )


STR_REPLACE_EDITOR_DESCRIPTION = (
    "Custom editing tool for viewing, creating and editing files.\n"
    "* State is persistent across command calls: `undo_edit` reverts the edits of a file one "
    "at a time, most recent first.\n"
    "* Paths must be absolute, e.g. `/testbed/src/module.py`.\n"
    "* If `path` is a file, `view` displays the result of applying `cat -n`. If `path` is a "
    "directory, `view` lists non-hidden files and directories up to 2 levels deep.\n"
    "* The `create` command cannot be used if the specified `path` already exists; it creates"
    " missing parent directories.\n"
    "* If a `command` generates a long output, it will be truncated and marked with "
    "`<response clipped>`.\n"
    "* After an edit, a snippet of the edited part of the file is shown with line numbers.\n"
    "* The `undo_edit` command will revert the last edit made to the file at `path` (undoing "
    "`create` removes the file).\n"
    "\n"
    "Notes for using the `str_replace` command:\n"
    "* The `old_str` parameter should match EXACTLY one or more consecutive lines from the "
    "original file. Be mindful of whitespace and indentation!\n"
    "* If the `old_str` parameter is not unique in the file, the replacement will not be "
    "performed. Make sure to include enough context in `old_str` to make it unique.\n"
    "* The `new_str` parameter should contain the edited lines that should replace the "
    "`old_str`; leave it out to delete `old_str`."
)


def make_str_replace_editor() -> ToolSpec:
    """The ``str_replace_editor`` tool (the standalone script ``scripts/str_replace_editor``)."""
    return ToolSpec(
        name="str_replace_editor",
        description=STR_REPLACE_EDITOR_DESCRIPTION,
        arguments=StrReplaceEditorArguments,
        scripts=(SCRIPTS_DIR / "str_replace_editor",),
        install=EDITOR_INSTALL_CHECK,
    )


# -- submit and finish -----------------------------------------------------------------
class SubmitArguments(ToolArguments):
    """``submit`` takes no arguments."""


SUBMIT_DESCRIPTION = (
    "Submit your changes and end the task.\n"
    "* Call it once you have made and checked all your changes to the repository; you cannot "
    "run any tool afterwards.\n"
    "* The submission is the `git diff` of the repository you are working in (modified, added"
    " and deleted files, against the checked-out commit). Do not commit your changes.\n"
    "* Remove temporary files and scripts you created (e.g. reproduction scripts) before "
    "submitting, unless they are part of the fix."
)


#: New files left out of ``submit``'s diff by default (gitignore syntax): what running
#: Python code, its tests and its linters drops into a repository that ignores nothing.
DEFAULT_SUBMIT_EXCLUDE: tuple[str, ...] = (
    "__pycache__/",
    "*.py[cod]",
    "*$py.class",
    ".pytest_cache/",
    ".mypy_cache/",
    ".ruff_cache/",
    ".hypothesis/",
    ".coverage",
    ".coverage.*",
    "*.egg-info/",
)


class SubmitSettings(BaseModel):
    """Settings of ``submit`` in the agent config (``tools: [{name: submit, settings}]``)."""

    model_config = ConfigDict(extra="forbid")

    exclude: list[str] = Field(
        default_factory=lambda: list(DEFAULT_SUBMIT_EXCLUDE),
        description="gitignore-style patterns of new files left out of the submission (files "
        "of the base commit are always diffed); [] leaves nothing out; default: bytecode and "
        "test/lint caches (" + ", ".join(DEFAULT_SUBMIT_EXCLUDE) + ")",
    )
    extra_exclude: list[str] = Field(
        default_factory=list, description="patterns left out besides `exclude`"
    )

    @field_validator("exclude", "extra_exclude")
    @classmethod
    def _one_line_patterns(cls, patterns: list[str]) -> list[str]:
        for pattern in patterns:
            if not pattern.strip() or pattern.lstrip().startswith("#"):
                raise ValueError(f"{pattern!r} is not a pattern (empty, or a gitignore comment)")
            if any(c in pattern for c in "\n\r\0"):
                raise ValueError(f"pattern {pattern!r} spans lines; give one pattern per item")
        return patterns

    def patterns(self) -> tuple[str, ...]:
        """The patterns in force."""
        return (*self.exclude, *self.extra_exclude)


def render_submit(exclude: Iterable[str] = DEFAULT_SUBMIT_EXCLUDE) -> str:
    """The bash command for a ``submit`` call: the script, with the patterns it leaves out."""
    return shlex.join(["submit", *(f"--exclude={pattern}" for pattern in exclude)])


def make_submit(exclude: Iterable[str] | None = None) -> ToolSpec:
    """The ``submit`` tool: ends the episode; its output (the repo's diff) is the submission.

    New files matching an ``exclude`` pattern (gitignore syntax; ``None``:
    :data:`DEFAULT_SUBMIT_EXCLUDE`, ``()``: none) are left out of the diff.
    """
    patterns = (
        DEFAULT_SUBMIT_EXCLUDE
        if exclude is None
        else SubmitSettings(exclude=list(exclude)).patterns()
    )
    command = render_submit(patterns)
    description = SUBMIT_DESCRIPTION
    if patterns:
        shown = ", ".join(f"`{pattern}`" for pattern in patterns)
        description += f"\n* New files matching these patterns are left out: {shown}."
    return ToolSpec(
        name="submit",
        description=description,
        arguments=SubmitArguments,
        scripts=(SCRIPTS_DIR / "submit",),
        render=lambda arguments: command,
        ends_episode=True,
        settings=SubmitSettings,
        configure=_configure_submit,
    )


def _configure_submit(settings: SubmitSettings) -> ToolSpec:
    return make_submit(settings.patterns())


class FinishArguments(ToolArguments):
    """Arguments of ``finish``."""

    answer: str = Field(
        description="Your final answer to the task, complete and self-contained: it is recorded "
        "as the result exactly as written."
    )


FINISH_DESCRIPTION = (
    "Finish the task and give your final answer.\n"
    "* Call it once you have the answer; it ends the task and you cannot run any tool "
    "afterwards.\n"
    "* `answer` is recorded as the result of the task exactly as you write it."
)


def render_finish(arguments: Mapping[str, Any]) -> str:
    """The bash command for a ``finish`` call: print the answer, which becomes the submission."""
    return f"printf '%s\\n' {shlex.quote(str(arguments.get('answer') or ''))}"


def make_finish() -> ToolSpec:
    """The ``finish`` tool: ends the episode; its output (the answer) is the submission."""
    return ToolSpec(
        name="finish",
        description=FINISH_DESCRIPTION,
        arguments=FinishArguments,
        render=render_finish,
        ends_episode=True,
    )


def make_tools(
    blocked: Iterable[BlockRule | Mapping[str, Any]] | None = None,
) -> tuple[ToolSpec, ...]:
    """All four tools; ``blocked`` configures ``execute_bash`` (see :func:`make_execute_bash`)."""
    return (make_execute_bash(blocked), make_str_replace_editor(), make_submit(), make_finish())
