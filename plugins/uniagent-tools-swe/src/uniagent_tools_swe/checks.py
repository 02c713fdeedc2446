"""The checks of the default screening rules: does a parsed simple command block?

Each check reads the program's arguments the way the program does (options,
option values, the script or code it is given) and the command's stdin and
stdout, and answers only for the command it is given; where the command would
not block (``python -c``, ``less f | head``, ``git commit -m``) it says so.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from uniagent_tools_swe.shell import SimpleCommand, shell_arguments


def _info(args: Sequence[str], *short: str) -> bool:
    """Whether the arguments ask for the version or the help (the program prints and exits)."""
    return any(a in ("--version", "--help", *short) for a in args)


def _flags(
    args: Sequence[str], values: str = "", long_values: Iterable[str] = (), optional: str = ""
) -> set[str]:
    """The short flags (letters) and long options (``--name``) given before ``--``.

    ``values``: short options that take a value (attached, else the next argument);
    ``optional``: short options whose value, if any, is attached (``-uno``);
    ``long_values``: long options that take the next argument (unless ``=`` is used).
    """
    found: set[str] = set()
    long_values = set(long_values)
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if arg == "--":
            break
        if arg.startswith("--"):
            name = arg.split("=", 1)[0]
            found.add(name)
            if name in long_values and "=" not in arg:
                i += 1
        elif arg.startswith("-") and len(arg) > 1:
            for k, letter in enumerate(arg[1:], start=1):
                found.add(letter)
                if letter in values or letter in optional:
                    if letter in values and k == len(arg) - 1:
                        i += 1  # the value is the next argument
                    break
    return found


_EDITORS = frozenset(
    {
        "vi",
        "vim",
        "nvim",
        "view",
        "vimdiff",
        "nano",
        "pico",
        "micro",
        "joe",
        "mcedit",
        "emacs",
        "emacsclient",
        "ne",
    }
)


def editor(c: SimpleCommand) -> bool:
    """An interactive editor (``vim``, ``nano``, ``emacs -nw``), not a batch run."""
    if c.program not in _EDITORS or _info(c.args, "-h"):
        return False
    flags = _flags(c.args)
    if c.program == "emacs":
        return not (flags & {"--batch", "--script"} or {"-batch", "-script"} & set(c.args))
    if c.program == "emacsclient":
        return not flags & {"e", "--eval"}
    if c.program in ("vi", "vim", "nvim", "view", "vimdiff"):
        return not ("s" in flags and flags & {"e", "E"}) and "--headless" not in flags
    return True


def _editor_value_is_interactive(value: str) -> bool:
    words = value.split()
    return bool(words) and words[0].rsplit("/", 1)[-1] in _EDITORS


def _editor_overridden(c: SimpleCommand, config: Sequence[str], *, sequence: bool) -> bool:
    """Whether the command line sets git's editor to something that is not interactive."""
    names = ("GIT_SEQUENCE_EDITOR",) if sequence else ("GIT_EDITOR", "VISUAL", "EDITOR")
    keys = ("sequence.editor",) if sequence else ("core.editor",)
    values = [a.split("=", 1)[1] for a in c.env if a.split("=", 1)[0] in names]
    values += [a.split("=", 1)[1] for a in config if a.split("=", 1)[0].lower() in keys]
    return any(not _editor_value_is_interactive(v) for v in values)


_GIT_VALUE_OPTIONS = frozenset(
    {
        "-C",
        "-c",
        "--git-dir",
        "--work-tree",
        "--namespace",
        "--config-env",
        "--super-prefix",
        "--exec-path",
    }
)


def git_interactive(c: SimpleCommand) -> bool:
    """A git command that opens an editor or asks questions on the terminal."""
    if c.program != "git":
        return False
    args, config, i = c.args, [], 0
    while i < len(args) and args[i].startswith("-"):
        if args[i] == "-c" and i + 1 < len(args):
            config.append(args[i + 1])
        i += 2 if args[i] in _GIT_VALUE_OPTIONS else 1
    if i >= len(args):
        return False
    subcommand, rest = args[i], args[i + 1 :]
    if subcommand == "commit":
        return _commit_opens_editor(rest) and not _editor_overridden(c, config, sequence=False)
    if subcommand == "rebase":
        flags = _flags(
            rest, values="sXx", optional="CS", long_values={"--exec", "--strategy", "--onto"}
        )
        return bool(flags & {"i", "--interactive"}) and not _editor_overridden(
            c, config, sequence=True
        )
    if subcommand == "add":
        flags = _flags(rest)
        if flags & {"e", "--edit"} and not _editor_overridden(c, config, sequence=False):
            return True
        # -p and -i ask their questions on stdin, so they work with answers piped in.
        return bool(flags & {"p", "i", "--patch", "--interactive"}) and not c.stdin_redirected
    return False


def _commit_opens_editor(args: Sequence[str]) -> bool:
    flags = _flags(
        args,
        values="mFCct",
        optional="uS",
        long_values={
            "--message",
            "--file",
            "--reuse-message",
            "--reedit-message",
            "--template",
            "--fixup",
            "--squash",
            "--author",
            "--date",
            "--cleanup",
            "--trailer",
            "--pathspec-from-file",
        },
    )
    if flags & {"e", "--edit", "c", "--reedit-message"}:
        return True
    given = {
        "m",
        "F",
        "C",
        "h",
        "--message",
        "--file",
        "--reuse-message",
        "--no-edit",
        "--fixup",
        "--dry-run",
        "--help",
    }
    return not flags & given


_PAGERS = frozenset({"less", "more", "most", "pg"})


def pager(c: SimpleCommand) -> bool:
    """A pager writing to the terminal."""
    # A pager reads keys from the terminal only when it writes to it; with its output
    # piped, redirected or captured ($(less f)) it copies its input like cat.
    return c.program in _PAGERS and not c.stdout_redirected and not _info(c.args, "-V")


_MONITORS = frozenset({"top", "htop", "atop", "btop", "iotop", "nmon", "glances"})


def monitor(c: SimpleCommand) -> bool:
    """A full-screen monitor (``top`` not in batch mode, ``htop``)."""
    if c.program not in _MONITORS or _info(c.args, "-v", "-V", "-h"):
        return False
    if c.program in ("top", "iotop"):  # batch mode, or a number of refreshes, ends
        return not _flags(c.args, values="dnpuUoE") & {"b", "--batch", "n", "--iter"}
    return True


def follows(c: SimpleCommand) -> bool:
    """Following a log (``tail -f``, ``journalctl -f``, ``docker logs -f``)."""
    if c.program == "tail":
        flags = _flags(
            c.args,
            values="cns",
            long_values={
                "--pid",
                "--sleep-interval",
                "--lines",
                "--bytes",
                "--max-unchanged-stats",
            },
        )
        return bool(flags & {"f", "F", "--follow"})
    if c.program == "journalctl":
        flags = _flags(c.args, values="nuptSUoDMgF", long_values={"--unit", "--lines"})
        return bool(flags & {"f", "--follow"})
    if c.program in ("docker", "podman", "kubectl", "nerdctl") and "logs" in c.args:
        rest = c.args[c.args.index("logs") + 1 :]
        return bool(
            _flags(
                rest,
                values="ncl",
                long_values={"--tail", "--since", "--until", "--container", "--namespace"},
            )
            & {"f", "--follow"}
        )
    return False


def watch(c: SimpleCommand) -> bool:
    """``watch``, which reruns a command until interrupted."""
    return c.program == "watch" and not _info(c.args, "-v", "-h")


_PYTHON = re.compile(r"^(python|pypy)[0-9.]*$|^(ipython[0-9]*|bpython)$")


@dataclass(frozen=True)
class _Interpreter:
    """How an interpreter's arguments give it code to run instead of the terminal."""

    code: str  # short options whose value is code (python -c, node -e)
    ends_options: str = ""  # short options after which the rest are the program's (python -m)
    values: str = ""  # other short options that take a value
    long_code: frozenset[str] = frozenset()
    long_values: frozenset[str] = frozenset()
    info: tuple[str, ...] = ()
    files_are_code: bool = True  # ghci loads its files and still starts its prompt


_INTERPRETERS: dict[str, _Interpreter] = {
    "python": _Interpreter(
        code="c",
        ends_options="m",
        values="WX",
        info=("-V", "-h"),
        long_values=frozenset({"--check-hash-based-pycs"}),
    ),
    "node": _Interpreter(
        code="ep",
        values="rC",
        info=("-v", "-h"),
        long_code=frozenset({"--eval", "--print"}),
        long_values=frozenset(
            {"--require", "--import", "--loader", "--conditions", "--input-type"}
        ),
    ),
    "irb": _Interpreter(code="", values="Ir", info=("-v", "-h")),
    "ghci": _Interpreter(code="e", info=("--info", "--numeric-version"), files_are_code=False),
    "lua": _Interpreter(code="e", values="lW", info=("-v",)),
    "julia": _Interpreter(
        code="eE", values="ptJLCO", info=("-v", "-h"), long_code=frozenset({"--eval", "--print"})
    ),
}


def _interpreter_blocks(spec: _Interpreter, args: Sequence[str], stdin_redirected: bool) -> bool:
    """Whether the interpreter would read code from the terminal (a prompt, or ``-``)."""
    if _info(args, *spec.info):
        return False
    interactive, has_code = False, False
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if arg == "--" or arg == "-" or not arg.startswith("-"):
            has_code = (arg != "-" and (arg != "--" or i < len(args))) and spec.files_are_code
            break
        if arg.startswith("--"):
            name = arg.split("=", 1)[0]
            interactive = interactive or name == "--interactive"
            if name in spec.long_code:
                has_code = True
                break
            if name in spec.long_values and "=" not in arg:
                i += 1
            continue
        done = False
        for k, letter in enumerate(arg[1:], start=1):
            if letter == "i":
                interactive = True
            elif letter in spec.code or letter in spec.ends_options:
                has_code, done = True, True
                break
            elif letter in spec.values:
                i += 1 if k == len(arg) - 1 else 0
                break
        if done:
            break
    return not stdin_redirected and (interactive or not has_code)


def repl(c: SimpleCommand) -> bool:
    """An interpreter or shell that would read code from the terminal."""
    program, args = c.program, c.args
    if _PYTHON.match(program):
        return _interpreter_blocks(_INTERPRETERS["python"], args, c.stdin_redirected)
    if program in ("node", "nodejs"):
        return _interpreter_blocks(_INTERPRETERS["node"], args, c.stdin_redirected)
    if program in _INTERPRETERS:
        return _interpreter_blocks(_INTERPRETERS[program], args, c.stdin_redirected)
    if program in ("bash", "sh", "dash", "zsh", "ksh", "fish"):
        shell = shell_arguments(args)
        if shell.info or shell.command is not None or shell.script is not None:
            return False
        if program == "fish" and any(a.startswith("--command") for a in args):
            return False
        return not c.stdin_redirected  # it reads its commands from the terminal
    if program == "su":
        flags = _flags(args, values="sgG", long_values={"--shell", "--group"})
        return not flags & {"c", "--command", "--session-command", "h", "--help", "--version"}
    if program in ("sudo", "doas"):  # no command after the options: `sudo -i`, `sudo -s`
        flags = _flags(args, values="ugpCDUrtT", optional="h")
        return bool(flags & {"i", "s", "--login", "--shell"})
    return False


def unredirected_background(c: SimpleCommand) -> bool:
    """The last command of a background job whose output goes to the terminal."""
    return c.background and not c.stdout_redirected


def ends_session(c: SimpleCommand) -> bool:
    """``exit``, ``logout``, ``exec`` or ``set -e`` (errexit) in the session's shell."""
    program = c.argv[0] if c.argv else ""
    if program in ("exit", "logout", "exec"):
        return True
    if program != "set":
        return False
    args = c.args
    for i, arg in enumerate(args):
        if arg == "--" or not arg.startswith("-"):
            break
        if "e" in arg[1:] and not arg.startswith("--"):
            return True
        if arg.startswith("-o") and (arg[2:] or (args[i + 1] if i + 1 < len(args) else "")) == (
            "errexit"
        ):
            return True
    return False


@dataclass(frozen=True)
class Trigger:
    """What a command line must contain for a check to catch one of its commands: one of
    ``names`` as a whole word (``\\w+``), or one of ``texts`` anywhere."""

    names: frozenset[str] = frozenset()
    texts: tuple[str, ...] = ()


#: For each check, what must be in a command line, with its quotes, backslashes and line
#: continuations removed (:func:`uniagent_tools_swe.blocking.may_block`), for the check to
#: answer ``True`` for a command of it: every program name it can catch. Where none is
#: found no command of the line can be caught, and the line need not be parsed.
#: Over-inclusive on purpose (``vim`` in a file name, ``set`` in an option): those lines
#: are parsed and checked as before.
TRIGGERS: dict[Callable[[SimpleCommand], bool], Trigger] = {
    editor: Trigger(_EDITORS),
    git_interactive: Trigger(frozenset({"git"})),
    pager: Trigger(_PAGERS),
    monitor: Trigger(_MONITORS),
    follows: Trigger(frozenset({"tail", "journalctl", "docker", "podman", "kubectl", "nerdctl"})),
    watch: Trigger(frozenset({"watch"})),
    repl: Trigger(
        frozenset({"node", "nodejs", "bash", "sh", "dash", "zsh", "ksh", "fish", "su"})
        | {"sudo", "doas", *_INTERPRETERS},
        ("python", "pypy"),  # python3.11, ipython3: the name anywhere (_PYTHON needs it whole)
    ),
    unredirected_background: Trigger(texts=("&",)),
    ends_session: Trigger(frozenset({"exit", "logout", "exec", "set"})),
}
