"""A Harbor task's environment on the ``host`` backend: reproduced where that is faithful,
refused by name where it is not.

The host backend builds no image: a task runs in a bubblewrap sandbox over this machine's
root. That stands in for a Dockerfile that only names a base image and sets where and
with which variables the task works (``FROM``, ``WORKDIR``, ``ENV``, and what has no effect
on a Harbor container's processes: Harbor starts it with ``sleep infinity``, so ``CMD`` is
never run). ``WORKDIR`` (or ``[environment] workdir``, which wins, as in Harbor) becomes the
sandbox's work dir at that path (``sandbox_workdir``); ``ENV`` the sandbox's variables.

A Dockerfile that does more (``RUN``, ``COPY``, ``ADD``, ``USER``, ``ENTRYPOINT``,
``VOLUME``, ``ONBUILD``, a variable in a ``WORKDIR`` or ``ENV``) or a prebuilt
``docker_image`` describes an environment the host does not have: such a task is refused
when it loads (a bad row, with what to use instead), never run and graded without it.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from pathlib import Path, PurePosixPath
from typing import Any

from uniagent.errors import ConfigError
from uniagent.harbor.schema import TaskToml

#: Instructions reproduced on the host (see the module docstring).
FAITHFUL = frozenset({"FROM", "WORKDIR", "ENV"})
#: Instructions without effect on a running Harbor task's processes.
WITHOUT_EFFECT = frozenset(
    {"ARG", "LABEL", "MAINTAINER", "CMD", "EXPOSE", "STOPSIGNAL", "HEALTHCHECK", "SHELL"}
)
LOCAL = "run it with env.deployment.type: local (podman or docker), which builds it"
#: Variables the host sandbox sets itself: a task's own would hide its tools.
SANDBOX_OWN = frozenset({"PATH", "HOME"})
#: Where a task's work dir cannot be on the host: the sandbox's own mounts.
SYSTEM_DIRS = frozenset({"tmp", "proc", "dev", "sys", "run"})


def instructions(dockerfile: Path) -> list[tuple[int, str, str]]:
    """``(line, INSTRUCTION, arguments)`` of a Dockerfile: continuation lines joined,
    comments and blank lines left out."""
    found: list[tuple[int, str, str]] = []
    pending, start = "", 0
    for number, raw in enumerate(dockerfile.read_text(encoding="utf-8").splitlines(), 1):
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue  # a comment inside a continued instruction
        if not pending:
            start = number
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        text = (pending + line).strip()
        pending = ""
        word, _, rest = text.partition(" ")
        found.append((start, word.upper(), rest.strip()))
    if pending:
        word, _, rest = pending.strip().partition(" ")
        found.append((start, word.upper(), rest.strip()))
    return found


def host_environment(config: TaskToml, task_dir: Path) -> dict[str, Any]:
    """The ``env`` overrides that reproduce the task's environment in a host sandbox
    (``workdir``: the path its work dir is seen at; ``env``: its variables); a
    :class:`ConfigError` naming what cannot be reproduced."""
    image = config.environment.docker_image
    if image:
        raise ConfigError(
            f"environment.docker_image = {image!r}: the host backend runs no image, and "
            f"this task's environment is that image; {LOCAL}"
        )
    dockerfile = task_dir / "environment" / "Dockerfile"
    workdir: PurePosixPath | None = None
    variables: dict[str, str] = {}
    if dockerfile.is_file():
        for line, word, args in instructions(dockerfile):
            where = f"environment/Dockerfile line {line}: {word}"
            if word in WITHOUT_EFFECT or word == "FROM":
                continue
            if word not in FAITHFUL:
                raise ConfigError(
                    f"{where}: the host backend builds no image, so this environment would "
                    f"not exist and the task would be graded without it; {LOCAL}"
                )
            if "$" in args:
                raise ConfigError(f"{where} uses a variable the host cannot expand; {LOCAL}")
            if word == "WORKDIR":
                path = PurePosixPath(args.strip("\"'"))
                workdir = path if path.is_absolute() else (workdir or PurePosixPath("/")) / path
            else:
                pairs = _env_pairs(args, where)
                clash = sorted(pairs.keys() & SANDBOX_OWN)
                if clash:
                    raise ConfigError(
                        f"{where} sets {', '.join(clash)}, which the host sandbox sets itself "
                        f"(its tools and home); {LOCAL}"
                    )
                variables.update(pairs)
    if config.environment.workdir:
        workdir = PurePosixPath(config.environment.workdir)
    out: dict[str, Any] = {}
    if workdir is not None and str(workdir) != "/":
        normal = PurePosixPath(posixpath.normpath(str(workdir)))
        if normal.parts[1:2] and normal.parts[1] in SYSTEM_DIRS:
            raise ConfigError(
                f"the task's work dir {workdir} is in /{normal.parts[1]}, which the host "
                f"sandbox keeps for itself; {LOCAL}"
            )
        out["workdir"] = str(normal)
    if variables:
        out["env"] = variables
    return out


def _env_pairs(args: str, where: str) -> dict[str, str]:
    """``ENV K=V K2="V 2"`` or the old ``ENV K V`` form."""
    try:
        words = shlex.split(args)
    except ValueError as exc:
        raise ConfigError(f"{where}: cannot read it: {exc}") from None
    if not words:
        raise ConfigError(f"{where}: names no variable")
    if "=" not in words[0]:  # ENV KEY value with spaces
        return {words[0]: args.partition(" ")[2].strip()}
    pairs: dict[str, str] = {}
    for word in words:
        key, sep, value = word.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise ConfigError(f"{where}: {word!r} is not NAME=value")
        pairs[key] = value
    return pairs


def check_host_verifier(config: TaskToml, task_dir: Path) -> None:
    """A separate verifier on the host runs in a new sandbox of the task's environment
    (:func:`host_environment`), the tests copied in: refused when the verifier declares an
    environment of its own (a ``docker_image``, or a ``tests/Dockerfile`` with anything but
    ``FROM``, the task's ``WORKDIR`` and instructions without effect)."""
    own = config.verifier.environment
    if own is not None and own.docker_image:
        raise ConfigError(
            f"verifier.environment.docker_image = {own.docker_image!r}: the host backend "
            f"runs no image, and the verifier's environment is that image; {LOCAL}"
        )
    dockerfile = task_dir / "tests" / "Dockerfile"
    if not dockerfile.is_file():
        return
    workdir = host_environment(config, task_dir).get("workdir")
    for line, word, args in instructions(dockerfile):
        if word in WITHOUT_EFFECT or word == "FROM":
            continue
        if word == "WORKDIR" and args.strip("\"'") == workdir:
            continue  # where the task's sandbox works already
        raise ConfigError(
            f"tests/Dockerfile line {line}: {word}: the host backend builds no image, so the "
            f"verifier's environment would not exist and the task would be graded without "
            f"it; {LOCAL}"
        )
