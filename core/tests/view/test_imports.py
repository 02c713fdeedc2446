"""`uniagent view` reads run folders through the layout module, without loading the runner,
the sandboxes, grading or the models."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import uniagent

SOURCE = Path(uniagent.__file__).resolve().parent
#: What a reader of run folders has no business loading.
HEAVY = (
    "uniagent.run.runner",
    "uniagent.run.jobs",
    "uniagent.env",
    "uniagent.grading",
    "uniagent.episode",
    "uniagent.models",
    "uniagent.resolver",
    "uniagent.registry",
    "uniagent.plugins",
    "uniagent.config",
)


def loaded_by(*modules: str) -> list[str]:
    """The uniagent modules that importing ``modules`` loads, the package's front door
    (``uniagent/__init__.py``, which imports everything for plugin authors) left out."""
    code = f"""
import importlib, json, sys, types
package = types.ModuleType("uniagent")
package.__path__ = [{str(SOURCE)!r}]
sys.modules["uniagent"] = package
for name in {list(modules)!r}:
    importlib.import_module(name)
print(json.dumps(sorted(m for m in sys.modules if m.startswith("uniagent"))))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_the_viewer_loads_neither_the_runner_nor_sandboxes_nor_grading():
    loaded = loaded_by("uniagent.view.app", "uniagent.view.server", "uniagent.view.catalog")
    assert "uniagent.run.layout" in loaded and "uniagent.view.access" in loaded
    heavy = [m for m in loaded if any(m == h or m.startswith(h + ".") for h in HEAVY)]
    assert heavy == []
