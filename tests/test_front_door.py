"""Plugins and templates use the public contract only: ``uniagent``, ``uniagent.sandbox``
and ``uniagent.testing``."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import uniagent
import uniagent.sandbox
import uniagent.testing

ROOT = Path(__file__).resolve().parents[1]
PUBLIC = {"uniagent", "uniagent.sandbox", "uniagent.testing"}
#: Jinja placeholders in template files, replaced so that ast can parse them.
_JINJA = re.compile(r"\{\{[^}]*\}\}|\{%[^%]*%\}")


def sources() -> list[Path]:
    found = []
    for top in ("plugins", "templates"):
        for path in (ROOT / top).rglob("*.py"):
            if not any(part.startswith((".nox", ".venv", "build")) for part in path.parts):
                found.append(path)
    return found


def imported_modules(path: Path) -> list[tuple[int, str]]:
    text = _JINJA.sub("x", path.read_text())
    tree = ast.parse(text, filename=str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            out.extend((node.lineno, alias.name) for alias in node.names)
    return out


def test_nothing_under_plugins_or_templates_imports_below_the_front_door():
    deep = [
        f"{path.relative_to(ROOT)}:{line}: {module}"
        for path in sources()
        for line, module in imported_modules(path)
        if (module == "uniagent" or module.startswith("uniagent.")) and module not in PUBLIC
    ]
    assert sources(), "found no plugin or template sources"
    assert deep == [], (
        "import these from `uniagent` (or `uniagent.sandbox`, `uniagent.testing`):\n"
        + "\n".join(deep)
    )


def test_every_public_name_is_there():
    for module in (uniagent, uniagent.sandbox, uniagent.testing):
        missing = [name for name in module.__all__ if not hasattr(module, name)]
        assert missing == [], f"{module.__name__}.__all__ names what it lacks: {missing}"
