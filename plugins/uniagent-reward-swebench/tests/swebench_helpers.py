"""A tiny buggy git repository and task rows for it in each dataset's schema."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: The sandbox shares this machine's Python; plugins of this venv stay out of the graded run.
PYTEST = f"PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 {sys.executable} -m pytest -rA -p no:cacheprovider"

BUGGY = "def add(a, b):\n    return a - b\n\n\ndef sub(a, b):\n    return a - b\n"
FIXED = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n"
BASE_TESTS = "from calc import sub\n\n\ndef test_sub():\n    assert sub(5, 3) == 2\n"
PATCHED_TESTS = BASE_TESTS.replace("import sub", "import add, sub") + (
    "\n\ndef test_add():\n    assert add(2, 3) == 5\n"
)
NEW_TESTS = "from calc import add\n\n\ndef test_add_many():\n    assert add(add(1, 2), 3) == 6\n"
R2E_TESTS = """from calc import add, sub


class TestCalc:
    def test_add(self):
        assert add(2, 3) == 5

    def test_sub(self):
        assert sub(5, 3) == 2

    def test_known_failure(self):
        assert add(0.1, 0.2) == 0.3
"""


def git(cwd: Path, *args: str) -> str:
    """Run git with a fixed identity; return its stdout."""
    return subprocess.run(
        ["git", "-c", "user.name=uniagent", "-c", "user.email=uniagent@example.com", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
        text=True,
    ).stdout


@dataclass
class CalcRepo:
    """The repository, its base commit and the SWE-bench test patch for it."""

    path: Path
    base_commit: str
    test_patch: str

    def status(self) -> str:
        """``git status --porcelain``: what differs from the base commit."""
        return git(self.path, "status", "--porcelain")


def make_repo(repo: Path, base: dict[str, str], patched: dict[str, str]) -> CalcRepo:
    """A repository of ``base`` files at its base commit; its test patch writes ``patched``."""
    repo.mkdir(parents=True)
    git(repo, "init", "-q")
    write(repo, base)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "base")
    commit = git(repo, "rev-parse", "HEAD").strip()
    write(repo, patched)
    git(repo, "add", "-A")
    patch = git(repo, "diff", "--cached")
    git(repo, "reset", "-q", "--hard", commit)
    return CalcRepo(path=repo, base_commit=commit, test_patch=patch)


def write(repo: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)


def make_calc_repo(tmp_path: Path) -> CalcRepo:
    """A repository where ``add`` subtracts; its test patch adds tests (one in a new file)."""
    base = {
        "calc.py": BUGGY,
        "test_calc.py": BASE_TESTS,
        "r2e_tests/test_1.py": R2E_TESTS,
        "run_tests.sh": f"{PYTEST} r2e_tests\n",
    }
    patched = {"test_calc.py": PATCHED_TESTS, "test_more.py": NEW_TESTS}
    return make_repo(tmp_path / "calc", base, patched)


def swe_bench_row(repo: CalcRepo) -> dict[str, Any]:
    """A SWE-bench row (5.x style: its own eval_script and log_parser) for the repo."""
    eval_script = "\n".join(
        [
            "#!/bin/bash",
            "set -uxo pipefail",
            f"cd {repo.path}",
            ": '>>>>> Start Test Output'",
            f"{PYTEST} test_calc.py test_more.py",
            ": '>>>>> End Test Output'",
        ]
    )
    return {
        "instance_id": "local__calc-1",
        "repo": "local/calc",
        "base_commit": repo.base_commit,
        "patch": "",
        "test_patch": repo.test_patch,
        "problem_statement": "add() subtracts.",
        "version": "0.1",
        "FAIL_TO_PASS": json.dumps(["test_calc.py::test_add", "test_more.py::test_add_many"]),
        "PASS_TO_PASS": json.dumps(["test_calc.py::test_sub"]),
        "eval_script": eval_script,
        "log_parser": "parse_log_pytest",
        "eval_type": "pass_and_fail",
    }


def swe_bench_full_script_row(repo: CalcRepo) -> dict[str, Any]:
    """A row whose eval_script is shaped like swebench's: it resets and applies the test patch."""
    base = repo.base_commit
    eval_script = "\n".join(
        [
            "#!/bin/bash",
            "set -uxo pipefail",
            f"cd {repo.path}",
            "git status",
            f"git -c core.fileMode=false diff {base}",
            f"git checkout {base} test_calc.py",
            "git apply -v - <<'EOF_114329324912'",
            repo.test_patch.rstrip("\n"),
            "EOF_114329324912",
            ": '>>>>> Start Test Output'",
            f"{PYTEST} test_calc.py test_more.py",
            ": '>>>>> End Test Output'",
            f"git checkout {base} test_calc.py",
        ]
    )
    return swe_bench_row(repo) | {"instance_id": "local__calc-3", "eval_script": eval_script}


def swe_rebench_row(repo: CalcRepo) -> dict[str, Any]:
    """A SWE-rebench row: no eval_script; the test command comes from install_config."""
    return {
        "instance_id": "local__calc-2",
        "repo": "local/calc",
        "base_commit": repo.base_commit,
        "test_patch": repo.test_patch,
        "FAIL_TO_PASS": ["test_calc.py::test_add", "test_more.py::test_add_many"],
        "PASS_TO_PASS": ["test_calc.py::test_sub"],
        "install_config": {"test_cmd": PYTEST, "log_parser": "parse_log_pytest"},
    }


def r2e_gym_row() -> dict[str, Any]:
    """An R2E-Gym row: the expected status of every test in r2e_tests/."""
    return {
        "repo_name": "calc",
        "docker_image": "namanjain12/calc_final:0123abc",
        "commit_hash": "0123abc",
        "expected_output_json": json.dumps(
            {
                "TestCalc.test_add": "PASSED",
                "TestCalc.test_sub": "PASSED",
                "TestCalc.test_known_failure": "FAILED",
            }
        ),
    }


#: A repository whose test runner lives in it, as Django's tests/runtests.py does: unittest's
#: verbose lines, graded with swebench's Django parser.
RUNTESTS = """import os
import sys
import unittest

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(here))
suite = unittest.defaultTestLoader.discover(here, pattern="test_*.py", top_level_dir=here)
result = unittest.TextTestRunner(verbosity=2).run(suite)
sys.exit(not result.wasSuccessful())
"""
DJANGO_BASE_TESTS = """import unittest

from calc import sub


class CalcTests(unittest.TestCase):
    def test_sub(self):
        self.assertEqual(sub(5, 3), 2)
"""
DJANGO_PATCHED_TESTS = (
    DJANGO_BASE_TESTS.replace("import sub", "import add, sub")
    + """
    def test_add(self):
        self.assertEqual(add(2, 3), 5)
"""
)


def unittest_name(method: str) -> str:
    """How this Python's unittest (and so Django's parser) names a test of CalcTests."""
    where = "test_calc.CalcTests" + (f".{method}" if sys.version_info >= (3, 11) else "")
    return f"{method} ({where})"


def make_django_repo(tmp_path: Path) -> CalcRepo:
    """The buggy calc module with its tests under tests/, run by tests/runtests.py."""
    base = {
        "calc.py": BUGGY,
        "tests/runtests.py": RUNTESTS,
        "tests/test_calc.py": DJANGO_BASE_TESTS,
    }
    return make_repo(tmp_path / "djcalc", base, {"tests/test_calc.py": DJANGO_PATCHED_TESTS})


def django_row(repo: CalcRepo) -> dict[str, Any]:
    """A SWE-bench row for the Django-layout repository (Django's parser)."""
    eval_script = "\n".join(
        [
            "#!/bin/bash",
            "set -uxo pipefail",
            f"cd {repo.path}",
            ": '>>>>> Start Test Output'",
            f"{sys.executable} tests/runtests.py",
            ": '>>>>> End Test Output'",
        ]
    )
    return swe_bench_row(repo) | {
        "instance_id": "local__djcalc-1",
        "repo": "local/djcalc",
        "FAIL_TO_PASS": json.dumps([unittest_name("test_add")]),
        "PASS_TO_PASS": json.dumps([unittest_name("test_sub")]),
        "eval_script": eval_script,
        "log_parser": "parse_log_django",
    }
