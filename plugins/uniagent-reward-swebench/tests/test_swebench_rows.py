"""Mapping SWE-bench, SWE-rebench and R2E-Gym rows onto one evaluation spec."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from swebench.harness.log_parsers import PARSER_REGISTRY
from swebench.harness.log_parsers.python import MAP_REPO_TO_PARSER_PY
from uniagent_reward_swebench import (
    R2EGymRewardConfig,
    SweBenchRewardConfig,
    SweRebenchRewardConfig,
    TaskRowError,
    build_spec,
)
from uniagent_reward_swebench.rows import r2e_test_name, rebench_test_name
from uniagent_reward_swebench.scripts import (
    END_TEST_OUTPUT,
    START_TEST_OUTPUT,
    patch_files,
    runner_files,
)

DATA = Path(__file__).parent / "data"


def row(name: str) -> dict[str, Any]:
    return json.loads((DATA / f"{name}_row.json").read_text())


# -- SWE-bench --------------------------------------------------------------------------


def test_swe_bench_row_without_eval_script_gets_one_generated() -> None:
    spec = build_spec("swe_bench", row("swe_bench"), SweBenchRewardConfig())
    assert spec.instance_id == "pallets__flask-90001"
    assert spec.fail_to_pass == ("tests/test_greeting.py::test_greet_empty_name",)
    assert spec.pass_to_pass == ("tests/test_greeting.py::test_greet_plain",)
    assert "cd /testbed" in spec.eval_script
    assert f": '{START_TEST_OUTPUT}'" in spec.eval_script
    assert f": '{END_TEST_OUTPUT}'" in spec.eval_script
    assert "pytest --no-header -rA --tb=no -p no:cacheprovider tests/test_greeting.py" in (
        spec.eval_script
    )
    assert spec.apply_test_patch
    assert spec.eval_type == "pass_and_fail"


def test_swe_bench_parser_comes_from_swebenchs_repo_map() -> None:
    spec = build_spec("swe_bench", row("swe_bench"), SweBenchRewardConfig())
    assert PARSER_REGISTRY[spec.log_parser] is MAP_REPO_TO_PARSER_PY["pallets/flask"]


def test_swe_bench_row_eval_script_and_parser_are_used_as_given() -> None:
    task = row("swe_bench") | {
        "eval_script": "#!/bin/bash\n: '>>>>> Start Test Output'\nmake check\n"
        ": '>>>>> End Test Output'\n",
        "log_parser": "parse_log_pytest_v2",
        "eval_type": "fail_only",
    }
    spec = build_spec("swe_bench", task, SweBenchRewardConfig())
    assert spec.eval_script == task["eval_script"]
    assert spec.log_parser == "parse_log_pytest_v2"
    assert spec.eval_type == "fail_only"
    assert spec.apply_test_patch


def test_eval_script_that_applies_patches_itself_is_not_given_the_test_patch() -> None:
    task = row("swe_bench") | {
        "eval_script": "git apply -v - <<'EOF_1'\n...\nEOF_1\n: '>>>>> Start Test Output'\n",
        "log_parser": "parse_log_pytest",
    }
    assert not build_spec("swe_bench", task, SweBenchRewardConfig()).apply_test_patch
    forced = SweBenchRewardConfig(apply_test_patch="always")
    assert build_spec("swe_bench", task, forced).apply_test_patch


def test_test_lists_may_be_lists_or_json_strings() -> None:
    as_json = build_spec("swe_bench", row("swe_bench"), SweBenchRewardConfig())
    task = row("swe_bench")
    task["FAIL_TO_PASS"] = json.loads(task["FAIL_TO_PASS"])
    task["PASS_TO_PASS"] = json.loads(task["PASS_TO_PASS"])
    as_list = build_spec("swe_bench", task, SweBenchRewardConfig())
    assert as_list.fail_to_pass == as_json.fail_to_pass
    assert as_list.pass_to_pass == as_json.pass_to_pass


def test_django_directives_are_module_labels() -> None:
    task = row("swe_bench") | {
        "repo": "django/django",
        "test_patch": "diff --git a/tests/queries/test_q.py b/tests/queries/test_q.py\n--- a/x\n",
    }
    spec = build_spec("swe_bench", task, SweBenchRewardConfig())
    assert "--settings=test_sqlite --parallel 1 queries.test_q" in spec.eval_script
    assert spec.log_parser == "parse_log_django"


def test_config_test_cmd_and_parser_serve_unknown_repos() -> None:
    task = row("swe_bench") | {"repo": "acme/widgets"}
    config = SweBenchRewardConfig(test_cmd="python -m pytest -rA", log_parser="parse_log_pytest")
    spec = build_spec("swe_bench", task, config)
    assert "python -m pytest -rA tests/test_greeting.py" in spec.eval_script
    assert spec.log_parser == "parse_log_pytest"


def test_workdir_may_name_the_repository() -> None:
    config = SweBenchRewardConfig(workdir="/{repo_name}")
    assert build_spec("swe_bench", row("swe_bench"), config).workdir == "/flask"


# -- malformed rows ---------------------------------------------------------------------


def test_missing_fail_to_pass_names_the_field() -> None:
    task = row("swe_bench")
    del task["FAIL_TO_PASS"]
    with pytest.raises(TaskRowError, match=r"pallets__flask-90001.*has no 'FAIL_TO_PASS'"):
        build_spec("swe_bench", task, SweBenchRewardConfig())


def test_test_list_that_is_not_json_says_so() -> None:
    task = row("swe_bench") | {"PASS_TO_PASS": "[tests/test_greeting.py::test_greet_plain"}
    with pytest.raises(TaskRowError, match="'PASS_TO_PASS' is a string but not valid JSON"):
        build_spec("swe_bench", task, SweBenchRewardConfig())


def test_test_list_of_wrong_type_is_rejected() -> None:
    task = row("swe_bench") | {"FAIL_TO_PASS": {"a": 1}}
    with pytest.raises(TaskRowError, match="must be a list of test names"):
        build_spec("swe_bench", task, SweBenchRewardConfig())


def test_unknown_log_parser_lists_the_known_ones() -> None:
    task = row("swe_bench") | {"log_parser": "parse_log_nose"}
    with pytest.raises(TaskRowError, match=r"unknown log parser 'parse_log_nose'.*parse_log_py"):
        build_spec("swe_bench", task, SweBenchRewardConfig())


def test_unknown_repo_without_test_command_says_what_to_set() -> None:
    task = row("swe_bench") | {"repo": "acme/widgets"}
    with pytest.raises(TaskRowError, match=r"no eval_script and no test command.*test_cmd"):
        build_spec("swe_bench", task, SweBenchRewardConfig())


def test_missing_instance_id_lists_present_keys() -> None:
    task = row("swe_bench")
    del task["instance_id"]
    with pytest.raises(TaskRowError, match=r"has no 'instance_id'.*present keys: FAIL_TO_PASS"):
        build_spec("swe_bench", task, SweBenchRewardConfig())


def test_a_row_must_be_a_mapping() -> None:
    with pytest.raises(TaskRowError, match="must be a mapping, got list"):
        build_spec("swe_bench", [1, 2], SweBenchRewardConfig())  # type: ignore[arg-type]


# -- SWE-rebench ------------------------------------------------------------------------


def test_swe_rebench_uses_install_config() -> None:
    spec = build_spec("swe_rebench", row("swe_rebench"), SweRebenchRewardConfig())
    assert "pytest --no-header -rA --tb=no -p no:cacheprovider tests/test_greeting.py" in (
        spec.eval_script
    )
    assert spec.log_parser == "parse_log_pytest"
    assert "pip install -e ." not in spec.eval_script
    assert spec.normalize_test_name is rebench_test_name


def test_swe_rebench_install_commands_run_when_asked() -> None:
    config = SweRebenchRewardConfig(run_install_commands=True)
    script = build_spec("swe_rebench", row("swe_rebench"), config).eval_script
    assert script.index("pip install -e .") < script.index(START_TEST_OUTPUT)


def test_swe_rebench_install_config_may_be_json() -> None:
    task = row("swe_rebench")
    task["install_config"] = json.dumps(task["install_config"] | {"test_cmd": ["tox -e a", "b"]})
    spec = build_spec("swe_rebench", task, SweRebenchRewardConfig())
    assert "tox -e a tests/test_greeting.py || uniagent_rc=$?" in spec.eval_script
    assert "b tests/test_greeting.py || uniagent_rc=$?" in spec.eval_script


def test_swe_rebench_test_names_lose_timings() -> None:
    assert rebench_test_name("test_foo [1.5ms]") == "test_foo"
    assert rebench_test_name("test_foo in 200 msec") == "test_foo"
    assert rebench_test_name("test_foo (2s)") == "test_foo"
    assert rebench_test_name("test_bar") == "test_bar"


# -- R2E-Gym ----------------------------------------------------------------------------


def test_r2e_gym_expected_passes_become_the_required_tests() -> None:
    spec = build_spec("r2e_gym", row("r2e_gym"), R2EGymRewardConfig())
    assert spec.instance_id.startswith("namanjain12/widgets_final:")
    assert spec.fail_to_pass == (
        "TestGreeting.test_greet_empty_name",
        "TestGreeting.test_greet_plain",
    )
    assert spec.pass_to_pass == ()
    assert spec.expected_statuses == {
        "TestGreeting.test_greet_plain": "PASSED",
        "TestGreeting.test_greet_empty_name": "PASSED",
        "TestGreeting.test_greet_unicode": "FAILED",
    }
    assert "run_tests.sh" in spec.eval_script
    assert spec.log_parser == "parse_log_pytest"
    assert not spec.apply_test_patch


def test_r2e_gym_without_exact_match_ignores_other_statuses() -> None:
    spec = build_spec("r2e_gym", row("r2e_gym"), R2EGymRewardConfig(exact_match=False))
    assert spec.expected_statuses is None


def test_r2e_gym_row_needs_expected_output() -> None:
    task = row("r2e_gym")
    del task["expected_output_json"]
    with pytest.raises(TaskRowError, match="needs expected_output_json"):
        build_spec("r2e_gym", task, R2EGymRewardConfig())


def test_r2e_test_names_follow_r2e_gyms_parser() -> None:
    assert r2e_test_name("r2e_tests/test_1.py::TestA::test_b") == "TestA.test_b"
    assert r2e_test_name("r2e_tests/test_1.py::test_c - AssertionError") == "test_c"
    assert r2e_test_name("\x1b[32mTestA.test_b\x1b[0m") == "TestA.test_b"


# -- patches ----------------------------------------------------------------------------


def test_patch_files_flags_created_files() -> None:
    patch = (
        "diff --git a/a.py b/a.py\n--- a/a.py\n+++ b/a.py\n@@ -1 +1 @@\n-x\n+y\n"
        "diff --git a/t/new.py b/t/new.py\nnew file mode 100644\n--- /dev/null\n+++ b/t/new.py\n"
    )
    files = patch_files(patch)
    assert [(f.path, f.created) for f in files] == [("a.py", False), ("t/new.py", True)]


def test_the_runner_files_a_test_command_runs_from_the_repository():
    commands = [
        "./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1 queries",
        "PYTHONWARNINGS='ignore::UserWarning' bin/test -C --verbose sympy/core/tests/x.py",
        "python -W ignore tests/run.py -x  # a comment",
        "/testbed/scripts/check.py --fast",
        "bash ./run_tests.sh",
        "pytest -rA tests/test_x.py",  # on PATH
        "python -m pytest tests",  # a module
        "python3 -c 'import t'",
        "/usr/bin/python3 ../outside.py",  # not in the repository
        "/other/place/run.py",
        "./tests/runtests.py again",  # named once
        "python3 runtests.py -v",  # a file beside the tests, run by the interpreter
        "python ..",
    ]
    assert runner_files(commands, "/testbed") == [
        "tests/runtests.py", "bin/test", "tests/run.py", "scripts/check.py", "run_tests.sh",
        "runtests.py",
    ]  # fmt: skip
    assert runner_files(["/testbed/run.py"], None) == []  # no work dir: only relative ones
