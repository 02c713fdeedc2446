"""The status recorder (uniagent.grading.statuses): the test runner's own word on its run.

The recorder runs in real interpreters (pytest and unittest in subprocesses of this
venv's Python), and the ``command`` reward uses it end to end in a real host sandbox:
a test run the tested code ends early with status 0 does not pass.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from uniagent import open_env
from uniagent.env import AgentEnv
from uniagent.grading.statuses import HOOK, StatusRecords, keep_recorder
from uniagent.testing.grading import grade, prepare_grader

TESTS = """import os
import subprocess
import sys
import unittest

import pytest


def test_passes():
    assert "uniagent" not in os.environ.get("PYTHONPATH", "")
    assert "UNIAGENT_STATUS_FILE" not in os.environ


def test_a_child_python_is_not_recorded():
    code = "import sitecustomize; print(sitecustomize.ENV)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout
    assert out == "env-site\\n"  # the environment's own, and no recorder in the child


def test_fails():
    assert 0


def test_expected_by_itself():
    pytest.xfail("from inside the test")


def test_expected_by_the_code_under_test():
    from helper import give_up

    give_up()


@pytest.mark.xfail(reason="declared")
def test_declared():
    assert 0


class Case(unittest.TestCase):
    def test_in_a_case(self):
        pass
"""


def run_recorded(tmp_path: Path, *argv: str) -> StatusRecords:
    """``argv`` under the recorder (as a reward's command runs), with an environment of its
    own ``sitecustomize``; the records it left."""
    hook, record, site = tmp_path / "uniagent-hook", tmp_path / "record.jsonl", tmp_path / "site"
    hook.mkdir()
    site.mkdir()
    (hook / "sitecustomize.py").write_text(HOOK)
    (site / "sitecustomize.py").write_text("ENV = 'env-site'\n")
    record.write_text("")
    env = {
        **os.environ,
        # twice, as after an eval script's own export (the recorder put first again)
        "PYTHONPATH": os.pathsep.join([str(hook), str(hook), str(site)]),
        "UNIAGENT_STATUS_FILE": str(record),
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
    }
    subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, check=False, timeout=120)
    return StatusRecords.parse(record.read_text())


def test_pytest_reports_reach_the_record_and_nothing_else_sees_the_recorder(tmp_path):
    (tmp_path / "test_it.py").write_text(TESTS)
    (tmp_path / "helper.py").write_text(
        "import pytest\n\n\ndef give_up():\n    pytest.xfail('x')\n"
    )
    records = run_recorded(tmp_path, sys.executable, "-m", "pytest", "-p", "no:cacheprovider")
    assert records.sessions == {"pytest"} and records.unfinished() == []
    lines = set(records.log("pytest").splitlines())
    assert lines == {
        "PASSED test_it.py::test_passes",
        "PASSED test_it.py::test_a_child_python_is_not_recorded",
        "FAILED test_it.py::test_fails",
        "XFAIL test_it.py::test_expected_by_itself",
        "XFAIL test_it.py::test_expected_by_the_code_under_test",
        "XFAIL test_it.py::test_declared",
        "PASSED test_it.py::Case::test_in_a_case",  # pytest's own result, not unittest's
    }
    # Declared: by a marker, or by the test's own pytest.xfail(); not by the code it tests.
    assert (
        records.undeclared_xfail_log() == "XFAIL test_it.py::test_expected_by_the_code_under_test"
    )
    assert records.malformed == 0


def test_unittest_results_reach_the_record_with_their_descriptions(tmp_path):
    (tmp_path / "test_unit.py").write_text(
        "import unittest\n\n\nclass T(unittest.TestCase):\n"
        "    def test_ok(self):\n        'Its docstring.'\n\n"
        "    def test_sub(self):\n        for i in range(2):\n"
        "            with self.subTest(i=i):\n                self.assertEqual(i, 0)\n"
    )
    records = run_recorded(tmp_path, sys.executable, "-m", "unittest", "-v", "test_unit")
    assert records.sessions == {"unittest"} and records.unfinished() == []
    name = "test_unit.T.{}" if sys.version_info >= (3, 11) else "test_unit.T"
    assert records.log("unittest").splitlines() == [
        f"test_ok ({name.format('test_ok')})",
        "Its docstring. ... ok",
        f"test_sub ({name.format('test_sub')}) ... FAIL",  # a failed subtest fails its test
    ]


def test_a_run_the_interpreter_leaves_in_the_middle_is_unfinished(tmp_path):
    (tmp_path / "test_leave.py").write_text(
        "import os\n\n\ndef test_leave():\n    getattr(os, '_ex' + 'it')(0)\n"
    )
    records = run_recorded(tmp_path, sys.executable, "-m", "pytest", "-p", "no:cacheprovider")
    assert records.unfinished() == ["pytest"]


#: A module of the repository named like one of the standard library's that pytest imports
#: once it runs (after the repository is first on sys.path): it loads the real one and
#: could do anything else before the first test.
SHIM = """import importlib.machinery
import importlib.util
import os
import sys

_here = os.path.dirname(os.path.abspath(__file__))
_path = [p for p in sys.path if os.path.abspath(p or ".") != _here]
_spec = importlib.machinery.PathFinder.find_spec("shlex", _path)
_real = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_real)
globals().update({k: v for k, v in vars(_real).items() if not k.startswith("__")})
"""


def test_a_module_that_shadows_the_standard_library_is_recorded(tmp_path):
    (tmp_path / "shlex.py").write_text(SHIM)
    (tmp_path / "json.py").write_text("from json import *  # noqa\n")  # loaded before: never
    (tmp_path / "test_it.py").write_text("def test_it():\n    pass\n")
    records = run_recorded(tmp_path, sys.executable, "-m", "pytest", "-p", "no:cacheprovider")
    assert records.log("pytest") == "PASSED test_it.py::test_it"
    assert records.shadows == {("shlex", str(tmp_path / "shlex.py"))}


@pytest.mark.parametrize(
    ("phases", "word"),
    [
        ({"setup": "passed", "call": "passed", "teardown": "passed"}, "PASSED"),
        ({"setup": "passed", "call": "failed", "teardown": "passed"}, "FAILED"),
        ({"setup": "failed", "teardown": "passed"}, "ERROR"),
        ({"setup": "skipped", "teardown": "passed"}, "SKIPPED"),
        # -rA prints PASSED and ERROR lines for it, in a version's order: as the call ended.
        ({"setup": "passed", "call": "passed", "teardown": "failed"}, "PASSED"),
        ({"setup": "passed"}, "ERROR"),  # never reported as run (the process left)
    ],
)
def test_a_tests_word_is_its_calls(phases, word):
    lines = [
        f'{{"f": "pytest", "id": "t.py::a", "when": "{when}", "o": "{o}", "xfail": false}}'
        for when, o in phases.items()
    ]
    assert StatusRecords.parse("\n".join(lines)).log("pytest") == f"{word} t.py::a"


def test_records_that_are_not_records_are_counted_not_trusted():
    records = StatusRecords.parse('{"f": "pytest", "session": true}\nnoise\n{"f": "other"}\n[1]\n')
    assert records.sessions == {"pytest"} and records.malformed == 3


# -- the command reward, end to end ------------------------------------------------------------
BUGGY = "def add(a, b):\n    return a - b\n"
FIXED = "def add(a, b):\n    return a + b\n"
#: The tested code ends the interpreter with status 0 in the middle of the run (the exit
#: looked up by name: the patch screen's exit-hijack rule reads the literal call).
LEAVES = "import os\n\n\ndef add(a, b):\n    getattr(os, '_ex' + 'it')(0)\n"
UNIT = (
    "import unittest\nfrom calc import add\n\n\nclass T(unittest.TestCase):\n"
    "    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n"
)
SETUP = (
    "git init -q && git config user.email t@t && git config user.name t && "
    f"printf %s {shlex.quote(BUGGY)} > calc.py && printf %s {shlex.quote(UNIT)} > "
    "test_calc.py && git add -A && git commit -qm base"
)
COMMAND = "python3 -m unittest test_calc"


@pytest.fixture
async def env() -> AsyncIterator[AgentEnv]:
    async with open_env({"type": "host", "isolation": "none"}, {"post_setup": [SETUP]}) as sandbox:
        yield sandbox


async def graded_with(env: AgentEnv, calc: str, **settings: object):
    grader = await prepare_grader(env, "command", {}, settings={"command": COMMAND, **settings})
    await env.write_file(f"{env.workdir}/calc.py", calc)
    return await grade(grader, env)


@pytest.mark.asyncio
async def test_the_command_reward_passes_a_fix_its_runner_saw_through(env):
    result = await graded_with(env, FIXED)
    assert result.score == 1.0, result.info["output_tail"]
    assert result.info["status_channel"] == "compared"


@pytest.mark.asyncio
async def test_a_test_run_ended_early_with_status_zero_does_not_pass(env):
    result = await graded_with(env, LEAVES)
    assert result.info["exit_code"] == 0  # the exit status alone would pass it
    assert result.score == 0.0
    assert result.info["score_reason"] == "tampered"
    assert [(t["kind"], t["rule"], t["path"]) for t in result.info["tampered"]] == [
        ("verdict", "runner-unfinished", "unittest")
    ]


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "command",
    [f"export PYTHONPATH=.; {COMMAND}", f"cd . && export PYTHONPATH=. && {COMMAND}",
     f"export PYTHONPATH=.\n{COMMAND}"],
    ids=["semicolon", "and", "line"],
)  # fmt: skip
async def test_a_command_that_sets_its_own_pythonpath_keeps_the_recorder(env, command):
    # Its own `export PYTHONPATH=...` would start the tests' Python without the recorder.
    fixed = await graded_with(env, FIXED, command=command)
    assert fixed.score == 1.0 and fixed.info["status_channel"] == "compared", fixed.info
    left = await graded_with(env, LEAVES, command=command)
    assert left.info["exit_code"] == 0 and left.score == 0.0, left.info
    assert [t["rule"] for t in left.info["tampered"]] == ["runner-unfinished"]


@pytest.mark.parametrize(
    ("script", "seen"),
    [
        ('export PYTHONPATH=/a; echo "$PYTHONPATH"', "{hook}:/a"),
        ('cd / && export PYTHONPATH="a;b" && echo "$PYTHONPATH"', "{hook}:a;b"),
        ('(export PYTHONPATH=/d; echo "$PYTHONPATH")', "{hook}:/d"),
        ('export PYTHONPATH=/j OTHER=1; echo "$PYTHONPATH"', "{hook}:/j"),
        # left as they are: a command's own prefix, after || or in a quoted command
        ("PYTHONPATH=/b sh -c 'echo $PYTHONPATH'", "/b"),
        ('false || export PYTHONPATH=/c; echo "$PYTHONPATH"', "/c"),
        ('sh -c "export PYTHONPATH=/e; echo \\$PYTHONPATH"', "/e"),
        ('# export PYTHONPATH=/f\necho "$PYTHONPATH"', "{hook}"),
        ('echo export PYTHONPATH=/g >/dev/null; echo "$PYTHONPATH"', "{hook}"),
        # a here-document's body is not a command (a test patch's lines, say)
        (
            "cat <<'EOF'\nexport PYTHONPATH=/x; y\nEOF\nexport PYTHONPATH=/z\necho \"$PYTHONPATH\"",
            "export PYTHONPATH=/x; y\n{hook}:/z",
        ),
        (
            'cat<<-EOF\n\t export PYTHONPATH=/x\n\tEOF\necho "$PYTHONPATH"',
            " export PYTHONPATH=/x\n{hook}",
        ),
    ],
)
def test_the_recorder_is_put_first_again_after_each_export_of_pythonpath(tmp_path, script, seen):
    hook = str(tmp_path / "hook dir")
    kept = keep_recorder(script, hook)
    out = subprocess.run(
        ["bash", "-c", kept], env={"PATH": "/usr/bin:/bin", "PYTHONPATH": hook},
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert out == seen.format(hook=hook) + "\n", kept


PYTEST = f"PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 {sys.executable} -m pytest -q -p no:cacheprovider"


@pytest.mark.asyncio
async def test_a_module_of_the_agents_that_shadows_the_standard_library_does_not_pass(env):
    grader = await prepare_grader(env, "command", {}, settings={"command": PYTEST})
    await env.write_file(f"{env.workdir}/calc.py", FIXED)
    await env.write_file(f"{env.workdir}/shlex.py", SHIM)
    result = await grade(grader, env)
    assert result.info["exit_code"] == 0
    assert result.score == 0.0
    assert [(t["rule"], t["path"]) for t in result.info["tampered"]] == [
        ("module-shadow", "shlex.py")
    ]


@pytest.mark.asyncio
async def test_a_shadowing_module_the_repository_holds_at_its_base_is_its_own(env):
    await env.write_file(f"{env.workdir}/shlex.py", SHIM)
    await env.run_action("git add shlex.py && git commit -qm 'its own shlex'", timeout=30)
    grader = await prepare_grader(env, "command", {}, settings={"command": PYTEST})
    await env.write_file(f"{env.workdir}/calc.py", FIXED)
    result = await grade(grader, env)
    assert result.score == 1.0, result.info
    assert "tampered" not in result.info


@pytest.mark.asyncio
async def test_without_the_channel_the_exit_status_alone_decides(env):
    result = await graded_with(env, LEAVES, status_channel=False)
    assert result.score == 1.0  # what the channel is for
    assert "status_channel" not in result.info
