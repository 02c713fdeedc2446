"""The submission ``submit`` records applies with ``git apply`` to a fresh clone of the base.

The submission is what leaderboards receive, so every test here takes the
output of the real ``submit`` tool in a real host sandbox (what the loop
records as the episode's ``submission``) and checks it with ``git apply
--check`` on a fresh clone, then applies it and compares the files.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from uniagent import AgentConfig, ConfigError, ToolSpec, resolve

from uniagent_tools_swe import DEFAULT_SUBMIT_EXCLUDE, make_submit

if TYPE_CHECKING:
    from conftest import Sandbox

#: The python tests of the fixture repository, run the way an agent runs them; bytecode is
#: written even where this test process was told not to (PYTHONDONTWRITEBYTECODE), and the
#: plugins installed beside this suite stay out of the inner run.
RUN_TESTS = (
    "env -u PYTHONDONTWRITEBYTECODE PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 "
    f"{shlex.quote(sys.executable)} -m pytest -q"
)
DROPPINGS = ("__pycache__", ".pyc", ".pytest_cache")


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True
    ).stdout


def make_repo(path: Path, files: dict[str, bytes], gitignore: str | None = None) -> Path:
    """A repository whose one commit (the base) holds ``files``; no .gitignore unless given."""
    path.mkdir()
    git(path, "init", "-q")
    git(path, "config", "user.email", "t@example.com")
    git(path, "config", "user.name", "t")
    if gitignore is not None:
        files = {**files, ".gitignore": gitignore.encode()}
    for name, data in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_bytes(data)
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "base")
    return path


PYTHON_PROJECT = {
    "calc/__init__.py": b"",
    "calc/ops.py": b"def add(a, b):\n    return a - b\n",
    "tests/test_ops.py": b"from calc.ops import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n",
}


async def submission(sandbox: Sandbox, repo: Path) -> str:
    """Call ``submit`` from inside ``repo``; its output, as the episode records it."""
    obs = await sandbox.call("execute_bash", command=f"cd {shlex.quote(str(repo))}")
    assert obs.exit_code == 0, obs.output
    obs = await sandbox.call("submit")
    assert obs.exit_code == 0, obs.output
    return obs.output


def apply_to_a_fresh_clone(repo: Path, patch: str, where: Path) -> Path:
    """Clone the base of ``repo``, check that ``patch`` applies there, apply it."""
    clone = where / "clone"
    subprocess.run(["git", "clone", "-q", str(repo), str(clone)], check=True)
    patch_file = where / "submission.patch"
    patch_file.write_text(patch, encoding="utf-8", newline="")
    check = subprocess.run(
        ["git", "-C", str(clone), "apply", "--check", str(patch_file)],
        check=False,
        capture_output=True,
        text=True,
    )
    assert check.returncode == 0, check.stderr
    git(clone, "apply", str(patch_file))
    return clone


def paths_in(patch: str) -> list[str]:
    return [line.split(" b/", 1)[1] for line in patch.splitlines() if line.startswith("diff --git")]


async def test_after_running_the_tests_in_a_repo_without_gitignore(sandbox: Sandbox) -> None:
    repo = make_repo(sandbox.workdir / "repo", PYTHON_PROJECT)
    obs = await sandbox.call("execute_bash", command=f"cd {repo} && {RUN_TESTS}")
    assert obs.exit_code == 1, obs.output  # the bug is there
    fix = "calc/ops.py"
    # A fix of another size: Python trusts a .pyc whose source has the same size and mtime
    # second, and the fix may land in the second of the first run.
    obs = await sandbox.call(
        "str_replace_editor",
        command="str_replace",
        path=str(repo / fix),
        old_str="return a - b",
        new_str="return a + b  # fixed",
    )
    assert obs.exit_code == 0, obs.output
    obs = await sandbox.call("execute_bash", command=RUN_TESTS)
    assert obs.exit_code == 0, obs.output
    assert list(repo.rglob("*.pyc")), "the test run wrote no bytecode: nothing is tested"
    assert (repo / ".pytest_cache").is_dir()
    patch = await submission(sandbox, repo)
    assert paths_in(patch) == [fix]
    assert not any(dropping in patch for dropping in DROPPINGS)
    clone = apply_to_a_fresh_clone(repo, patch, sandbox.workdir)
    assert (clone / fix).read_bytes() == (repo / fix).read_bytes()
    assert not list(clone.rglob("__pycache__"))


async def test_droppings_the_agent_staged_itself_are_left_out(sandbox: Sandbox) -> None:
    repo = make_repo(sandbox.workdir / "repo", PYTHON_PROJECT)
    obs = await sandbox.call("execute_bash", command=f"cd {repo} && {RUN_TESTS}; git add -A")
    assert obs.exit_code == 0, obs.output
    assert "calc/__pycache__" in git(repo, "diff", "--cached", "--name-only")
    patch = await submission(sandbox, repo)
    assert patch == ""
    assert "calc/__pycache__" in git(repo, "diff", "--cached", "--name-only")  # index untouched


async def test_an_added_binary_file_is_carried_whole(sandbox: Sandbox) -> None:
    logo = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 8
    repo = make_repo(sandbox.workdir / "repo", {"README.md": b"# demo\n", "logo.png": logo})
    added = bytes(reversed(range(256))) * 16 + b"\x00\x00tail"
    (repo / "data").mkdir()
    (repo / "data" / "fixture.bin").write_bytes(added)
    (repo / "logo.png").write_bytes(logo[:100] + b"\x00changed" + logo[100:])
    patch = await submission(sandbox, repo)
    assert sorted(paths_in(patch)) == ["data/fixture.bin", "logo.png"]
    assert "GIT binary patch" in patch
    assert "Binary files" not in patch  # no placeholder that git apply refuses
    clone = apply_to_a_fresh_clone(repo, patch, sandbox.workdir)
    assert (clone / "data" / "fixture.bin").read_bytes() == added
    assert (clone / "logo.png").read_bytes() == (repo / "logo.png").read_bytes()


async def test_a_text_change_applies(sandbox: Sandbox) -> None:
    repo = make_repo(
        sandbox.workdir / "repo",
        {"a.py": b"a = 1\n", "old_name.py": b"x = 0\n" * 20, "gone.txt": b"bye\n"},
        gitignore="*.log\n",
    )
    (repo / "a.py").write_text("a = 2\nb = 'caf\u00e9'\n", encoding="utf-8")
    (repo / "old_name.py").rename(repo / "new_name.py")
    (repo / "gone.txt").unlink()
    (repo / "notes file.md").write_text("spaces in the name\n")
    (repo / "debug.log").write_text("ignored\n")
    patch = await submission(sandbox, repo)
    assert sorted(paths_in(patch)) == [
        "a.py",
        "gone.txt",
        "new_name.py",
        "notes file.md",
        "old_name.py",
    ]  # a rename is a deletion and an addition
    clone = apply_to_a_fresh_clone(repo, patch, sandbox.workdir)
    for name in ("a.py", "new_name.py", "notes file.md"):
        assert (clone / name).read_bytes() == (repo / name).read_bytes()
    assert not (clone / "gone.txt").exists() and not (clone / "old_name.py").exists()
    assert not (clone / "debug.log").exists()


async def test_files_the_observation_would_change_go_as_binary_patches(
    sandbox: Sandbox,
) -> None:
    # The loop records submit's output cleaned of \r and control characters and decoded as
    # UTF-8: the text patch of a CRLF file, a latin-1 file or one with escape codes would
    # not apply any more.
    repo = make_repo(
        sandbox.workdir / "repo",
        {
            "win.txt": b"one\r\ntwo\r\n",
            "latin.py": b"# caf\xe9\nx = 1\n",
            "notes.md": b"# notes\n",
            "plain.py": b"p = 1\n",
            ".gitattributes": b"*.md diff=markdown\n",
        },
    )
    changed = {
        "win.txt": b"one\r\nTWO\r\n",
        "latin.py": b"# caf\xe9\nx = 2\n",
        "notes.md": b"# notes\n\x1b[1mbold\x1b[0m\n",  # its repository gives it a diff driver
        "plain.py": b"p = 2\n",
        "new.log.txt": b"progress\r100%\n",
    }
    for name, data in changed.items():
        (repo / name).write_bytes(data)
    patch = await submission(sandbox, repo)
    assert sorted(paths_in(patch)) == sorted(changed)
    assert "-p = 1\n+p = 2\n" in patch  # the others stay readable text patches
    assert patch.count("GIT binary patch") == 4
    clone = apply_to_a_fresh_clone(repo, patch, sandbox.workdir)
    for name, data in changed.items():
        assert (clone / name).read_bytes() == data, name


async def test_files_of_the_base_are_diffed_whatever_their_name(sandbox: Sandbox) -> None:
    repo = make_repo(sandbox.workdir / "repo", {"vendored/__pycache__/mod.pyc": b"\x00old"})
    (repo / "vendored" / "__pycache__" / "mod.pyc").write_bytes(b"\x00new")
    patch = await submission(sandbox, repo)
    assert paths_in(patch) == ["vendored/__pycache__/mod.pyc"]
    clone = apply_to_a_fresh_clone(repo, patch, sandbox.workdir)
    assert (clone / "vendored" / "__pycache__" / "mod.pyc").read_bytes() == b"\x00new"


# -- settings ------------------------------------------------------------------------------
def configured_submit(settings: dict[str, object]) -> ToolSpec:
    config = AgentConfig.from_dict({"tools": [{"name": "submit", "settings": settings}]})
    [tool] = resolve(config).tools
    return tool


async def test_the_exclude_patterns_are_the_tools_settings(sandbox: Sandbox) -> None:
    tool = configured_submit({"exclude": [], "extra_exclude": ["*.log", "scratch/"]})
    sandbox.tools["submit"] = tool
    repo = make_repo(sandbox.workdir / "repo", {"a.py": b"a = 1\n"})
    (repo / "__pycache__").mkdir()
    (repo / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"\x00\x01bytecode")
    (repo / "run.log").write_text("log\n")
    (repo / "scratch").mkdir()
    (repo / "scratch" / "try.py").write_text("print(1)\n")
    (repo / "a.py").write_text("a = 2\n")
    patch = await submission(sandbox, repo)
    # Nothing of the defaults is left out now: the bytecode goes, as a binary patch.
    assert sorted(paths_in(patch)) == ["__pycache__/a.cpython-311.pyc", "a.py"]
    clone = apply_to_a_fresh_clone(repo, patch, sandbox.workdir)
    assert (clone / "__pycache__" / "a.cpython-311.pyc").read_bytes() == b"\x00\x01bytecode"


def test_the_defaults_are_in_the_description_and_the_command() -> None:
    spec = make_submit()
    command = spec.to_command({})
    for pattern in DEFAULT_SUBMIT_EXCLUDE:
        assert f"`{pattern}`" in spec.description
        assert shlex.quote(f"--exclude={pattern}") in command
    bare = make_submit(exclude=())
    assert bare.to_command({}) == "submit"
    assert "left out" not in bare.description


def test_bad_submit_settings_name_their_key_path() -> None:
    bad = {
        "tools": [{"name": "submit", "settings": {"exclude": ["ok/", "two\nlines"], "exclud": []}}]
    }
    with pytest.raises(ConfigError) as err:
        resolve(AgentConfig.from_dict(bad, source="agent.yaml"))
    message = str(err.value)
    assert "tools.0.settings.exclud: unknown key" in message
    assert "tools.0.settings.exclude" in message and "spans lines" in message
