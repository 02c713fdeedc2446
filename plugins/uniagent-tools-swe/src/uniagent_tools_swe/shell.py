"""The simple commands of a bash command line, found by parsing it with bashlex.

bashlex is a port of bash's own grammar, so a word is in command position only
where bash would run it: ``for n in python python3`` lists words, ``git
commit-tree`` is one program with its arguments, ``x=$(python)`` runs
``python`` in a command substitution. Each :class:`SimpleCommand` carries what
decides whether it can block: its program and arguments once wrappers
(``sudo``, ``env X=1``, ``timeout N``, ...) are looked through, and whether its
stdin and stdout are the terminal or a pipe, a file or a capture.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

#: Leading ``NAME=value`` words of a command (or of ``env``).
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\[[^\]]*\])?\+?=")
#: Programs that take a script with ``-c``, screened like the command line itself.
SHELLS = frozenset({"bash", "sh", "dash", "zsh", "ksh"})
_MAX_NESTING = 4  # bash -c 'bash -c ...' levels that are looked into

#: Wrappers that run the command after their options, with their options that take a
#: separate value. ``timeout`` also takes a duration; ``env`` and ``sudo`` take
#: ``NAME=value`` words.
_WRAPPERS: dict[str, frozenset[str]] = {
    "sudo": frozenset(
        {
            "-u",
            "-g",
            "-p",
            "-C",
            "-D",
            "-U",
            "-h",
            "-r",
            "-t",
            "-T",
            "--user",
            "--group",
            "--prompt",
            "--close-from",
            "--chdir",
            "--other-user",
            "--host",
            "--role",
            "--type",
            "--command-timeout",
        }
    ),
    "doas": frozenset({"-u", "-C"}),
    "env": frozenset({"-u", "-C", "--unset", "--chdir"}),
    "nohup": frozenset(),
    "time": frozenset({"-o", "-f", "--output", "--format"}),
    "command": frozenset(),
    "builtin": frozenset(),
    "nice": frozenset({"-n", "--adjustment"}),
    "ionice": frozenset({"-c", "-n", "--class", "--classdata"}),
    "stdbuf": frozenset({"-i", "-o", "-e", "--input", "--output", "--error"}),
    "setsid": frozenset(),
    "timeout": frozenset({"-s", "-k", "--signal", "--kill-after"}),
}


@dataclass(frozen=True)
class SimpleCommand:
    """One simple command of a bash command line, with what decides whether it can block.

    ``words`` are its words, leading ``NAME=value`` assignments included and
    redirections (``redirects``) not; ``dynamic`` holds the indexes of words whose
    value bash only knows when it runs (``$x``, ``$(cmd)``). ``piped``: stdin reads
    a pipe. ``background``: the last command of a job sent to the background with
    ``&``. ``subshell``: it runs in a child process (``( )``, ``$( )``, a pipeline, a
    background job, ``bash -c``), so it cannot end the session's shell.
    ``stdin_redirected`` / ``stdout_redirected``: stdin does not read, or stdout does
    not write, the terminal (a pipe, a file, a here-document, a capture, also one
    set on an enclosing group or loop). ``bounded``: it runs under ``timeout``.
    ``detached``: it is part of a background job, which the session does not wait for.
    """

    words: tuple[str, ...]
    piped: bool = False
    background: bool = False
    subshell: bool = False
    redirects: tuple[str, ...] = ()
    stdin_redirected: bool = False
    stdout_redirected: bool = False
    bounded: bool = False
    dynamic: frozenset[int] = frozenset()
    detached: bool = False
    #: The program and its arguments once assignments and wrappers are looked through.
    argv: tuple[str, ...] = field(init=False, compare=False)
    #: ``NAME=value`` words given to the program (before it, or to ``env``).
    env: tuple[str, ...] = field(init=False, compare=False)
    #: Whether the program's own word is known before bash runs it (not ``$prog``).
    known: bool = field(init=False, compare=False)

    def __post_init__(self) -> None:
        argv, env, bounded, first = _unwrap(self.words)
        object.__setattr__(self, "argv", argv)
        object.__setattr__(self, "env", env)
        object.__setattr__(self, "known", bool(argv) and first not in self.dynamic)
        if bounded and not self.bounded:
            object.__setattr__(self, "bounded", True)

    @property
    def program(self) -> str:
        """The program's name without its directory (``/usr/bin/vim`` → ``vim``), or ``""``."""
        if not self.argv:
            return ""
        return self.argv[0].rsplit("/", 1)[-1] or self.argv[0]

    @property
    def args(self) -> tuple[str, ...]:
        """The program's arguments."""
        return self.argv[1:]

    def normalized(self) -> str:
        """The text pattern rules match: program and arguments, redirections, ``| ``/`` &``."""
        if not self.argv:
            return ""
        text = " ".join((self.program, *self.args, *self.redirects))
        if self.piped:
            text = "| " + text
        if self.background:
            text += " &"
        return text


def _unwrap(words: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...], bool, int]:
    """(argv, assignments, under ``timeout``, index of the program word) of ``words``."""
    i, env, bounded = 0, [], False
    while i < len(words) and ASSIGNMENT.match(words[i]):
        env.append(words[i])
        i += 1
    while i < len(words):
        name = words[i].rsplit("/", 1)[-1]
        takes_value = _WRAPPERS.get(name)
        if takes_value is None:
            break
        j = i + 1
        while j < len(words) and words[j].startswith("-") and words[j] != "-":
            if words[j] == "--":
                j += 1
                break
            if name == "command" and words[j] in ("-v", "-V"):
                return words[i:], tuple(env), bounded, i  # a lookup: nothing is run
            j += 2 if words[j] in takes_value else 1
        while name in ("env", "sudo") and j < len(words) and ASSIGNMENT.match(words[j]):
            env.append(words[j])
            j += 1
        if name == "timeout":
            j += 1  # the duration
        if j >= len(words):
            break  # no command after the wrapper: the wrapper is the program
        bounded = bounded or name == "timeout"
        i = j
    return words[i:], tuple(env), bounded, i


@dataclass(frozen=True)
class _Context:
    """What the commands inside a part of the tree inherit from around it."""

    source: str = ""  # the text the tree's positions index
    subshell: bool = False
    piped: bool = False  # stdin reads a pipe
    stdin: bool = False  # stdin does not read the terminal
    stdout: bool = False  # stdout does not write the terminal
    bounded: bool = False
    detached: bool = False
    nesting: int = 0


def parse_commands(script: str) -> list[SimpleCommand] | None:
    """The simple commands of ``script`` in the order bash runs them; ``None``: unparsable.

    ``None`` means bashlex could not parse the command line, either because it is
    not valid bash (bash itself will say so) or because it uses a construct bashlex
    does not implement (``case``, ``select``, ``coproc``, ``for ((...))``).
    """
    return _parse(script, _Context())


def split_commands(script: str) -> list[SimpleCommand]:
    """The simple commands of ``script`` (none when bashlex cannot parse it)."""
    return parse_commands(script) or []


def _parse(script: str, ctx: _Context) -> list[SimpleCommand] | None:
    # Imported at the first parse: most command lines never need it (``may_block``), and
    # its import is ~130 ms of every run's start-up.
    import bashlex

    source = _bashlex_friendly(script)
    out: list[SimpleCommand] = []
    try:
        for node in bashlex.parse(source):
            _walk(node, replace(ctx, source=source), out)
    except Exception:  # noqa: BLE001 - bashlex raises many kinds on input it cannot
        # handle: ParsingError, NotImplementedError, IndexError, RecursionError, ...
        return None
    return out


# -- walking bashlex's tree ------------------------------------------------------------------
def _walk(node: Any, ctx: _Context, out: list[SimpleCommand]) -> None:
    kind = node.kind
    if kind == "command":
        _command(node, ctx, out)
    elif kind == "list":
        _list(node.parts, ctx, out)
    elif kind == "pipeline":
        _pipeline(node, ctx, out)
    elif kind == "compound":
        inner = ctx
        if node.list and getattr(node.list[0], "word", None) == "(":
            inner = replace(inner, subshell=True)
        inner = _redirected(inner, node.redirects or (), out)
        _list(node.list, inner, out)
    elif kind in ("if", "for", "while", "until", "function"):
        for part in node.parts:
            if part.kind == "word":  # the words of a for list, a function's name
                _substitutions(part, ctx, out)
            elif part.kind not in ("reservedword", "operator"):
                _walk(part, ctx, out)
    # reservedword, operator, pipe: nothing runs


def _list(parts: list[Any], ctx: _Context, out: list[SimpleCommand]) -> None:
    """A list's elements; one followed by ``&`` is a job in the background."""
    for i, part in enumerate(parts):
        if part.kind in ("operator", "reservedword"):
            continue
        following = parts[i + 1] if i + 1 < len(parts) else None
        if following is not None and getattr(following, "op", None) == "&":
            job: list[SimpleCommand] = []
            _walk(part, replace(ctx, subshell=True, detached=True), job)
            if job:
                job[-1] = replace(job[-1], background=True)
            out.extend(job)
        else:
            _walk(part, ctx, out)


def _pipeline(node: Any, ctx: _Context, out: list[SimpleCommand]) -> None:
    members = [p for p in node.parts if p.kind not in ("pipe", "reservedword")]
    several = len(members) > 1  # bash runs each command of a pipeline in a subshell
    for i, member in enumerate(members):
        inner = replace(
            ctx,
            subshell=ctx.subshell or several,
            piped=ctx.piped if i == 0 else True,
            stdin=ctx.stdin or i > 0,
            stdout=ctx.stdout or i < len(members) - 1,
        )
        _walk(member, inner, out)


def _command(node: Any, ctx: _Context, out: list[SimpleCommand]) -> None:
    words: list[str] = []
    dynamic: set[int] = set()
    for part in node.parts:
        if part.kind in ("word", "assignment"):
            if _substitutions(part, ctx, out):
                dynamic.add(len(words))
            words.append(part.word)
    if not words:  # only redirections, e.g. `> file`
        _redirected(ctx, [p for p in node.parts if p.kind == "redirect"], out)
        return
    own = _redirected(
        replace(ctx, stdin=False, stdout=False),
        [p for p in node.parts if p.kind == "redirect"],
        out,
    )
    command = SimpleCommand(
        tuple(words),
        redirects=tuple(_redirect_text(p) for p in node.parts if p.kind == "redirect"),
        piped=ctx.piped and not own.stdin,
        subshell=ctx.subshell,
        stdin_redirected=ctx.stdin or own.stdin,
        stdout_redirected=ctx.stdout or own.stdout,
        bounded=ctx.bounded,
        dynamic=frozenset(dynamic),
        detached=ctx.detached,
    )
    out.append(command)
    _nested_script(command, ctx, out)


def _nested_script(command: SimpleCommand, ctx: _Context, out: list[SimpleCommand]) -> None:
    """The commands of ``bash -c SCRIPT`` (a child process) and ``eval WORDS`` (this shell)."""
    if ctx.nesting >= _MAX_NESTING or not command.known:
        return
    first = len(command.words) - len(command.argv)  # the program's index in words
    inner = replace(
        ctx,
        nesting=ctx.nesting + 1,
        bounded=command.bounded,
        piped=command.piped,
        stdin=command.stdin_redirected,
        stdout=command.stdout_redirected,
    )
    script: str | None = None
    if command.program == "eval":
        if command.args and not any(i > first for i in command.dynamic):
            script = " ".join(command.args)
    elif command.program in SHELLS:
        index = shell_arguments(command.args).command
        if index is not None and first + 1 + index not in command.dynamic:
            script = command.args[index]
            inner = replace(inner, subshell=True)
    if script is not None:
        out.extend(_parse(script, inner) or ())


@dataclass(frozen=True)
class ShellArguments:
    """What the arguments of a shell (``bash``, ``sh``, ...) ask it to do."""

    command: int | None = None  # index of the -c command string
    script: int | None = None  # index of the script file
    interactive: bool = False  # -i or --login
    reads_stdin: bool = False  # -s
    info: bool = False  # --version, --help: prints and exits (or stops with an error)


#: Shell options that take the next argument as their value.
_SHELL_VALUE_OPTIONS = frozenset({"-o", "+o", "-O", "+O", "--rcfile", "--init-file"})


def shell_arguments(args: tuple[str, ...]) -> ShellArguments:
    """Parse a shell's arguments (options, then ``-c STRING`` or a script file)."""
    interactive = reads_stdin = wants_command = False
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in ("--version", "--help"):
            return ShellArguments(info=True)
        if arg == "--":
            i += 1
            break
        if arg in _SHELL_VALUE_OPTIONS:
            i += 2
            continue
        if arg.startswith("--"):
            interactive = interactive or arg == "--login"
            i += 1
            continue
        if len(arg) < 2 or arg[0] not in "-+":
            break
        flags = arg[1:]
        if arg[0] == "-":
            wants_command = wants_command or "c" in flags
            interactive = interactive or "i" in flags
            reads_stdin = reads_stdin or "s" in flags
        i += 1
    if wants_command:  # without the string the shell stops with an error at once
        if i >= len(args):
            return ShellArguments(info=True)
        return ShellArguments(command=i, interactive=interactive)
    if i < len(args) and not reads_stdin:
        return ShellArguments(script=i, interactive=interactive)
    return ShellArguments(interactive=interactive, reads_stdin=reads_stdin)


def _substitutions(word: Any, ctx: _Context, out: list[SimpleCommand]) -> bool:
    """Walk the ``$( )``, backquotes and ``<( )`` of a word; whether its value is dynamic."""
    dynamic = False
    for part in getattr(word, "parts", None) or ():
        if part.kind == "commandsubstitution":
            _walk(part.command, replace(ctx, subshell=True, stdout=True), out)  # captured
            dynamic = True
        elif part.kind == "processsubstitution":
            reads = ctx.source[part.pos[0] : part.pos[0] + 1] == ">"  # >(cmd) reads, <(cmd) writes
            inner = replace(
                ctx,
                subshell=True,
                piped=reads or ctx.piped,
                stdin=ctx.stdin or reads,
                stdout=not reads,
            )
            _walk(part.command, inner, out)
            dynamic = True
        elif part.kind == "parameter":
            dynamic = True
    return dynamic


def _redirected(ctx: _Context, redirects: Iterable[Any], out: list[SimpleCommand]) -> _Context:
    """``ctx`` with the effect of ``redirects`` on stdin and stdout."""
    for redirect in redirects:
        target, fd, kind = redirect.output, redirect.input, redirect.type
        if hasattr(target, "kind"):
            _substitutions(target, ctx, out)
        to_file = hasattr(target, "word") and target.word != "/dev/tty"
        if kind in ("<", "<<", "<<-", "<<<", "<>", "<&"):
            if fd in (None, 0):
                ctx = replace(ctx, stdin=True, piped=False)
        elif to_file and (  # >&2 and friends still write the terminal
            kind in ("&>", "&>>") or (kind in (">", ">>", ">|", ">&") and fd in (None, 1))
        ):
            ctx = replace(ctx, stdout=True)
    return ctx


def _redirect_text(redirect: Any) -> str:
    fd = "" if redirect.input is None else str(redirect.input)
    target = redirect.output
    if hasattr(target, "word"):
        return f"{fd}{redirect.type} {target.word}"
    return f"{fd}{redirect.type}{target}"  # to a descriptor: 2>&1


# -- what bashlex does not parse -----------------------------------------------------------------
# bashlex does not implement a few constructs that agents write, and compares a quoted
# here-document delimiter (<<'EOF', a quarter of all the commands of the agent corpus in
# the tests) with the body's lines quotes and all. The rewrites below turn each into a
# plain word the parser takes, with no command inside (or drop the `time` keyword): they
# touch only text where no program is run (the delimiter's quotes, arithmetic, [[ test ]]
# expressions, array literals), so they cannot put a word into command position.
# Anything else bashlex rejects makes parse_commands return None.
_HEREDOC_QUOTED = re.compile(
    r"(?<!<)<<(-?)[ \t]*(?:'([\w.@%+-]+)'|\"([\w.@%+-]+)\"|\\([\w.@%+-]+))"
)
_TIME = re.compile(r"(^|[\n;&|({!]|\b(?:then|do|else)\b)([ \t]*)time(?:[ \t]+-p)?(?=[ \t])")
_ARRAY = re.compile(r"(?:^|(?<=[\s;&|(]))[A-Za-z_][A-Za-z0-9_]*\+?=\(")
_TEST_OPEN = re.compile(r"(?:^|(?<=[\s;&|(!]))\[\[(?=[ \t])")


def _bashlex_friendly(script: str) -> str:
    script = _HEREDOC_QUOTED.sub(lambda m: "<<" + m[1] + (m[2] or m[3] or m[4]), script)
    script = _TIME.sub(r"\1\2", script)  # the time keyword times the pipeline after it
    for opener, start_at in _constructs(script):
        script = _replace_spans(script, opener, start_at)
    return script


def _constructs(script: str) -> Iterator[tuple[str, re.Pattern[str]]]:
    if "$((" in script or "$[" in script:
        yield "arith", re.compile(r"\$\(\(|\$\[")
    if "=(" in script:
        yield "array", _ARRAY
    if "[[" in script:
        yield "test", _TEST_OPEN


def _replace_spans(script: str, kind: str, start_at: re.Pattern[str]) -> str:
    pieces: list[str] = []
    i = 0
    while (match := start_at.search(script, i)) is not None:
        if kind == "test":
            end, replacement = _test_end(script, match.end()), "true"
        elif kind == "arith":  # $((...)) or $[...]: from the bracket after the $
            end, replacement = _closing(script, match.start() + 1), "$__uniagent_arith"
        else:  # name=(...): from the parenthesis
            end, replacement = _closing(script, match.end() - 1), match[0][:-1] + "__uniagent_array"
        if end is None:
            break
        pieces += [script[i : match.start()], replacement]
        i = end
    pieces.append(script[i:])
    return "".join(pieces)


def _unquoted(s: str, j: int) -> Iterator[int]:
    """The indices from ``s[j]`` on outside quotes and backslash escapes (none after a quote
    that does not close)."""
    while j < len(s):
        c = s[j]
        if c == "\\":
            j += 2
            continue
        if c in "'\"":
            end = s.find(c, j + 1)
            if end == -1:
                return
            j = end + 1
            continue
        yield j
        j += 1


def _closing(s: str, i: int) -> int | None:
    """The index after the bracket that closes the one at ``s[i]``, quotes skipped."""
    pairs = {"(": ")", "[": "]"}
    stack = [pairs[s[i]]]
    for j in _unquoted(s, i + 1):
        if s[j] in pairs:
            stack.append(pairs[s[j]])
        elif s[j] == stack[-1]:
            stack.pop()
            if not stack:
                return j + 1
    return None


def _test_end(s: str, j: int) -> int | None:
    """The index after the ``]]`` word that ends a ``[[`` test begun before ``s[j]``."""
    for k in _unquoted(s, j):
        if s[k] == "\n":
            return None
        if (
            s.startswith("]]", k)
            and s[k - 1] in " \t"
            and (k + 2 == len(s) or s[k + 2] in " \t\n;&|)")
        ):
            return k + 2
    return None
