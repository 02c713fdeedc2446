"""Harness installs, pinned and cached: once per machine, shared by every episode.

Each install lives in its own folder of uniagent's cache directory (``$UNIAGENT_CACHE_DIR``
or ``~/.cache/uniagent``), named by kind, package and version. Concurrent callers are safe:
the install runs under a file lock into a staging folder that is renamed into place, so a
folder that exists is complete. The sandbox sees it read-only, at the same path.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

from uniagent.cache import build_once, cache_dir
from uniagent.errors import UniAgentError
from uniagent.specs import AgentInstall

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
        run_install([python, "-m", "venv", str(staging)], install)
        pip = [str(staging / "bin" / "python"), "-m", "pip", "install", "-q"]
        run_install([*pip, f"{install.package}=={install.version}", *install.extras], install)
        # The venv is moved after it is made: its scripts name their final interpreter.
        _retarget(staging, staging.parent / install_folder(install).name)
    elif install.kind == "npm":
        npm_install(install.package, install.version, staging)
    else:
        _copy_binary(install, staging)


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


def run_install(argv: list[str], install: AgentInstall | None, *, what: str = "") -> None:
    """Run one install command; a failure or a time-out is an :class:`AgentInstallError`."""
    what = what or f"installing {install.package}=={install.version}" if install else what
    try:
        proc = subprocess.run(
            argv, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise AgentInstallError(f"{what} did not finish in {INSTALL_TIMEOUT_S} s") from exc
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip()[-1500:]
        raise AgentInstallError(f"{what} failed (exit {proc.returncode}):\n{tail}")
