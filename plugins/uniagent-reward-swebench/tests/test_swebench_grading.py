"""Grading real pytest logs with swebench's parser and grader."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from uniagent_reward_swebench import EvalSpec, grade
from uniagent_reward_swebench.evalrun import EvalRun, grader_markers, marker, with_exit_status
from uniagent_reward_swebench.rows import r2e_test_name
from uniagent_reward_swebench.scripts import (
    APPLY_PATCH_FAIL,
    END_TEST_OUTPUT,
    START_TEST_OUTPUT,
    TESTS_TIMEOUT,
)

TESTS = """
def test_ok():
    assert True

def test_broken():
    assert 1 == 2

class TestThing:
    def test_inner(self):
        assert True
"""


@pytest.fixture(scope="module")
def pytest_log(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A real `pytest -rA` run between the markers, as an eval script prints it."""
    root = tmp_path_factory.mktemp("graded")
    (root / "test_mod.py").write_text(TESTS)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-rA", "-p", "no:cacheprovider", "test_mod.py"],
        cwd=root,
        capture_output=True,
        text=True,
    )
    return f"+ : '{START_TEST_OUTPUT}'\n{run.stdout}+ : '{END_TEST_OUTPUT}'\n"


def spec(f2p: list[str], p2p: list[str] = (), **kw: object) -> EvalSpec:  # type: ignore[assignment]
    fields: dict[str, object] = {
        "dataset": "swe_bench",
        "instance_id": "t-1",
        "repo": "local/t",
        "fail_to_pass": tuple(f2p),
        "pass_to_pass": tuple(p2p),
        "eval_script": "",
        "log_parser": "parse_log_pytest",
        "eval_type": "pass_and_fail",
        "workdir": "/tmp",
    }
    fields.update(kw)
    return EvalSpec(**fields)  # type: ignore[arg-type]


def test_all_required_tests_passing_is_resolved(pytest_log: str) -> None:
    graded = spec(["test_mod.py::test_ok"], ["test_mod.py::TestThing::test_inner"])
    result = grade(graded, pytest_log)
    assert result["resolved"]
    assert result["resolution_status"] == "RESOLVED_FULL"
    assert result["tests_status"]["FAIL_TO_PASS"] == {
        "success": ["test_mod.py::test_ok"],
        "failure": [],
    }


def test_a_failing_required_test_is_not_resolved(pytest_log: str) -> None:
    result = grade(spec(["test_mod.py::test_broken"], ["test_mod.py::test_ok"]), pytest_log)
    assert not result["resolved"]
    assert result["resolution_status"] == "RESOLVED_NO"
    assert result["tests_status"]["FAIL_TO_PASS"]["failure"] == ["test_mod.py::test_broken"]
    assert result["tests_status"]["PASS_TO_PASS"]["success"] == ["test_mod.py::test_ok"]


def test_a_broken_pass_to_pass_test_is_not_resolved(pytest_log: str) -> None:
    result = grade(spec(["test_mod.py::test_ok"], ["test_mod.py::test_broken"]), pytest_log)
    assert not result["resolved"]
    assert result["tests_status"]["PASS_TO_PASS"]["failure"] == ["test_mod.py::test_broken"]


def test_a_missing_test_counts_as_failed(pytest_log: str) -> None:
    result = grade(spec(["test_mod.py::test_not_there"]), pytest_log)
    assert not result["resolved"]


def test_log_without_markers_is_not_graded(pytest_log: str) -> None:
    log = pytest_log.replace(END_TEST_OUTPUT, "")
    result = grade(spec(["test_mod.py::test_ok"]), log)
    assert not result["resolved"]
    assert not result["test_output_found"]
    assert result["failure_reason"] == "no_test_output_markers"


def test_patch_failure_and_timeout_are_reported(pytest_log: str) -> None:
    failed = grade(spec(["test_mod.py::test_ok"]), APPLY_PATCH_FAIL + "\n")
    assert failed["failure_reason"] == "test_patch_did_not_apply"
    timed_out = grade(spec(["test_mod.py::test_ok"]), pytest_log + TESTS_TIMEOUT + "\n")
    assert not timed_out["resolved"]
    assert timed_out["failure_reason"] == "tests_timed_out"


def test_environment_failures_are_classified() -> None:
    log = f"+ : '{START_TEST_OUTPUT}'\nKilled\n+ : '{END_TEST_OUTPUT}'\n"
    result = grade(spec(["test_mod.py::test_ok"]), log)
    assert result["infra_failure"]
    assert result["infra_failure_reason"] == "out_of_memory"


def test_r2e_exact_match_compares_every_status(pytest_log: str) -> None:
    expected = {"test_ok": "PASSED", "test_broken": "FAILED", "TestThing.test_inner": "PASSED"}
    exact = spec(
        ["test_ok", "TestThing.test_inner"],
        dataset="r2e_gym",
        expected_statuses=expected,
        normalize_test_name=r2e_test_name,
    )
    result = grade(exact, pytest_log)
    assert result["resolved"] and result["exact_match"]

    stricter = spec(
        ["test_ok", "TestThing.test_inner"],
        dataset="r2e_gym",
        expected_statuses=expected | {"test_broken": "PASSED"},
        normalize_test_name=r2e_test_name,
    )
    result = grade(stricter, pytest_log)
    assert result["resolution_status"] == "RESOLVED_FULL"
    assert not result["resolved"]
    assert result["status_mismatches"] == {"test_broken": {"expected": "PASSED", "got": "FAILED"}}


def test_log_parsers_run_on_real_output_of_this_python(pytest_log: str) -> None:
    # Guards the fixture: the summary lines come from the installed pytest.
    assert "PASSED test_mod.py::test_ok" in pytest_log
    assert "FAILED test_mod.py::test_broken" in pytest_log
    assert Path(sys.executable).exists()


# -- the run read by its structure (evalrun) -------------------------------------------------

NONCE = "0123456789abcdef"


def test_the_runners_steps_count_only_before_the_test_region(pytest_log: str) -> None:
    # Everything the tested code prints is after the start line, nonce and all.
    forged = "\n".join(
        [
            marker(NONCE, "workdir-missing"),
            marker(NONCE, "patch-failed"),
            ">>>>> Tests Errored: Cannot allocate memory",
            ">>>>> Patch Apply Failed",
            ">>>>> Test Exit Code: 0",
        ]
    )
    output = f"Checking patch x\n{marker(NONCE, 'tests')}\n{pytest_log}{forged}\n"
    run = EvalRun.read(output, NONCE, exit_code=1, exit_known=True)
    assert run.started and not run.workdir_missing and not run.patch_failed
    log = run.swebench_log()
    assert ">>>>> Tests Errored" not in log and ">>>>> Patch Apply Failed" not in log
    assert log.count(">>>>> Test Exit Code") == 1 and log.endswith(">>>>> Test Exit Code: 1\n")
    result = grade(spec(["test_mod.py::test_ok"]), log)
    # graded on the real results: the forged lines neither mask nor pass
    assert result["test_output_found"] and result["resolved"]
    assert result["failure_reason"] is None
    # ... and are named, for the probing counters (self-masking), the nonce's by its prefix
    assert grader_markers(run.region) == [
        ">>>>> Patch Apply Failed", ">>>>> Tests Errored", ">>>>> Test Exit Code", "@@uniagent-",
    ]  # fmt: skip
    assert grader_markers(pytest_log) == [], "a real runner's output has none"


def test_the_exit_status_comes_from_the_process_not_the_log(pytest_log: str) -> None:
    # A log without failures of the required test, but the test command failed: not graded.
    region = pytest_log.replace("FAILED test_mod.py::test_broken", "") + (
        ">>>>> Test Exit Code: 0\n"
    )
    output = f"{marker(NONCE, 'tests')}\n{region}"
    run = EvalRun.read(output, NONCE, exit_code=1, exit_known=True)
    result = grade(spec(["test_mod.py::test_ok"]), run.swebench_log())
    assert not result["resolved"] and not result["test_output_found"]


def test_runner_failures_before_the_region_are_read_from_their_markers() -> None:
    missing = EvalRun.read(
        f"{marker(NONCE, 'workdir-missing')}\n", NONCE, exit_code=3, exit_known=True
    )
    assert missing.workdir_missing and not missing.started
    failed = EvalRun.read(
        f"error: patch failed\n{marker(NONCE, 'patch-failed')}\n",
        NONCE,
        exit_code=4,
        exit_known=True,
    )
    assert failed.patch_failed
    assert grade(spec(["test_mod.py::test_ok"]), failed.swebench_log())["failure_reason"] == (
        "test_patch_did_not_apply"
    )
    other = EvalRun.read(
        f"{marker('f' * 16, 'workdir-missing')}\n", NONCE, exit_code=3, exit_known=True
    )
    assert not other.workdir_missing  # another nonce: not this runner's


def test_a_parser_that_fails_on_the_test_output_grades_unresolved() -> None:
    # Django's parser fails on a bare "ERROR:" line, which the tested code can print.
    log = f"+ : '{START_TEST_OUTPUT}'\ntest_x (m.T) ... ok\nERROR:\n+ : '{END_TEST_OUTPUT}'\n"
    result = grade(spec(["test_x (m.T)"], log_parser="parse_log_django"), log)
    assert not result["resolved"]
    assert result["failure_reason"] == "log_parser_failed"
    assert "IndexError" in result["parser_error"]


def test_the_eval_script_exits_with_its_test_commands_status() -> None:
    script = f": '{START_TEST_OUTPUT}'\npytest -x\n: '{END_TEST_OUTPUT}'\ngit checkout x t.py\n"
    text, known = with_exit_status(script)
    assert known
    lines = text.splitlines()
    assert lines[-1] == 'exit "$SWEBENCH_TEST_EXIT_CODE"'
    assert lines.index("SWEBENCH_TEST_EXIT_CODE=$?") == lines.index("pytest -x") + 1
    assert with_exit_status("pytest -x\n")[1] is False


#: A row built, its log graded and its eval script made to exit with the tests' status, in a
#: fresh interpreter: what a `uniagent run` process does at its first grading.
GRADE_IN_A_FRESH_PROCESS = """
import json, sys
from uniagent_reward_swebench import SweBenchRewardConfig, build_spec, grade
from uniagent_reward_swebench.evalrun import with_exit_status
from uniagent_reward_swebench.scripts import START_TEST_OUTPUT, END_TEST_OUTPUT
spec = build_spec("swe_bench", json.loads(open(sys.argv[1]).read()), SweBenchRewardConfig())
tests = [*spec.fail_to_pass, *spec.pass_to_pass]
log = "".join(f"PASSED {t}\\n" for t in tests)
log = f"+ : '{START_TEST_OUTPUT}'\\n{log}+ : '{END_TEST_OUTPUT}'\\n"
result = grade(spec, log)
assert with_exit_status(spec.eval_script)[1]
heavy = sorted({m.split(".")[0] for m in sys.modules} & {"pandas", "pyarrow", "datasets", "docker"})
print(json.dumps({"parser": spec.log_parser, "resolved": result["resolved"], "heavy": heavy}))
"""


def test_grading_imports_none_of_swebenchs_docker_and_dataset_modules() -> None:
    row = Path(__file__).parent / "data" / "swe_bench_row.json"
    done = subprocess.run(
        [sys.executable, "-c", GRADE_IN_A_FRESH_PROCESS, str(row)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    # The parser from swebench's map for the repository, the log graded by its grader.
    assert json.loads(done.stdout) == {"parser": "parse_log_pytest", "resolved": True, "heavy": []}


def test_the_eval_script_is_split_as_swebench_splits_it() -> None:
    from swebench.harness.utils import parse_eval_script as swebench_parse
    from uniagent_reward_swebench.harness import parse_eval_script

    for script in (
        "#!/bin/bash\nset -uxo pipefail\ncd /testbed\n: 'start'\npytest -rA\n",
        "\n\n#!/bin/bash\nset -uxo pipefail\n\nsource x\n  set -uxo pipefail\n\n",
        "pytest\n",
        "",
    ):
        assert parse_eval_script(script) == swebench_parse(script), script
