"""The core's structure: one way down (no import cycle), a light front door, resolve once."""

from __future__ import annotations

import ast
import json
import logging
import subprocess
import sys
import types
import warnings
from pathlib import Path

import pytest
from pydantic import BaseModel

import uniagent
import uniagent.testing
from uniagent import AgentConfig, RewardSpec, ServiceSpec
from uniagent.testing import Reply, ScriptedChatServer, cli, tool_call

SRC = Path(uniagent.__file__).resolve().parents[1]


def import_graph(*, packages: bool) -> dict[str, set[str]]:
    """Runtime imports between the core's modules (or subpackages): lazy ones count,
    ``if TYPE_CHECKING:`` blocks do not, and a module's import of its own ancestor package
    (the lazy front door) is not an edge."""
    modules: dict[str, Path] = {}
    for path in (SRC / "uniagent").rglob("*.py"):
        parts = path.relative_to(SRC).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    edges: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        skipped = {
            id(node)
            for block in ast.walk(tree)
            if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
            for stmt in block.body
            for node in ast.walk(stmt)
        }
        for node in ast.walk(tree):
            if id(node) in skipped or not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                    here = here[: len(here) - node.level + 1]
                    base = ".".join([*here, *([base] if base else [])])
                targets = [base, *(f"{base}.{alias.name}" for alias in node.names)]
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name and not name.startswith(target + "."):
                    edges[name].add(target)
    if not packages:
        return edges
    unit = lambda module: ".".join(module.split(".")[:2])  # noqa: E731
    grouped: dict[str, set[str]] = {}
    for name, targets in edges.items():
        grouped.setdefault(unit(name), set()).update(
            unit(t) for t in targets if unit(t) != unit(name)
        )
    return grouped


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in edges.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


@pytest.mark.parametrize("packages", [False, True], ids=["modules", "subpackages"])
def test_the_core_has_no_import_cycle(packages: bool) -> None:
    graph = import_graph(packages=packages)
    assert len(graph) > (20 if packages else 100), "the graph found the core's modules"
    assert cycles(graph) == []


def test_no_core_module_outside_builtin_imports_builtin() -> None:
    """The built-in plugins are plugins: the core reaches them through the registry only."""
    graph = import_graph(packages=False)
    builtin = lambda name: name == "uniagent.builtin" or name.startswith("uniagent.builtin.")  # noqa: E731
    assert any(builtin(name) for name in graph), "the graph has the built-in plugins"
    importers = sorted(
        name for name, targets in graph.items()
        if not builtin(name) and any(builtin(t) for t in targets)
    )  # fmt: skip
    assert importers == []


def test_harbor_sits_below_the_runner() -> None:
    """Harbor's loader, images, reward and paths are one package that uses the grader and
    the task rows, never the runner, the episode or the commands above them."""
    above = {
        "uniagent.run", "uniagent.episode", "uniagent.resolver", "uniagent.verify",
        "uniagent.cli", "uniagent.builtin", "uniagent.data", "uniagent.verl",
    }  # fmt: skip
    graph = import_graph(packages=True)
    assert "uniagent.grading" in graph["uniagent.harbor"], "the graph has harbor's imports"
    assert sorted(graph["uniagent.harbor"] & above) == []


@pytest.mark.parametrize(
    "low",
    ["uniagent.exit", "uniagent.protect", "uniagent.specs", "uniagent.agent_run", "uniagent.env",
     "uniagent.grading"],
)  # fmt: skip
def test_the_lower_layers_import_nothing_above_them(low: str) -> None:
    """The exit reasons, the protection rules, the plugin contract, the sandboxes and the
    grader: their runtime imports stay among themselves (and the errors)."""
    below = {
        "uniagent.exit", "uniagent.errors", "uniagent.protect", "uniagent.specs",
        "uniagent.agent_run", "uniagent.procfs", "uniagent.env", "uniagent.reward",
        "uniagent.cache", "uniagent.grading",
    }  # fmt: skip
    graph = import_graph(packages=True)
    assert low in graph
    assert sorted(graph[low] - below) == []


def test_the_cycle_check_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize(
    "statement",
    [
        "import uniagent",
        "import uniagent.errors",
        # pytest loads it in every run wherever uniagent is installed (pytest11 entry point)
        "import uniagent.testing.pytest_plugin",
    ],
)
def test_importing_the_front_door_loads_no_backend_grader_or_runner(statement: str) -> None:
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", statement],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    imported = {
        line.rsplit("|", 1)[-1].strip()
        for line in done.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }
    assert "uniagent" in imported
    light = {"uniagent.testing.pytest_plugin"}
    heavy = sorted(
        name for name in imported
        if name.startswith(("uniagent.env", "uniagent.grading", "uniagent.run", "uniagent.models",
                            "uniagent.testing."))
        and name not in light
    )  # fmt: skip
    assert heavy == []


@pytest.mark.parametrize("door", [uniagent, uniagent.testing], ids=lambda m: m.__name__)
def test_the_front_door_serves_each_name_it_lists(door: types.ModuleType) -> None:
    for name in door.__all__:
        assert getattr(door, name) is not None, name
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        door.nope  # noqa: B018


@pytest.mark.parametrize("door", [uniagent, uniagent.testing], ids=lambda m: m.__name__)
def test_the_front_doors_three_lists_agree(door: types.ModuleType) -> None:
    """``__all__`` (what ``import *`` and type checkers export), ``_EXPORTS`` (what loads on
    first use) and the ``TYPE_CHECKING`` imports (what type checkers and IDEs see) name the
    same names, each from the same module (besides what the module itself defines)."""
    assert door.__file__ is not None
    tree = ast.parse(Path(door.__file__).read_text())
    checked: dict[str, str] = {}
    own = {"__version__"}
    for node in tree.body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for imp in ast.walk(node):
                if isinstance(imp, ast.ImportFrom) and imp.module:
                    checked.update((alias.asname or alias.name, imp.module) for alias in imp.names)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            own.add(node.name)
    exports = door._EXPORTS
    assert set(door.__all__) - own == set(exports), "__all__ and _EXPORTS"
    assert checked == exports, "the TYPE_CHECKING imports and _EXPORTS"
    if door is uniagent:
        assert door.__all__ == sorted(door.__all__)


def test_names_that_moved_to_uniagent_sandbox_still_work_with_a_warning() -> None:
    import uniagent.sandbox

    with pytest.warns(DeprecationWarning, match="moved to uniagent.sandbox.SANDBOX_UID"):
        assert uniagent.SANDBOX_UID == uniagent.sandbox.SANDBOX_UID
    with pytest.warns(DeprecationWarning, match=r"get_registry\(\)\.tools\(\)"):
        assert uniagent.get_tools() is uniagent.get_registry().tools()


def test_the_rollouts_old_name_still_works_with_a_warning() -> None:
    import uniagent.rollout
    import uniagent.rollout.cache

    for module in (uniagent.rollout, uniagent.rollout.cache):
        with pytest.warns(DeprecationWarning, match=r"RolloutCache is deprecated.*Rollout"):
            assert module.RolloutCache is uniagent.rollout.Rollout


# -- one vocabulary: `settings`, with the old names deprecated for one minor version ----
class Settings(BaseModel):
    level: int = 1


async def _score(ctx: object) -> float:
    return 1.0


async def _start(settings: object) -> object:
    return None


def test_records_take_settings_and_the_old_config_name_with_a_warning() -> None:
    assert RewardSpec(name="r", fn=_score, settings=Settings).settings is Settings
    with pytest.warns(DeprecationWarning, match=r"RewardSpec\(settings=...\)"):
        old = RewardSpec(name="r", fn=_score, config=Settings)
    assert old.settings is Settings and old.config is Settings
    with pytest.warns(DeprecationWarning, match=r"ServiceSpec\(settings=...\)"):
        assert ServiceSpec(name="s", start=_start, config=Settings).settings is Settings
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # copying a record (the registry does) is silent
        import dataclasses

        dataclasses.replace(old, distribution="x")


def test_reward_settings_key_and_the_deprecated_config_key() -> None:
    new = AgentConfig.from_dict({"reward": {"name": "command", "settings": {"command": "true"}}})
    assert new.reward is not None and new.reward.settings == {"command": "true"}
    with pytest.warns(FutureWarning, match="rename it to reward.settings"):
        old = AgentConfig.from_dict({"reward": {"name": "command", "config": {"command": "true"}}})
    assert old == new
    with pytest.raises(uniagent.ConfigError, match="not both"):
        AgentConfig.from_dict({"reward": {"name": "command", "config": {}, "settings": {}}})


def test_the_env_section_and_the_resolved_env_are_one_model() -> None:
    config = AgentConfig.from_dict({"env": {"post_setup": ["true"]}})
    agent = uniagent.resolve(config)
    assert isinstance(config.env, uniagent.EnvConfig) and agent.env is config.env


async def test_open_env_is_the_front_doors_and_agentenv_from_config_forwards_to_it() -> None:
    async with uniagent.open_env({"type": "host"}, {"env": {"X": "1"}}) as env:
        assert (await env.run_action("echo $X", timeout=30)).output.strip() == "1"
    with pytest.warns(DeprecationWarning, match="uniagent.open_env"):
        old = uniagent.AgentEnv.from_config({"type": "host"})
    assert isinstance(old, uniagent.AgentEnv)
    with pytest.raises(uniagent.ConfigError, match="installed deployments"):
        uniagent.open_env({"type": "nope"})


# -- resolve once (the `done` tool: conftest's done_tool) ----------------------------


def test_one_uniagent_run_resolves_its_config_once(done_tool, tmp_path, monkeypatch, caplog):
    config = tmp_path / "agent.yaml"
    config.write_text(json.dumps({
        "tools": ["done"], "instance_template": "{q}",
        "env": {"deployment": {"type": "host", "isolation": "none"}},
    }))  # fmt: skip
    same = {"interaction": {"max_turns": 3}}
    rows = [{"id": f"plain-{i}", "q": "go"} for i in range(4)]
    rows += [{"id": f"over-{i}", "q": "go", "tools_kwargs": same} for i in range(3)]
    data = tmp_path / "tasks.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    monkeypatch.setenv("OPENAI_API_KEY", "test")
    caplog.set_level(logging.DEBUG, logger="uniagent.resolver")
    reply = Reply("Done.", tool_calls=[tool_call("done", {}, "call_done")])
    with ScriptedChatServer(default=lambda body: reply) as server:
        status = cli([
            "run", str(config), "--data", str(data), "--out", str(tmp_path / "out"),
            "--model", f"openai:{server.base_url}#scripted", "--concurrency", "4",
        ])  # fmt: skip
    assert status == 0
    results = (tmp_path / "out" / "results.jsonl").read_text().splitlines()
    assert [json.loads(r)["exit_reason"] for r in results] == ["finished"] * 7
    resolved = [r.getMessage() for r in caplog.records if r.name == "uniagent.resolver"]
    assert [m for m in resolved if not m.endswith("(overrides)")] == [f"resolved {config}"]
    # Three tasks with the same override: resolved once, by whichever task came first.
    assert len([m for m in resolved if m.endswith("(overrides)")]) == 1


def test_a_row_and_the_config_may_both_use_the_deprecated_reward_config_key(
    done_tool, tmp_path, monkeypatch
):
    """``reward.config`` (deprecated) in the config and in rows' overrides is one key:
    every task runs, the row's settings merged into the config's, and the deprecation is
    said once (the warnings' default filter, as ``uniagent run`` has it)."""
    config = tmp_path / "agent.yaml"
    config.write_text(json.dumps({
        "tools": ["done"], "instance_template": "{q}",
        "env": {"deployment": {"type": "host", "isolation": "none"}},
        "reward": {"name": "command", "config": {"command": "test -z \"$X\"", "timeout": 60}},
    }))  # fmt: skip
    rows = [{"id": "plain", "q": "go"}]
    rows += [
        {"id": f"old-{i}", "q": "go", "config_overrides": {"reward": {"config": {"command": c}}}}
        for i, c in enumerate(["true", "test 1 = 1"])
    ]
    rows += [
        {"id": "new", "q": "go", "config_overrides": {"reward": {"settings": {"command": "true"}}}}
    ]
    rows += [
        {"id": "fails", "q": "go", "config_overrides": {"reward": {"config": {"command": "false"}}}}
    ]
    data = tmp_path / "tasks.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    monkeypatch.setenv("OPENAI_API_KEY", "test")
    reply = Reply("Done.", tool_calls=[tool_call("done", {}, "call_done")])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        with ScriptedChatServer(default=lambda body: reply) as server:
            status = cli([
                "run", str(config), "--data", str(data), "--out", str(tmp_path / "out"),
                "--model", f"openai:{server.base_url}#scripted",
            ])  # fmt: skip
    assert status == 0
    lines = (tmp_path / "out" / "results.jsonl").read_text().splitlines()
    results = {r["task_id"]: r for r in map(json.loads, lines)}
    assert {k: (r["exit_reason"], r["reward"]) for k, r in results.items()} == {
        "plain": ("finished", 1.0), "old-0": ("finished", 1.0), "old-1": ("finished", 1.0),
        "new": ("finished", 1.0), "fails": ("finished", 0.0),
    }  # fmt: skip
    deprecated = [w for w in caught if "reward.config is deprecated" in str(w.message)]
    assert len(deprecated) == 1, [str(w.message) for w in deprecated]


async def test_prepare_grader_takes_the_old_config_keyword_with_a_warning() -> None:
    from uniagent.testing import prepare_grader

    async with uniagent.open_env({"type": "host"}) as env:
        with pytest.warns(DeprecationWarning, match=r"prepare_grader\(config=...\)"):
            grader = await prepare_grader(env, "command", {}, config={"command": "true"})
    assert grader.plan.settings.command == "true"
