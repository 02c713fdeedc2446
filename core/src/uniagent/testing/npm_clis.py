"""Agent harness CLIs from npm (Claude Code, Codex) for tests, installed once and cached.

They are installed as harness agents are (:func:`uniagent.agents.install.ensure_installed`):
``npm install --prefix`` into a folder of the cache directory (the same one the test
tokenizers use), under a file lock into a staging folder renamed into place; later calls
reuse it.
"""

from __future__ import annotations

from pathlib import Path

from uniagent.agents.install import AgentInstallError, bin_folder, ensure_installed
from uniagent.specs import AgentInstall
from uniagent.testing.tokenizers import TokenizerFetchError

CLAUDE_CODE = ("@anthropic-ai/claude-code", "2.1.332")
CODEX = ("@openai/codex", "0.171.0")


class CliFetchError(TokenizerFetchError):
    """A harness CLI could not be installed from npm (npm missing, registry unreachable)."""


def npm_cli(package: str, version: str, command: str) -> Path:
    """The path of ``command`` from ``package@version``, installed into the cache once."""
    install = AgentInstall("npm", package, version, command)
    try:
        folder = ensure_installed(install)
    except AgentInstallError as exc:
        raise CliFetchError(str(exc)) from exc
    return bin_folder(install, folder) / command
