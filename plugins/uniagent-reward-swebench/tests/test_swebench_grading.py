"""Grading real pytest logs with swebench's parser and grader."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from uniagent_reward_swebench import EvalSpec, grade
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
