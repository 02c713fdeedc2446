"""Agent harness CLIs from npm (Claude Code, Codex) for tests, installed once and cached.

``npm install --prefix`` puts the pinned packages into a folder of the cache directory
(the same one the test tokenizers use); later calls reuse it. Safe for concurrent callers:
the install runs under a file lock into a staging folder that is renamed into place.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from uniagent.testing.tokenizers import TokenizerFetchError, _file_lock, cache_dir

CLAUDE_CODE = ("@anthropic-ai/claude-code", "2.1.332")
CODEX = ("@openai/codex", "0.171.0")

_NPM_TIMEOUT_S = 600


class CliFetchError(TokenizerFetchError):
    """A harness CLI could not be installed from npm (npm missing, registry unreachable)."""


def npm_cli(package: str, version: str, command: str) -> Path:
    """The path of ``command`` from ``package@version``, installed into the cache once."""
    safe = f"{package.lstrip('@').replace('/', '-')}-{version}"
    target = cache_dir() / "npm-cli" / safe
    binary = target / "node_modules" / ".bin" / command
    if binary.exists():
        return binary
    target.parent.mkdir(parents=True, exist_ok=True)
    with _file_lock(target.parent / f".{safe}.lock"):
        if not binary.exists():
            _install(package, version, target)
    if not binary.exists():
        raise CliFetchError(f"{package}@{version} installed into {target} but has no {command}")
    return binary


def _install(package: str, version: str, target: Path) -> None:
    npm = shutil.which("npm")
    if npm is None:
        raise CliFetchError(f"npm is not installed, so {package}@{version} cannot be installed")
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=target.parent))
    try:
        try:
            proc = subprocess.run(
                [
                    npm,
                    "install",
                    "--prefix",
                    str(staging),
                    "--no-audit",
                    "--no-fund",
                    f"{package}@{version}",
                ],
                capture_output=True,
                text=True,
                timeout=_NPM_TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise CliFetchError(
                f"`npm install {package}@{version}` did not finish in {_NPM_TIMEOUT_S} s"
            ) from exc
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip()[-1500:]
            raise CliFetchError(
                f"`npm install {package}@{version}` failed (exit {proc.returncode}):\n{tail}"
            )
        if target.exists():
            shutil.rmtree(target)
        os.replace(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
