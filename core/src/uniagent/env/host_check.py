"""Checks of a ``host`` deployment's config, made when the agent config resolves.

``uniagent.resolver.resolve`` calls :func:`check_host_config` (the deployment's
``check``) before any sandbox starts, so that what would fail every episode at
start (an ``env_error`` each) is one :class:`~uniagent.errors.ConfigError` naming
the key instead. Under bubblewrap:

- **bind sources in** ``bwrap_args`` (``--bind``, ``--ro-bind``, ``--dev-bind``,
  ``--overlay-src``) are opened by bwrap itself, as the sandbox's user when
  uniagent runs as root (uid 65534 by default): each must be reachable by that
  uid (every directory above it searchable, the path readable). ``ro_binds`` and
  ``binds`` are brought in by root (see :func:`uniagent.env.bwrap.stage_mounts`),
  so the directories above them do not matter. Paths that do not exist yet (a
  service may create them) are left to the start.
- **writes outside the writable places**: the sandbox's root is read-only; only
  the work dir, the tools dir, ``/tmp``, the home and ``binds`` are writable. A
  ``post_setup`` command (or ``env.workdir``/``env.tools_dir``, which are created
  at start) is checked when its outcome is certain from its text alone: a chain
  of simple commands joined by ``&&`` whose ``mkdir``, ``touch``, ``tee``, ``cp``,
  ``mv``, ``ln`` targets or ``>``/``>>`` redirections are literal absolute paths.
  Anything else (variables, globs, ``;``, ``||``, pipes, subshells, compound
  commands, extra ``bwrap_args``) is left to the start, where a failing set-up
  command is a one-line error naming the writable places.
"""

from __future__ import annotations

import os
import posixpath
import shlex
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import PurePosixPath
from typing import Any

from uniagent.env.bwrap import (
    SYSTEM_DIRS,
    Mount,
    _mount_of,
    bwrap_problem,
    drop_privileges,
    system_mounts,
    writable_places,
)
from uniagent.env.host import (
    BWRAP_HOME,
    BWRAP_TOOLS_DIR,
    BWRAP_WORKDIR,
    HostDeploymentConfig,
    sandbox_uid,
)

#: bwrap options whose first argument is a host path bwrap opens (the ``-try`` forms skip a
#: source they cannot find, so they are not checked).
SOURCE_OPTIONS = {"--bind", "--ro-bind", "--dev-bind", "--overlay-src"}
#: How many arguments each bwrap option takes (those not listed take none).
ARITY = {
    **dict.fromkeys(
        ("--bind", "--bind-try", "--dev-bind", "--dev-bind-try", "--ro-bind", "--ro-bind-try",
         "--setenv", "--file", "--bind-data", "--ro-bind-data", "--symlink", "--chmod"), 2,
    ),
    "--overlay": 3,
    **dict.fromkeys(
        ("--args", "--argv0", "--userns", "--userns2", "--pidns", "--uid", "--gid", "--hostname",
         "--chdir", "--unsetenv", "--lock-file", "--sync-fd", "--remount-ro", "--exec-label",
         "--file-label", "--proc", "--dev", "--tmpfs", "--mqueue", "--dir", "--seccomp",
         "--add-seccomp-fd", "--block-fd", "--userns-block-fd", "--info-fd", "--json-status-fd",
         "--cap-add", "--cap-drop", "--perms", "--size", "--overlay-src", "--tmp-overlay",
         "--ro-overlay"), 1,
    ),
}  # fmt: skip
#: Programs whose targets a set-up command writes: how to find them.
_WRITERS = {"mkdir", "touch", "tee", "cp", "mv", "ln"}
#: Their options that take a value as the next word (``mkdir -m 755``, ``touch -r FILE``).
_VALUE_OPTIONS = {
    "mkdir": {"-m"},
    "touch": {"-d", "-r", "-t"},
    "cp": {"-S"},
    "mv": {"-S"},
    "ln": {"-S"},
}
#: Not statically certain: the sandbox's own /dev, /proc and /sys.
_UNKNOWN = ("/dev", "/proc", "/sys")


def check_host_config(config: HostDeploymentConfig, env: Any) -> list[str]:
    """Problems every sandbox of ``config`` would fail with at start, found from the config.

    Each is ``KEY.PATH: message``, the key path under the agent config's ``env``.
    ``env`` is the :class:`~uniagent.env.config.EnvConfig` (post-set-up commands).
    """
    if config.isolation == "none":
        return []
    sources = list(_bwrap_sources(config.bwrap_args))
    writes = list(_env_writes(env)) if not config.bwrap_args else []
    if not sources and not writes:
        return []
    uid = sandbox_uid(config)
    if config.isolation == "auto" and bwrap_problem(config.bwrap, uid) is not None:
        return []  # no bubblewrap here: the sandbox is the host (with a warning at start)
    problems = _unreachable_sources(sources, uid)
    mounts = _static_mounts(config)
    places = writable_places(mounts, config.sandbox_workdir or BWRAP_WORKDIR)
    for key, command, target, directory in writes:
        state = _state(target, mounts)
        if state == "missing" or (state == "read-only" and not directory):
            problems.append(
                f"{key}: {command!r} writes {target}, where the bwrap sandbox is read-only, so "
                f"the sandbox would fail at start; only {', '.join(places)} are writable: "
                "write there, or bind a host directory there with `binds`"
            )
    return problems


def shared_workdir(config: HostDeploymentConfig, env: Any) -> str | None:
    """The one host directory every sandbox of ``config`` works in: ``env.workdir`` when it
    is an absolute path and the sandbox is the host (``isolation: none``, or ``auto`` where
    bubblewrap does not work). ``None`` when each sandbox works in a directory of its own."""
    workdir = getattr(env, "workdir", None)
    if not workdir or not posixpath.isabs(workdir) or config.isolation == "bwrap":
        return None
    if config.isolation == "auto" and bwrap_problem(config.bwrap, sandbox_uid(config)) is None:
        return None  # bwrap: the path is inside each sandbox's own mount table
    return str(workdir)


# -- bind sources -------------------------------------------------------------------------
def _bwrap_sources(args: Sequence[str]) -> Iterator[tuple[int, str]]:
    """(index, host path) of each source bwrap opens in ``args``."""
    i = 0
    while i < len(args):
        option = args[i]
        if option in SOURCE_OPTIONS and i + 1 < len(args):
            yield i + 1, args[i + 1]
        i += 1 + ARITY.get(option, 0)


def _unreachable_sources(sources: list[tuple[int, str]], uid: int | None) -> list[str]:
    existing = [(i, os.path.abspath(p)) for i, p in sources if os.path.lexists(p)]
    if not existing:
        return []
    if uid is None:  # bwrap runs as this process's user
        blocked = {p for _, p in existing if not _readable(p)}
        who = "this user"
    else:
        blocked = set(_blocked_for(uid, [p for _, p in existing]))
        who = f"the sandbox's user (uid {uid}, sandbox_uid)"
    return [
        f"deployment.bwrap_args.{i}: {path} cannot be read by {who}, as whom bwrap binds it, so "
        'the sandbox would fail at start ("Can\'t find source path"); make it and each '
        "directory above it reachable (chmod o+x on the directories, o+r on it), bind it with "
        "ro_binds/binds instead (brought in by root), or set sandbox_uid: 0"
        for i, path in existing
        if path in blocked
    ]


def _readable(path: str) -> bool:
    mode = os.R_OK | (os.X_OK if os.path.isdir(path) else 0)
    return os.access(path, mode)


def _blocked_for(uid: int, paths: list[str]) -> list[str]:
    """Which of ``paths`` host ``uid`` cannot reach, asked of the kernel as that uid."""
    script = (
        'for p; do if [ -r "$p" ] && { [ ! -d "$p" ] || [ -x "$p" ]; }; then :; '
        'else printf "%s\\0" "$p"; fi; done'
    )
    argv = [*drop_privileges(uid), "/bin/sh", "-c", script, "check", *paths]
    try:
        done = subprocess.run(argv, capture_output=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return []  # cannot tell: the start will
    if done.returncode != 0:
        return []
    return [os.fsdecode(p) for p in done.stdout.split(b"\0") if p]


# -- writes of the set-up -----------------------------------------------------------------
def _env_writes(env: Any) -> Iterator[tuple[str, str, str, bool]]:
    """(key path, what writes, absolute target, whether it only makes a missing directory)
    of each write certain from the env settings' text."""
    for name in ("workdir", "tools_dir"):
        path = getattr(env, name, None)
        if path and posixpath.isabs(path):  # made at start when missing (`mkdir -p`)
            yield name, f"mkdir -p {path}", posixpath.normpath(path), True
    for i, command in enumerate(getattr(env, "post_setup", None) or []):
        for _, target, directory in _command_writes(command):
            yield f"post_setup.{i}", command, target, directory


def _command_writes(command: str) -> list[tuple[str, str, bool]]:
    """(the simple command, absolute target, whether it is ``mkdir``'s) of each write the
    command certainly makes, when its text tells: a ``&&`` chain of simple commands."""
    if "\n" in command or any(c in command for c in "`$*?[{}()~"):
        return []
    lexer = shlex.shlex(command, posix=True, punctuation_chars=";&|<>")
    lexer.whitespace_split = True
    try:
        tokens = list(lexer)
    except ValueError:
        return []
    segments: list[list[str]] = [[]]
    for token in tokens:
        if token == "&&":
            segments.append([])
        elif token[:1] in (";", "&", "|") or token in ("<<", "<<<", "<>", ">|", "&>"):
            return []  # another command's status may decide: not certain
        else:
            segments[-1].append(token)
    writes: list[tuple[str, str, bool]] = []
    for words in segments:
        rest: list[str] = []
        targets: list[tuple[str, bool]] = []
        i = 0
        while i < len(words):
            word = words[i]
            if word in (">", ">>", "<", ">&", "<&") and i + 1 < len(words):
                if word in (">", ">>"):
                    targets.append((words[i + 1], False))
                i += 2
                continue
            rest.append(word)
            i += 1
        while rest and "=" in rest[0] and not rest[0].startswith("-"):
            rest.pop(0)  # `VAR=value cmd`
        if rest and rest[0] in _WRITERS:
            targets += [(t, rest[0] == "mkdir") for t in _targets(rest)]
        text = " ".join(words)
        writes += [(text, posixpath.normpath(t), d) for t, d in targets if t.startswith("/")]
    return writes


def _targets(words: list[str]) -> list[str]:
    """The paths a ``mkdir``, ``touch``, ``tee``, ``cp``, ``mv`` or ``ln`` writes."""
    program, args = words[0], words[1:]
    takes_value = _VALUE_OPTIONS.get(program, set())
    operands, i = [], 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            operands += args[i + 1 :]
            break
        if arg.startswith("-") and arg != "-":
            if arg in ("-t", "-T", "-i", "--interactive") or arg.startswith("--target"):
                return []  # the destination is elsewhere, or it may ask first
            i += 2 if arg in takes_value else 1
            continue
        operands.append(arg)
        i += 1
    if program in ("mkdir", "touch", "tee"):
        return operands
    return operands[-1:] if len(operands) >= 2 else []  # cp, mv, ln: the destination


def _static_mounts(config: HostDeploymentConfig) -> list[Mount]:
    """The sandbox's mounts as far as the config tells (the episode's own: host unknown)."""
    mounts = list(system_mounts())
    for specs, writable in ((config.ro_binds, False), (config.binds, True)):
        for spec in specs:
            host, _, inside = spec.partition(":")
            host = os.path.abspath(host)
            mounts.append(Mount(posixpath.normpath(inside or host), host, writable))
    workdir = config.sandbox_workdir or BWRAP_WORKDIR
    for inside in ("/tmp", BWRAP_HOME, workdir, BWRAP_TOOLS_DIR):
        mounts.append(Mount(inside, "", True))
    return mounts


def _state(path: str, mounts: list[Mount]) -> str:
    """``writable``, ``read-only`` (it exists), ``missing`` (read-only, absent) or ``unknown``."""
    for link in SYSTEM_DIRS:  # /bin -> usr/bin inside as outside
        if os.path.islink(link) and (path == link or path.startswith(link + "/")):
            path = os.path.realpath(link) + path[len(link) :]
    if path == "/" or any(path == p or path.startswith(p + "/") for p in _UNKNOWN):
        return "unknown" if path != "/" else "read-only"
    mount = _mount_of(mounts, PurePosixPath(path))
    if mount is not None:
        if mount.writable:
            return "writable"
        if not mount.host:
            return "unknown"
        relative = PurePosixPath(path).relative_to(mount.inside)
        return "read-only" if os.path.lexists(os.path.join(mount.host, relative)) else "missing"
    # Outside every mount: only the directories bwrap made for the mount points exist.
    inner = PurePosixPath(path)
    if any(inner in PurePosixPath(m.inside).parents for m in mounts):
        return "read-only"
    return "missing"
