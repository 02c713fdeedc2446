"""The cookiecutter templates in ``templates/``: real bakes, real installs, passing tests.

Each template is baked with cookiecutter's Python API and its files are
checked. Then every baked plugin is installed (non-editable, with its
``test`` extra) next to the local core in one fresh venv, where the plugin's
own tests must pass, its code must be ruff-clean and ``uniagent plugins
--json`` must list it with what it contributes.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import venv
from dataclasses import dataclass
from pathlib import Path

import pytest
from cookiecutter.exceptions import FailedHookException
from cookiecutter.main import cookiecutter

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - pytest itself brings tomli on Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
TEMPLATES = ROOT / "templates"
CORE = ROOT / "core"
#: The steps a new plugin's author follows: the first bash block of templates/README.md.
README_STEPS = re.search(
    r"## Make a plugin\n.*?```bash\n(.*?)```", (TEMPLATES / "README.md").read_text(), re.S
)

#: Files every baked plugin has, relative to the distribution directory.
COMMON_FILES = {
    ".gitignore",
    "README.md",
    "pyproject.toml",
    "src/{module}/__init__.py",
    "src/{module}/plugin.py",
    "tests/test_plugin.py",
}


@dataclass(frozen=True)
class Case:
    """One template, the name a user gives it and what the baked plugin must contribute."""

    template: str
    plugin_name: str | None  # None: the template's default
    dist: str
    kind: str  # registry kind, as in ``uniagent plugins --json``
    record: str
    extra_files: tuple[str, ...] = ()
    description: str | None = None  # None: the template's default
    variant: str | None = None  # the template's `kind` choice (None: its default)
    #: Whether the plugin module has the kind's hook (an MCP server's tools come from it).
    hooked: bool = True
    #: Tests of the baked plugin that must pass besides test_plugin_is_discovered.
    passes: tuple[str, ...] = ()

    @property
    def module(self) -> str:
        """The import name of the baked package."""
        return self.dist.replace("-", "_")

    @property
    def id(self) -> str:
        """The pytest id."""
        return self.template if self.variant is None else f"{self.template}-{self.variant}"


CASES = [
    # A name with a space and capitals, a description with quotes: all must still be valid.
    Case(
        "tool",
        "Hello World",
        "uniagent-tools-hello-world",
        "tools",
        "hello_world",
        extra_files=("src/{module}/bin/hello_world",),
        description='Greets "whoever" you name \\ politely, in ünicode.',
    ),
    # The tool template's MCP option: a package with an MCP server, run through `uniagent run`.
    Case(
        "tool",
        "Hello MCP",
        "uniagent-tools-hello-mcp",
        "tools",
        "hello_mcp",
        extra_files=("src/{module}/server.py",),
        variant="mcp",
        hooked=False,
        passes=(
            "test_the_server_runs_through_uniagent_run[sandbox]",
            "test_the_server_runs_through_uniagent_run[process]",
        ),
    ),
    Case("deploy", None, "uniagent-deploy-seeded", "deployments", "seeded"),
    Case("reward", "answer_file", "uniagent-reward-answer-file", "rewards", "answer_file"),
    Case("parser", "react", "uniagent-parser-react", "tool_parsers", "react"),
    Case(
        "agent",
        None,
        "uniagent-agent-echo-agent",
        "agents",
        "echo_agent",
        extra_files=("src/{module}/bin/echo_agent",),
    ),
]
BY_ID = {case.id: case for case in CASES}


def bake(template: Path, output_dir: Path, **context: str) -> Path:
    """Bake ``template`` without prompts; user config and replay files stay under ``output_dir``."""
    config = output_dir / "cookiecutter-config.yaml"
    config.write_text(
        f"cookiecutters_dir: {output_dir / 'cache'}\nreplay_dir: {output_dir / 'replay'}\n"
    )
    return Path(
        cookiecutter(
            str(template),
            no_input=True,
            extra_context=context,
            output_dir=str(output_dir),
            config_file=str(config),
        )
    )


def clean_env() -> dict[str, str]:
    """The environment of commands in the test venv: none of the outer run's settings."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("UNIAGENT_") and key not in {"PYTHONPATH", "VIRTUAL_ENV"}
    }
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # keep the baked trees as baked
    return env


class Venv:
    """A fresh virtual environment and commands run with its executables."""

    def __init__(self, path: Path) -> None:
        venv.EnvBuilder(with_pip=True).create(path)
        self.bin = path / "bin"

    def run(
        self, program: str, *args: str | Path, cwd: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run one of the venv's programs; the result, whatever the exit status."""
        return subprocess.run(
            [str(self.bin / program), *map(str, args)],
            cwd=cwd,
            capture_output=True,
            text=True,
            env=clean_env(),
            timeout=600,
        )

    def pip_install(self, *requirements: str) -> None:
        """Install into the venv (raises with the installer's output on failure): with the
        uv that uniagent's own harness installs use (:func:`uv_installer`: on PATH, not
        turned off), in seconds from its cache; else pip. The README steps' own test
        installs with pip, as written there."""
        from uniagent.agents.install import uv_installer

        uv = uv_installer()
        if uv:
            python = str(self.bin / "python")
            result = subprocess.run(
                [uv, "pip", "install", "-q", "--python", python, *requirements],
                capture_output=True, text=True, env=clean_env(), timeout=600,
            )  # fmt: skip
        else:
            result = self.run("python", "-m", "pip", "install", "-q", *requirements)
        assert result.returncode == 0, result.stdout + result.stderr


@pytest.fixture(scope="module")
def baked(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every template baked once, by case id."""
    out = tmp_path_factory.mktemp("baked")
    projects = {}
    for case in CASES:
        context = {
            key: value
            for key, value in (
                ("plugin_name", case.plugin_name),
                ("description", case.description),
                ("kind", case.variant),
            )
            if value is not None
        }
        projects[case.id] = bake(TEMPLATES / case.template, out, **context)
    return projects


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory, baked: dict[str, Path]) -> Venv:
    """One fresh venv with the local core and every baked plugin (non-editable)."""
    v = Venv(tmp_path_factory.mktemp("venv") / "v")
    # The agent template's test runs its harness through the gateway on the real tokenizer.
    core = f"{CORE}[gateway,tokenizers]"
    v.pip_install(core, *(f"{path}[test]" for path in baked.values()))
    return v


def files_under(directory: Path) -> set[str]:
    """Paths of the files under ``directory``, relative to it."""
    return {p.relative_to(directory).as_posix() for p in directory.rglob("*") if p.is_file()}


# -- baking ------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_template_bakes_a_complete_plugin_distribution(case: Case, baked: dict[str, Path]) -> None:
    """The distribution directory, package and files are named after the plugin."""
    project = baked[case.id]
    assert project.name == case.dist
    expected = {f.format(module=case.module) for f in COMMON_FILES | set(case.extra_files)}
    assert files_under(project) == expected
    for path in project.rglob("*"):
        if path.is_file():
            assert "{{" not in path.read_text() and "cookiecutter" not in path.read_text(), path


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_baked_pyproject_declares_the_entry_point_named_after_the_distribution(
    case: Case, baked: dict[str, Path]
) -> None:
    """hatchling, a dependency on uniagent, and ``[project.entry-points.uniagent]``."""
    pyproject = tomllib.loads((baked[case.id] / "pyproject.toml").read_text())
    project = pyproject["project"]
    assert pyproject["build-system"]["build-backend"] == "hatchling.build"
    assert project["name"] == case.dist
    if case.description is not None:
        assert project["description"] == case.description
    assert any(re.match(r"uniagent\b(?![-_])", dep) for dep in project["dependencies"])
    assert project["entry-points"]["uniagent"] == {case.dist: f"{case.module}.plugin"}
    assert pyproject["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"] == [
        f"src/{case.module}"
    ]


def test_tool_script_is_baked_executable(baked: dict[str, Path]) -> None:
    """The script the sandbox runs keeps its executable bit and shebang."""
    case = BY_ID["tool"]
    script = baked[case.id] / case.extra_files[0].format(module=case.module)
    assert os.access(script, os.X_OK)
    assert script.read_text().startswith("#!/usr/bin/env python3\n")


def test_templates_share_their_packaging_and_developer_docs(baked: dict[str, Path]) -> None:
    """Apart from names, every template bakes the same packaging and Develop/Test/Publish docs."""

    def neutral(case: Case, name: str) -> str:
        text = (baked[case.id] / name).read_text()
        return text.replace(case.dist, "PLUGIN").replace(case.module, "PLUGIN")

    def shared(case: Case) -> tuple[object, ...]:
        # An MCP server's package needs the core's `mcp` extra; otherwise the same.
        pyproject = tomllib.loads(
            neutral(case, "pyproject.toml").replace("uniagent[mcp]", "uniagent")
        )
        del pyproject["project"]["description"]
        hook = (TEMPLATES / case.template / "hooks" / "pre_gen_project.py").read_text()
        developer_docs = neutral(case, "README.md").split("## Develop", 1)[1]
        return pyproject, neutral(case, ".gitignore"), hook, developer_docs

    first, *others = CASES
    for case in others:
        assert shared(case) == shared(first), case.id


def test_name_that_cannot_become_a_python_name_is_refused(tmp_path: Path) -> None:
    """A pre-generation hook stops the bake, leaving nothing behind."""
    with pytest.raises(FailedHookException):
        bake(TEMPLATES / "tool", tmp_path, plugin_name="2fa")
    assert not (tmp_path / "uniagent-tools-2fa").exists()


def test_templates_directory_offers_every_template(tmp_path: Path) -> None:
    """``cookiecutter templates`` asks which kind; without prompts it bakes the first, a tool."""
    menu = json.loads((TEMPLATES / "cookiecutter.json").read_text())["templates"]
    assert sorted((TEMPLATES / t["path"]).resolve() for t in menu.values()) == sorted(
        {(TEMPLATES / case.template).resolve() for case in CASES}
    )
    assert bake(TEMPLATES, tmp_path).name == "uniagent-tools-hello"


# -- installed ------------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_baked_plugin_tests_pass_once_installed(
    case: Case, baked: dict[str, Path], env: Venv
) -> None:
    """The plugin's own tests, discovery test included, pass against the installed wheel."""
    project = baked[case.id]
    result = env.run("python", "-m", "pytest", "-p", "no:cacheprovider", "-rA", cwd=project)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    for test in ("test_plugin_is_discovered", *case.passes):
        assert f"PASSED tests/test_plugin.py::{test}" in output, output
    assert not re.search(r"\b(skipped|xfailed|xpassed)\b", output.splitlines()[-1]), output


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_baked_plugin_is_ruff_clean(case: Case, baked: dict[str, Path], env: Venv) -> None:
    """The rendered code passes ``ruff check`` and ``ruff format --check`` with its own config."""
    for args in (("check", "--no-cache", "."), ("format", "--no-cache", "--check", ".")):
        result = env.run("ruff", *args, cwd=baked[case.id])
        assert result.returncode == 0, result.stdout + result.stderr


#: mypy's incremental cache for the baked plugins, one per machine outside the clone: the
#: six plugins import the same core, pydantic and standard library, which a cold mypy
#: checks again each time (6-8 s of CPU a plugin). mypy keeps what it checked by content
#: and options, and checks again whatever another version, config or source changed.
_CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
MYPY_CACHE = _CACHE / "uniagent-tests" / "mypy-templates"


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_baked_plugin_passes_the_type_checker(
    case: Case, baked: dict[str, Path], env: Venv
) -> None:
    """``mypy src tests`` with the baked project's own config: zero errors."""
    result = env.run("mypy", "--cache-dir", MYPY_CACHE, "src", "tests", cwd=baked[case.id])
    assert result.returncode == 0, result.stdout + result.stderr


def test_uniagent_plugins_lists_each_baked_plugin_with_its_contribution(env: Venv) -> None:
    """``uniagent plugins --json`` in the venv: loaded, one hook, the example record."""
    result = env.run("uniagent", "plugins", "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    listed = {p["name"]: p for p in json.loads(result.stdout)["plugins"]}
    assert set(listed) == {case.dist for case in CASES}
    for case in CASES:
        plugin = listed[case.dist]
        assert plugin["status"] == "loaded", plugin["error"]
        assert plugin["version"] == "0.1.0"
        assert plugin["module"] == f"{case.module}.plugin"
        contributes = {k: v for k, v in plugin["contributes"].items() if v}
        if not case.hooked:  # loaded, with nothing to register (its config entry names it)
            assert plugin["hooks"] == [] and contributes == {}
            continue
        assert plugin["hooks"] == [f"uniagent_{case.kind}"]
        assert contributes == {case.kind: [case.record]}


# -- the README's own steps ------------------------------------------------------------------


def test_the_readme_steps_work_as_written_in_a_fresh_venv(tmp_path: Path) -> None:
    """templates/README.md's block, run verbatim by bash in a copy of the checkout.

    Only what the steps use is copied (``core/``, ``templates/``), so the bake and its
    venv land in a scratch folder; ``pip`` and ``cookiecutter`` before the venv is
    activated are this test environment's, and ``HOME`` is a scratch one (cookiecutter
    writes its replay files there).
    """
    assert README_STEPS, "templates/README.md has no bash block under 'Make a plugin'"
    steps = README_STEPS.group(1)
    checkout = tmp_path / "checkout"
    build_outputs = shutil.ignore_patterns("__pycache__", "*.egg-info", "build", "dist")
    shutil.copytree(CORE, checkout / "core", ignore=build_outputs)
    shutil.copytree(TEMPLATES, checkout / "templates", ignore=build_outputs)
    home = tmp_path / "home"
    home.mkdir()
    env = clean_env()
    env["HOME"] = str(home)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", steps],
        cwd=checkout,
        capture_output=True,
        text=True,
        env=env,
        timeout=1200,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "uniagent-tools-hello 0.1.0  [loaded]" in result.stdout, output
    assert "  tools: hello\n" in result.stdout, output
    assert re.search(r"\b\d+ passed\b", result.stdout), output  # the baked plugin's pytest


def test_without_the_swerex_extra_plugins_all_says_what_local_and_remote_need(env: Venv) -> None:
    """The venv has the core without extras: the built-in container backends say so."""
    assert env.run("python", "-c", "import swerex").returncode != 0  # really not installed
    result = env.run("uniagent", "plugins", "--all")
    assert result.returncode == 0, result.stdout + result.stderr
    assert (
        "  local, remote: not usable without uniagent[swerex] (pip install 'uniagent[swerex]')"
        in result.stdout
    )
