"""Tier 3: build and pip-install the real distributions into a fresh venv.

Non-editable installs, exactly as a user gets them; ``uniagent plugins --json``
is the observable.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PLUGINS = {
    "uniagent-tools-swe": {"tools": {"execute_bash", "str_replace_editor", "submit", "finish"}},
    "uniagent-deploy-modal": {"deployments": {"modal"}},
    "uniagent-reward-swebench": {"rewards": {"swe_bench", "swe_rebench", "r2e_gym"}},
    "uniagent-tools-search": {
        "tools": {"search", "search_arxiv", "fetch_document"},
        "rewards": {"search_qa"},
        "services": {"search"},
    },
}


class Venv:
    """A fresh virtual environment with helpers to pip-install and run ``uniagent``."""

    def __init__(self, path: Path) -> None:
        venv.EnvBuilder(with_pip=True).create(path)
        self.python = path / "bin" / "python"
        self.uniagent = path / "bin" / "uniagent"

    def pip(self, *args: str) -> None:
        # Installs without compiling every module to bytecode (pip's default): what the
        # tests import is compiled as it is imported; compiling the whole of a plugin's
        # dependencies (swebench's: datasets, pandas, ...) was about 10 s of CPU an install.
        compile_ = ["--no-compile"] if args[:1] == ("install",) else []
        subprocess.run(
            [str(self.python), "-m", "pip", "-q", *args, *compile_],
            check=True,
            stdout=subprocess.DEVNULL,
        )

    def plugins(self, *args: str, env: dict[str, str] | None = None) -> dict:
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("UNIAGENT_")}
        full_env.update(env or {})
        out = subprocess.run(
            [str(self.uniagent), "plugins", "--json", *args],
            check=True,
            capture_output=True,
            text=True,
            env=full_env,
        )
        return json.loads(out.stdout)


def by_name(report: dict) -> dict[str, dict]:
    return {p["name"]: p for p in report["plugins"]}


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> dict[str, Path]:
    """Wheels of the core and every plugin, built once."""
    out = tmp_path_factory.mktemp("wheels")
    sources = {"uniagent": ROOT / "core", **{p: ROOT / "plugins" / p for p in PLUGINS}}
    built = {}
    for name, src in sources.items():
        subprocess.run(
            [sys.executable, "-m", "build", "--wheel", "--outdir", str(out / name), str(src)],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        (wheel,) = (out / name).glob("*.whl")
        built[name] = wheel
    return built


@pytest.fixture(scope="module")
def env(tmp_path_factory, wheels) -> Venv:
    """A fresh venv holding only the core."""
    v = Venv(tmp_path_factory.mktemp("venv") / "v")
    v.pip("install", str(wheels["uniagent"]))
    return v


def test_core_alone_lists_no_external_plugin_and_its_builtins_load(env):
    assert by_name(env.plugins()) == {}
    builtins = env.plugins("--all")["plugins"]
    assert builtins and all(p["builtin"] and p["status"] == "loaded" for p in builtins)
    contributed = {name for p in builtins for name in p["contributes"]["deployments"]}
    assert {"host", "local", "remote"} <= contributed


@pytest.mark.parametrize("plugin", sorted(PLUGINS))
def test_installed_plugin_is_listed_with_its_contributions_and_gone_after_uninstall(
    env, wheels, plugin
):
    contributes = PLUGINS[plugin]
    env.pip("install", str(wheels[plugin]))
    try:
        entry = by_name(env.plugins())[plugin]
        assert entry["status"] == "loaded", entry["error"]
        assert entry["version"] == "0.2.0"
        assert entry["hooks"] == sorted(f"uniagent_{kind}" for kind in contributes)
        assert {k: set(v) for k, v in entry["contributes"].items() if v} == contributes
        if "tools" in contributes:
            schemas = {t["name"]: t["schema"] for t in entry["tools"]}
            assert set(schemas) == contributes["tools"]
            assert all(s["type"] == "function" for s in schemas.values())
        assert by_name(env.plugins(env={"UNIAGENT_LOAD_PLUGINS": ""})) == {}
        blocked = by_name(env.plugins(env={"UNIAGENT_DISABLE_PLUGINS": plugin}))[plugin]
        assert blocked["status"] == "blocked"
    finally:
        env.pip("uninstall", "-y", plugin)
    assert plugin not in by_name(env.plugins())


def test_plugin_whose_import_raises_is_failed_while_others_load(env, wheels, tmp_path):
    broken = tmp_path / "uniagent-broken"
    (broken / "src" / "uniagent_broken").mkdir(parents=True)
    (broken / "pyproject.toml").write_text(
        textwrap.dedent("""
        [build-system]
        requires = ["hatchling"]
        build-backend = "hatchling.build"

        [project]
        name = "uniagent-broken"
        version = "0.0.1"

        [project.entry-points.uniagent]
        uniagent-broken = "uniagent_broken.plugin"
    """)
    )
    (broken / "src" / "uniagent_broken" / "__init__.py").write_text("")
    (broken / "src" / "uniagent_broken" / "plugin.py").write_text(
        "raise RuntimeError('this plugin is broken on purpose')\n"
    )
    env.pip("install", str(broken), str(wheels["uniagent-tools-swe"]))
    try:
        plugins = by_name(env.plugins())
        assert plugins["uniagent-broken"]["status"] == "failed"
        assert "broken on purpose" in plugins["uniagent-broken"]["error"]
        assert plugins["uniagent-tools-swe"]["status"] == "loaded"
        strict = subprocess.run(
            [str(env.uniagent), "plugins"],
            capture_output=True,
            text=True,
            env={**os.environ, "UNIAGENT_STRICT_PLUGINS": "1"},
        )
        assert strict.returncode != 0 and "broken on purpose" in strict.stderr
    finally:
        env.pip("uninstall", "-y", "uniagent-broken", "uniagent-tools-swe")
