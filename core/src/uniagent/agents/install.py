"""Harness installs, pinned and cached: once per machine, shared by every episode.

Each install lives in its own folder of uniagent's cache directory (``$UNIAGENT_CACHE_DIR``
or ``~/.cache/uniagent``), named by kind, package and version. Concurrent callers are safe:
the install runs under a file lock into a staging folder that is renamed into place, so a
folder that exists is complete. The sandbox sees it read-only, at the same path.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
from pathlib import Path

from uniagent.cache import build_once, cache_dir
from uniagent.errors import UniAgentError
from uniagent.specs import AgentInstall

log = logging.getLogger(__name__)

INSTALL_TIMEOUT_S = 900
#: The Python a pip harness's venv is made with: one the sandbox sees (system dirs).
SYSTEM_PYTHONS = ("/usr/bin/python3", "/usr/local/bin/python3")


class AgentInstallError(UniAgentError):
    """A harness could not be installed (registry unreachable, no npm, a bad pin)."""


def install_folder(install: AgentInstall) -> Path:
    """Where ``install`` goes in the cache (whether or not it is there yet)."""
    safe = install.package.lstrip("@").replace("/", "-").replace(":", "-")
    if install.kind == "npm":  # the folder uniagent.testing.npm_clis has always used
        return cache_dir() / "npm-cli" / f"{safe}-{install.version}"
    if install.kind == "binary":  # its pin is its digest: a changed file is a new folder
        safe = f"{Path(install.package).name}-{(install.sha256 or '')[:16]}"
    suffix = ""
    if install.extras:  # other pins: another folder
        suffix += "-" + hashlib.sha256("\n".join(install.extras).encode()).hexdigest()[:12]
    if install.python:
        suffix += f"-py{install.python}"
    return cache_dir() / "agents" / f"{install.kind}-{safe}-{install.version}{suffix}"


def bin_folder(install: AgentInstall, folder: Path) -> Path:
    """The folder of an installed harness's executables."""
    return {"pip": folder / "bin", "npm": folder / "node_modules" / ".bin"}.get(
        install.kind, folder
    )


def ensure_installed(install: AgentInstall) -> Path:
    """The installed harness's folder, installed into the cache first if it is not there."""
    folder = install_folder(install)

    def done(path: Path) -> bool:
        return (bin_folder(install, path) / install.command).exists()

    build_once(folder, lambda staging: _install(install, staging), done=done)
    if not done(folder):
        raise AgentInstallError(
            f"{install.package}@{install.version} installed into {folder} but has no "
            f"{install.command}"
        )
    return folder


def _install(install: AgentInstall, staging: Path) -> None:
    if install.kind == "pip":
        python = find_python(install.python) if install.python else _system_python()
        requirements = [f"{install.package}=={install.version}", *install.extras]
        uv = uv_installer()
        if uv is not None:
            try:
                _uv_venv(uv, python, staging, requirements, install)
            except AgentInstallError as exc:  # pip's resolver and configuration are the reference
                log.warning(
                    "uv could not install %s==%s, installing with pip: %s",
                    install.package,
                    install.version,
                    exc,
                )
                shutil.rmtree(staging)
                staging.mkdir()
                uv = None
        if uv is None:
            run_install([python, "-m", "venv", str(staging)], install)
            pip = [str(staging / "bin" / "python"), "-m", "pip", "install", "-q"]
            run_install([*pip, *requirements], install)
        # The venv is moved after it is made: its scripts name their final interpreter.
        _retarget(staging, staging.parent / install_folder(install).name)
    elif install.kind == "npm":
        npm_install(install.package, install.version, staging)
    else:
        _copy_binary(install, staging)


def uv_installer() -> str | None:
    """The ``uv`` that makes pip harnesses' venvs (from its cache, in seconds where pip takes
    minutes), or None: not on PATH, or ``UNIAGENT_PIP_INSTALLER=pip``."""
    if os.environ.get("UNIAGENT_PIP_INSTALLER", "uv") == "pip":
        return None
    return shutil.which("uv")


def _uv_venv(
    uv: str, python: str, staging: Path, requirements: list[str], install: AgentInstall
) -> None:
    """The venv (with pip in it, as ``python -m venv`` makes it) filled by uv.

    uv reads no pip configuration: pip's find-links from the environment are handed to it.
    Files are copied out of uv's cache, never linked: the install shares no inode with it.
    Bytecode is compiled at install, as pip does (PYTHONDONTWRITEBYTECODE would leave the
    read-only install without any, and each start would compile what it imports)."""
    env = {**os.environ, "UV_LINK_MODE": "copy", "UV_PYTHON_DOWNLOADS": "never"}
    env["UV_COMPILE_BYTECODE"] = "1"
    if os.environ.get("PIP_FIND_LINKS") and not os.environ.get("UV_FIND_LINKS"):
        env["UV_FIND_LINKS"] = ",".join(os.environ["PIP_FIND_LINKS"].split())
    run_install([uv, "venv", "-q", "--seed", "-p", python, str(staging)], install, env=env)
    target = str(staging / "bin" / "python")
    run_install([uv, "pip", "install", "-q", "-p", target, *requirements], install, env=env)


def _system_python() -> str:
    python = next((p for p in SYSTEM_PYTHONS if os.access(p, os.X_OK)), None)
    python = python or shutil.which("python3")
    if python is None:
        raise AgentInstallError("no python3 to make a venv for a pip harness with")
    return python


#: Prints an interpreter's version, its real executable and its installation's prefix.
_PROBE = "import sys; print(*sys.version_info[:2], sys.executable, sys.base_prefix, sep='\\n')"


def find_python(minimum: str) -> str:
    """The real executable of a Python of at least ``minimum`` (``"3.12"``): the system's
    ``python3`` if it is new enough, else ``python3.N`` on ``PATH`` (pyenv's shims too),
    lowest first. A shim is resolved to the interpreter it runs."""
    want = tuple(int(x) for x in minimum.split("."))
    names = [*SYSTEM_PYTHONS, *(f"python3.{n}" for n in range(want[1], want[1] + 8))]
    pyenv = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"
    # pyenv's shims run only the versions it has activated: its installs are looked at too
    installs = sorted(pyenv.glob("3.*/bin/python3"), key=lambda p: _version_key(p.parts[-3]))
    for name in [*names, *map(str, installs)]:
        found = name if os.path.isabs(name) else shutil.which(name)
        if found is None or not os.access(found, os.X_OK):
            continue
        try:
            probe = subprocess.run(
                [found, "-c", _PROBE], capture_output=True, text=True, timeout=60, check=False
            )
        except (OSError, subprocess.TimeoutExpired):
            continue
        lines = probe.stdout.split("\n")
        if probe.returncode == 0 and len(lines) >= 3 and (int(lines[0]), int(lines[1])) >= want:
            return lines[2]
    raise AgentInstallError(
        f"no Python {minimum} or newer here (looked for {', '.join(names[len(SYSTEM_PYTHONS) :])} "
        "on PATH); install one (e.g. `pyenv install 3.12`) for this harness"
    )


def _version_key(name: str) -> tuple[int, ...]:
    return tuple(int(x) if x.isdigit() else -1 for x in name.split("."))


def python_home(folder: Path) -> Path | None:
    """The installation a pip harness's venv runs on (from its ``pyvenv.cfg``), when it is
    not the system's (which every sandbox sees): the sandbox must see it too."""
    try:
        cfg = (folder / "pyvenv.cfg").read_text()
    except OSError:
        return None
    for line in cfg.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "home":
            home = Path(value.strip()).parent  # ``home`` is the interpreter's bin folder
            return None if str(home) in ("/usr", "/usr/local", "/") else home
    return None


def _retarget(staging: Path, final: Path) -> None:
    """Point the venv's scripts and activation files at the folder it is moved to."""
    old, new = str(staging).encode(), str(final).encode()
    for path in [*(staging / "bin").iterdir(), staging / "pyvenv.cfg"]:
        if path.is_file() and not path.is_symlink():
            data = path.read_bytes()
            if old in data:
                path.write_bytes(data.replace(old, new))


def npm_install(package: str, version: str, staging: Path) -> None:
    """``npm install --prefix STAGING package@version`` (a clear error when it fails)."""
    npm = shutil.which("npm")
    if npm is None:
        raise AgentInstallError(f"npm is not installed, so {package}@{version} cannot be")
    argv = [npm, "install", "--prefix", str(staging), "--no-audit", "--no-fund"]
    run_install([*argv, f"{package}@{version}"], None, what=f"npm install {package}@{version}")


def _copy_binary(install: AgentInstall, staging: Path) -> None:
    source = Path(install.package).expanduser()
    if not source.is_file():
        raise AgentInstallError(f"binary harness {install.package!r}: no such file")
    digest = hashlib.sha256(source.read_bytes()).hexdigest()
    if digest != install.sha256:
        raise AgentInstallError(
            f"binary harness {install.package!r}: sha256 {digest}, pinned {install.sha256}"
        )
    target = staging / install.command
    shutil.copyfile(source, target)
    target.chmod(0o755)


def run_install(
    argv: list[str],
    install: AgentInstall | None,
    *,
    what: str = "",
    env: dict[str, str] | None = None,
) -> None:
    """Run one install command; a failure or a time-out is an :class:`AgentInstallError`."""
    what = what or f"installing {install.package}=={install.version}" if install else what
    try:
        proc = subprocess.run(
            argv, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, check=False, env=env
        )
    except subprocess.TimeoutExpired as exc:
        raise AgentInstallError(f"{what} did not finish in {INSTALL_TIMEOUT_S} s") from exc
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip()[-1500:]
        raise AgentInstallError(f"{what} failed (exit {proc.returncode}):\n{tail}")


# -- what the sandbox must provide ----------------------------------------------------------


def venv_python(folder: Path) -> tuple[str, str]:
    """The interpreter a pip harness's venv runs on (the one it was made with, outside the
    venv) and its ``major.minor``, read from the venv."""
    path = folder / "bin" / "python3"
    for _ in range(8):  # the venv's links, to the first one out of it
        if not path.is_symlink():
            break
        path = path.parent / os.readlink(path)  # an absolute link replaces the parent
        if not os.path.normpath(path).startswith(str(folder)):
            break
    target = os.path.normpath(path)
    config = {}
    cfg = folder / "pyvenv.cfg"
    if cfg.is_file():
        for row in cfg.read_text().splitlines():
            key, sep, value = row.partition("=")
            if sep:
                config[key.strip()] = value.strip()
    version = config.get("version_info") or config.get("version") or ""
    return target, ".".join(version.split(".")[:2])


def node_engine(install: AgentInstall, folder: Path) -> tuple[int, int] | None:
    """The lowest node ``major.minor`` an npm harness's package.json ``engines`` allows."""
    import json
    import re

    manifest = folder / "node_modules" / install.package / "package.json"
    try:
        wanted = str(json.loads(manifest.read_text()).get("engines", {}).get("node", ""))
    except (OSError, ValueError, AttributeError):
        return None
    found = re.search(r">=?\s*v?(\d+)(?:\.(\d+))?", wanted) or re.match(r"\^?v?(\d+)", wanted)
    if found is None:
        return None
    return int(found.group(1)), int(found.groups()[1] or 0) if len(found.groups()) > 1 else 0


def elf_interpreter(path: Path) -> str | None:
    """The dynamic loader an ELF executable names (``PT_INTERP``); ``""`` for a static
    one; ``None`` when ``path`` is not a 64-bit ELF file (a script)."""
    import struct

    try:
        with open(path, "rb") as f:
            head = f.read(64)
            if head[:5] != b"\x7fELF\x02":
                return None
            order = "<" if head[5] == 1 else ">"
            (phoff,) = struct.unpack_from(order + "Q", head, 0x20)
            phentsize, phnum = struct.unpack_from(order + "HH", head, 0x36)
            for i in range(phnum):
                f.seek(phoff + i * phentsize)
                entry = f.read(phentsize)
                (kind,) = struct.unpack_from(order + "I", entry, 0)
                if kind == 3:  # PT_INTERP
                    offset, size = (
                        struct.unpack_from(order + "Q", entry, 8)[0],
                        struct.unpack_from(order + "Q", entry, 32)[0],
                    )
                    f.seek(offset)
                    return f.read(size).rstrip(b"\0").decode()
    except (OSError, struct.error, UnicodeDecodeError):
        return None
    return ""


def runs_with(install: AgentInstall, folder: Path) -> str:
    """What the harness's command runs with: ``"python"`` (a pip venv), ``"node"`` (a
    node script, as most npm CLIs are), ``"elf"`` (a native executable: some npm CLIs ship
    one, e.g. Claude Code's), or ``"other"``."""
    if install.kind == "pip":
        return "python"
    command = (bin_folder(install, folder) / install.command).resolve()
    if elf_interpreter(command) is not None:
        return "elf"
    try:
        with open(command, "rb") as f:
            first = f.readline(200)
    except OSError:
        return "other"
    return "node" if first.startswith(b"#!") and b"node" in first else "other"


def sandbox_probe(install: AgentInstall, folder: Path) -> str:
    """A shell command, run as the agent in the sandbox, printing what the harness needs
    there (read with :func:`sandbox_problems`)."""
    import shlex

    q = shlex.quote
    command = bin_folder(install, folder) / install.command
    lines = [f"test -x {q(str(command))} && echo uniagent-command=ok"]
    if install.kind == "pip":
        python, _ = venv_python(folder)
        version = "import sys; print('uniagent-python=%d.%d' % sys.version_info[:2])"
        lines.append(f"{q(python)} -c {q(version)} 2>/dev/null")
    kind = runs_with(install, folder)
    if kind == "node":
        lines.append('v=$(node -v 2>/dev/null) && echo "uniagent-node=$v"')
    loader = elf_interpreter((bin_folder(install, folder) / install.command).resolve())
    if kind == "elf" and loader:
        lines.append(f"test -e {q(loader)} && echo uniagent-loader=ok")
    return "; ".join(lines) + "; true"


def sandbox_problems(install: AgentInstall, folder: Path, output: str) -> list[str]:
    """What the sandbox lacks, from :func:`sandbox_probe`'s ``output`` (empty: nothing)."""
    facts = dict(
        line.strip().removeprefix("uniagent-").split("=", 1)
        for line in output.splitlines()
        if line.strip().startswith("uniagent-") and "=" in line
    )
    problems = []
    if facts.get("command") != "ok":
        problems.append(
            f"{bin_folder(install, folder) / install.command} is not there or not executable "
            f"for the agent's user (the install folder {folder} is mounted read-only at the "
            "same path: can that user reach it?)"
        )
    if install.kind == "pip":
        python, version = venv_python(folder)
        found = facts.get("python")
        if found is None:
            problems.append(
                f"the image has no {python} (the venv of {install.package} was made with "
                f"this machine's {python}, Python {version}: the image needs the same)"
            )
        elif version and found != version:
            problems.append(
                f"the image's {python} is Python {found}; the venv of {install.package} "
                f"was made with Python {version} on this machine (the image needs the same)"
            )
    kind = runs_with(install, folder)
    loader = elf_interpreter((bin_folder(install, folder) / install.command).resolve())
    if kind == "elf" and loader and facts.get("loader") != "ok":
        problems.append(
            f"the image has no {loader} (the dynamic loader {install.command} is linked "
            "with: a glibc image)"
        )
    if kind == "node":
        found = facts.get("node")
        need = node_engine(install, folder)
        least = f" >= {need[0]}.{need[1]}" if need else ""
        if found is None:
            problems.append(f"the image has no node ({install.package} needs node{least} on PATH)")
        elif need is not None:
            parts = [int(p) for p in found.lstrip("v").split(".")[:2] if p.isdigit()]
            if tuple(parts) < need:
                problems.append(
                    f"the image's node is {found}; {install.package} needs node{least} "
                    "(its package.json engines)"
                )
    return problems
