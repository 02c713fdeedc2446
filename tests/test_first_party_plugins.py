"""The core's table of our plugins' names (``uniagent.registry.FIRST_PARTY_PLUGINS``, what
an unknown name in a config is told to install) is what the plugins in ``plugins/*``
register, and what docs/plugins.md lists: it cannot drift from either."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import tomllib

from uniagent.registry import FIRST_PARTY_PLUGINS

ROOT = Path(__file__).resolve().parents[1]


def plugin_sources() -> dict[str, Path]:
    """Each plugin of ``plugins/*``: its distribution name -> its ``src`` folder, with its
    ``uniagent`` entry point (named after it) pointing at a module in that folder."""
    found = {}
    for pyproject in sorted(ROOT.glob("plugins/*/pyproject.toml")):
        project = tomllib.loads(pyproject.read_text())["project"]
        name = project["name"]
        entry_points = project["entry-points"]["uniagent"]
        assert list(entry_points) == [name], pyproject
        src = pyproject.parent / "src"
        module = src.joinpath(*entry_points[name].split("."))
        assert module.with_suffix(".py").is_file() or module.is_dir(), entry_points[name]
        found[name] = src
    return found


def test_the_table_is_what_the_plugins_in_the_tree_register():
    sources = plugin_sources()
    # `uniagent plugins --json` over these plugins, imported from the tree (ahead of any
    # installed copy) through their real entry points and hooks.
    path = os.pathsep.join([*map(str, sources.values()), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path, "UNIAGENT_LOAD_PLUGINS": ",".join(sources)}
    env.pop("UNIAGENT_DISABLE_PLUGINS", None)
    done = subprocess.run(
        [sys.executable, "-m", "uniagent.cli", "plugins", "--json"],
        capture_output=True, text=True, env=env, timeout=300, check=True,
    )  # fmt: skip
    plugins = {p["name"]: p for p in json.loads(done.stdout)["plugins"] if not p["builtin"]}
    assert set(plugins) == set(sources), "every plugin of the tree is installed here"
    assert all(p["status"] == "loaded" for p in plugins.values()), plugins
    where = subprocess.run(
        [sys.executable, "-c", "import importlib, sys; print(*(importlib.import_module(m).__file__"
         " for m in sys.argv[1:]), sep='\\n')", *(p["module"] for p in plugins.values())],
        capture_output=True, text=True, env=env, timeout=300, check=True,
    ).stdout.split()  # fmt: skip
    for (name, _), file in zip(plugins.items(), where, strict=True):
        assert Path(file).is_relative_to(sources[name]), (name, file)
    registered = {
        name: {kind: tuple(sorted(names)) for kind, names in p["contributes"].items() if names}
        for name, p in plugins.items()
    }
    table = {
        name: {kind: tuple(sorted(names)) for kind, names in kinds.items()}
        for name, kinds in FIRST_PARTY_PLUGINS.items()
    }
    assert table == registered


def test_the_docs_list_what_the_table_holds():
    text = (ROOT / "docs" / "plugins.md").read_text()
    section = text.split("## First-party plugins", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(uniagent-[a-z-]+)` \| (.+) \|$", section, flags=re.M)
    listed = {dist: sorted(re.findall(r"`([^`]+)`", provides)) for dist, provides in rows}
    table = {
        dist: sorted(name for names in kinds.values() for name in names)
        for dist, kinds in FIRST_PARTY_PLUGINS.items()
    }
    assert listed == table
