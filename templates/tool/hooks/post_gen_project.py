"""Keep the files of the chosen kind: a script for the sandbox, or an MCP server."""

import shutil
from pathlib import Path

KIND = "{{ cookiecutter.kind }}"
PACKAGE = Path("src") / "{{ cookiecutter.__module_name }}"

if KIND == "mcp":
    shutil.rmtree(PACKAGE / "bin")
else:
    (PACKAGE / "server.py").unlink()
