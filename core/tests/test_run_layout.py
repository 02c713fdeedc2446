"""One module owns the layout of a run folder: every other module names its files through it."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from uniagent.run import layout

SOURCE = Path(layout.__file__).resolve().parents[1]  # core/src/uniagent
FILE_NAMES = {
    layout.LOCK,
    layout.MANIFEST,
    layout.RESULTS,
    layout.SUMMARY,
    layout.LOG,
    layout.MESSAGES,
    layout.ROLLOUT,
    layout.RESULT,
    layout.TASK_ERROR,
}


def spelled_names(path: Path) -> list[str]:
    """The run folder's file names written out as string literals in ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    # A piece of an f-string is a whole name only as f"attempt-{n}.log" ("-{v}.lock" is not).
    pieces = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            whole = node.value in FILE_NAMES and id(node) not in pieces
            if whole or node.value.startswith("attempt-"):
                found.append(f"{path.relative_to(SOURCE)}:{node.lineno}: {node.value!r}")
    return found


def test_no_module_but_the_layout_spells_a_run_folder_file_name():
    modules = [p for p in sorted(SOURCE.rglob("*.py")) if p != Path(layout.__file__).resolve()]
    assert len(modules) > 50
    spelled = [hit for path in modules for hit in spelled_names(path)]
    assert spelled == []


def test_the_layout_imports_nothing_of_uniagent():
    """Without even the package's front door: what a reader of run folders loads with it."""
    code = f"""
import importlib.util, sys, types
package = types.ModuleType("uniagent")
package.__path__ = [{str(SOURCE)!r}]
sys.modules["uniagent"] = package
import uniagent.run.layout
print(sorted(m for m in sys.modules if m.startswith("uniagent")))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['uniagent', 'uniagent.run', 'uniagent.run.layout']"


@pytest.mark.parametrize(
    ("episode_dir", "key"),
    [
        ("runs/a/episodes/t/0", "episodes/t/0"),
        ("/abs/path/runs/a/episodes/proj_1+ab12/3/", "episodes/proj_1+ab12/3"),
        ("C:\\runs\\episodes\\t\\1", "episodes/t/1"),
        ("runs/a/episodes/../0", None),
        ("runs/a/episodes/t/..", None),
        ("episodes/t", None),
        ("", None),
    ],
)
def test_a_records_episode_dir_gives_its_folder_in_the_run_folder(episode_dir, key):
    assert layout.key_of_episode_dir(episode_dir) == key


def test_episode_paths_and_keys_agree(tmp_path):
    path = layout.episode_path(tmp_path, "proj/issue-1", 2)
    assert path.relative_to(tmp_path).as_posix() == layout.episode_key("proj/issue-1", 2)
    assert layout.key_of_episode_dir(str(path)) == layout.episode_key("proj/issue-1", 2)


def test_episode_file_names():
    for name in ("log.txt", "attempt-3.log", "log.old.txt", "result.json", "task_error.json"):
        assert layout.is_episode_file(name), name
    for name in ("attempt-x.log", "manifest.json", "../result.json", "log.txt.tmp"):
        assert not layout.is_episode_file(name), name
    assert layout.attempt_of_log(layout.attempt_log(12)) == 12
