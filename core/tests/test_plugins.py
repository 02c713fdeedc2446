"""The plugin loader: built-ins, entry points, env vars, failures (tiers 1 and 2)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest
from pydantic import BaseModel

from uniagent import ToolSpec, hookimpl
from uniagent.errors import PluginLoadError
from uniagent.plugins import PluginManager, normalize_name
from uniagent.registry import Registry


class NoArgs(BaseModel):
    pass


def tool_plugin(*names: str) -> types.SimpleNamespace:
    @hookimpl
    def uniagent_tools():
        return [ToolSpec(name=n, description=f"{n} tool", arguments=NoArgs) for n in names]

    return types.SimpleNamespace(uniagent_tools=uniagent_tools)


def make_dist(
    site: Path,
    dist: str,
    module: str,
    body: str,
    *,
    ep_name: str | None = None,
    version: str = "1.0",
) -> None:
    """Write an installed-looking distribution (``.dist-info`` + module) into ``site``."""
    info = site / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(f"[uniagent]\n{ep_name or dist} = {module}\n")
    (site / f"{module}.py").write_text(textwrap.dedent(body))


TOOL_MODULE = """
    from pydantic import BaseModel
    from uniagent import ToolSpec, hookimpl

    class Args(BaseModel):
        pass

    @hookimpl
    def uniagent_tools():
        return [ToolSpec(name={name!r}, description="d", arguments=Args)]
"""


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A fresh directory on sys.path for fake distributions; env vars cleared."""
    path = tmp_path / "site"
    path.mkdir()
    monkeypatch.syspath_prepend(str(path))
    for var in ("UNIAGENT_LOAD_PLUGINS", "UNIAGENT_DISABLE_PLUGINS", "UNIAGENT_STRICT_PLUGINS"):
        monkeypatch.delenv(var, raising=False)
    before = set(sys.modules)
    yield path
    for name in set(sys.modules) - before:
        if name.startswith("fake_"):
            del sys.modules[name]


def load(*paths: Path) -> PluginManager:
    """A manager over only the fake distributions in ``paths`` plus the built-ins."""
    manager = PluginManager(search_path=[str(p) for p in paths])
    manager.load()
    return manager


def external(manager: PluginManager) -> dict[str, str]:
    return {i.distribution: i.status for i in manager.report() if i.module.startswith("fake_")}


# -- tier 1: plugins registered directly -----------------------------------------------------


def test_directly_registered_plugin_contributes_records_with_its_distribution():
    manager = PluginManager()
    manager.register(tool_plugin("hello"), "uniagent-tools-hello", version="1.2")
    tools = Registry(manager).tools()
    assert list(tools) == ["hello"]
    assert tools["hello"].distribution == "uniagent-tools-hello"
    assert not tools["hello"].builtin


def test_misspelled_hook_marks_plugin_failed_with_a_suggestion():
    @hookimpl
    def uniagent_tool():
        return []

    manager = PluginManager()
    info = manager.register(types.SimpleNamespace(uniagent_tool=uniagent_tool), "typo-plugin")
    assert info.status == "failed"
    assert "unknown hook 'uniagent_tool'" in info.error
    assert "did you mean 'uniagent_tools'" in info.error
    manager.hook_manager.check_pending()  # the broken plugin was never registered


def test_misspelled_hook_is_fatal_in_strict_mode(monkeypatch):
    monkeypatch.setenv("UNIAGENT_STRICT_PLUGINS", "1")

    @hookimpl
    def uniagent_rewardz():
        return []

    with pytest.raises(PluginLoadError, match="uniagent_rewardz"):
        PluginManager().register(types.SimpleNamespace(uniagent_rewardz=uniagent_rewardz), "p")


def test_hook_that_raises_is_reported_and_others_still_contribute():
    @hookimpl
    def uniagent_tools():
        raise RuntimeError("boom")

    manager = PluginManager()
    manager.register(types.SimpleNamespace(uniagent_tools=uniagent_tools), "broken")
    manager.register(tool_plugin("ok"), "fine")
    assert list(Registry(manager).tools()) == ["ok"]
    broken = manager.plugins["broken"]
    assert broken.status == "failed" and "RuntimeError: boom" in broken.error


def test_records_are_frozen():
    spec = ToolSpec(name="x", description="d", arguments=NoArgs)
    with pytest.raises(AttributeError):
        spec.name = "y"  # type: ignore[misc]


def test_normalize_name_follows_pep_503():
    assert normalize_name("UniAgent_Tools.SWE") == "uniagent-tools-swe"


# -- tier 2: fake installed distributions ------------------------------------------------------


def test_entry_point_plugin_is_loaded_and_attributed(site):
    make_dist(site, "fake-tools-a", "fake_a", TOOL_MODULE.format(name="tool_a"), version="0.3")
    manager = load(site)
    assert external(manager) == {"fake-tools-a": "loaded"}
    info = manager.plugins["fake-tools-a"]
    assert info.version == "0.3" and info.hooks == ["uniagent_tools"]
    assert Registry(manager).tools()["tool_a"].distribution == "fake-tools-a"


def test_load_is_idempotent(site):
    make_dist(site, "fake-tools-a", "fake_a", TOOL_MODULE.format(name="tool_a"))
    manager = load(site)
    manager.load()
    manager.load()
    assert list(Registry(manager).tools()) == ["tool_a"]


def test_import_error_is_recorded_and_does_not_stop_other_plugins(site):
    make_dist(site, "fake-broken", "fake_broken", "raise ImportError('no such thing')\n")
    make_dist(site, "fake-tools-a", "fake_a", TOOL_MODULE.format(name="tool_a"))
    manager = load(site)
    assert external(manager) == {"fake-broken": "failed", "fake-tools-a": "loaded"}
    assert "ImportError: no such thing" in manager.plugins["fake-broken"].error
    assert list(Registry(manager).tools()) == ["tool_a"]


def test_import_error_is_fatal_in_strict_mode(site, monkeypatch):
    make_dist(site, "fake-broken", "fake_broken", "raise ImportError('no such thing')\n")
    monkeypatch.setenv("UNIAGENT_STRICT_PLUGINS", "1")
    with pytest.raises(PluginLoadError, match="fake-broken.*no such thing"):
        load(site)


def test_load_plugins_env_selects_distributions(site, monkeypatch):
    make_dist(site, "fake-tools-a", "fake_a", TOOL_MODULE.format(name="tool_a"))
    make_dist(site, "fake-tools-b", "fake_b", TOOL_MODULE.format(name="tool_b"))
    monkeypatch.setenv("UNIAGENT_LOAD_PLUGINS", "Fake_Tools_B")
    assert external(load(site)) == {"fake-tools-b": "loaded"}


def test_load_plugins_env_naming_nothing_installed_says_so(site, monkeypatch, caplog):
    make_dist(site, "fake-tools-a", "fake_a", TOOL_MODULE.format(name="tool_a"))
    make_dist(site, "fake-tools-b", "fake_b", TOOL_MODULE.format(name="tool_b"))
    monkeypatch.setenv("UNIAGENT_LOAD_PLUGINS", "fake-tools-b,fake-tool-a,nothing-here")
    with caplog.at_level("WARNING", logger="uniagent.plugins"):
        assert external(load(site)) == {"fake-tools-b": "loaded"}
    (warning,) = [
        r.getMessage() for r in caplog.records if "UNIAGENT_LOAD_PLUGINS" in r.getMessage()
    ]
    assert "fake-tool-a, nothing-here: not installed" in warning
    assert "installed plugins: fake-tools-a, fake-tools-b" in warning
    assert "did you mean fake-tools-a" in warning.lower()
    monkeypatch.setenv("UNIAGENT_STRICT_PLUGINS", "1")
    with pytest.raises(PluginLoadError, match="UNIAGENT_LOAD_PLUGINS names fake-tool-a"):
        load(site)


def test_empty_load_plugins_env_loads_no_external_plugin_but_keeps_builtins(site, monkeypatch):
    make_dist(site, "fake-tools-a", "fake_a", TOOL_MODULE.format(name="tool_a"))
    monkeypatch.setenv("UNIAGENT_LOAD_PLUGINS", "")
    manager = load(site)
    assert manager.report() == []
    assert manager.report(include_builtins=True), "built-ins are always registered"


def test_disable_plugins_env_blocks_by_name(site, monkeypatch):
    make_dist(site, "fake-tools-a", "fake_a", TOOL_MODULE.format(name="tool_a"))
    make_dist(site, "fake-tools-b", "fake_b", TOOL_MODULE.format(name="tool_b"))
    monkeypatch.setenv("UNIAGENT_DISABLE_PLUGINS", "fake-tools-a")
    manager = load(site)
    assert external(manager) == {"fake-tools-a": "blocked", "fake-tools-b": "loaded"}
    assert "fake_a" not in sys.modules, "a blocked plugin is never imported"
    assert list(Registry(manager).tools()) == ["tool_b"]


def test_same_entry_point_seen_twice_loads_once(site, tmp_path, monkeypatch):
    make_dist(site, "fake-tools-a", "fake_a", TOOL_MODULE.format(name="tool_a"))
    # An editable install can expose the same distribution from a second path.
    other = tmp_path / "other"
    make_dist(other, "fake-tools-a", "fake_a", TOOL_MODULE.format(name="tool_a"))
    monkeypatch.syspath_prepend(str(other))
    manager = load(site, other)
    assert external(manager) == {"fake-tools-a": "loaded"}
    assert list(Registry(manager).tools()) == ["tool_a"]


def test_misspelled_hook_in_installed_plugin_is_reported(site):
    make_dist(
        site,
        "fake-typo",
        "fake_typo",
        """
        from uniagent import hookimpl

        @hookimpl
        def uniagent_deployment():
            return []
    """,
    )
    manager = load(site)
    info = manager.plugins["fake-typo"]
    assert info.status == "failed" and "uniagent_deployments" in info.error


# -- what `uniagent plugins` says about records that need a missing extra --------------------
#: Run in a fresh interpreter where SWE-ReX cannot be imported: the narrowest stand-in for
#: an install without the [swerex] extra (the integration suite's template venv is one).
HIDE_SWEREX = "sys.modules['swerex'] = None; "


def uniagent_plugins(*args: str, swerex: bool) -> subprocess.CompletedProcess[str]:
    hide = "" if swerex else HIDE_SWEREX
    program = f"import sys; {hide}from uniagent.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run(
        [sys.executable, "-c", program, "plugins", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "UNIAGENT_LOAD_PLUGINS": ""},  # the built-ins only
    )


def test_plugins_all_says_which_builtin_deployments_need_the_swerex_extra():
    proc = uniagent_plugins("--all", swerex=False)
    assert proc.returncode == 0, proc.stderr
    assert "  deployments: host, local, remote\n" in proc.stdout
    assert (
        "  local, remote: not usable without uniagent[swerex] (pip install 'uniagent[swerex]')"
        in proc.stdout
    )
    report = json.loads(uniagent_plugins("--all", "--json", swerex=False).stdout)
    (builtin,) = [p for p in report["plugins"] if p["module"] == "uniagent.builtin.deployments"]
    assert builtin["needs"] == {"local": ["uniagent[swerex]"], "remote": ["uniagent[swerex]"]}


def test_with_the_swerex_extra_installed_nothing_is_flagged():
    assert importlib.util.find_spec("swerex"), "the core suite installs uniagent[swerex]"
    proc = uniagent_plugins("--all", swerex=True)
    assert proc.returncode == 0, proc.stderr
    assert "not usable without" not in proc.stdout
    report = json.loads(uniagent_plugins("--all", "--json", swerex=True).stdout)
    assert all(p["needs"] == {} for p in report["plugins"])
