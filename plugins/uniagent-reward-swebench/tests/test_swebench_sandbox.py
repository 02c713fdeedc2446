"""The rewards end to end, in a real host sandbox holding a small buggy repository.

Each test grades the way an episode does: the grader's baseline is taken first
(before "the agent" acts), then the reward runs in a clean grading shell.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from swebench_helpers import (
    FIXED,
    PYTEST,
    CalcRepo,
    r2e_gym_row,
    swe_bench_full_script_row,
    swe_bench_row,
    swe_rebench_row,
)
from uniagent_reward_swebench import TaskRowError

from uniagent import GradingSetupError
from uniagent.testing import EpisodeGrader, Grade, grade, prepare_grader

_GRADERS: dict[int, EpisodeGrader] = {}


async def score(
    name: str,
    env: Any,
    task: dict[str, Any],
    integrity: dict[str, Any] | None = None,
    **config: Any,
) -> Grade:
    """Grade ``env`` with reward ``name``; the baseline is taken on the first call per env."""
    grader = _GRADERS.get(id(env))
    if grader is None:
        grader = _GRADERS[id(env)] = await prepare_grader(
            env, name, task, settings=config, integrity=integrity
        )
    return await grade(grader, env)


async def baseline(name: str, env: Any, task: dict[str, Any], **config: Any) -> None:
    """Take the grader's baseline now (before the agent's edits)."""
    _GRADERS[id(env)] = await prepare_grader(env, name, task, settings=config)


async def fix_the_bug(env: Any, repo: CalcRepo) -> None:
    """What the agent would do: edit the module inside the sandbox."""
    await env.write_file(str(repo.path / "calc.py"), FIXED)


async def test_swe_bench_scores_zero_before_and_one_after_the_fix(host_env, calc_repo) -> None:
    task = swe_bench_row(calc_repo)
    before = await score("swe_bench", host_env, task, workdir=str(calc_repo.path))
    assert before.score == 0.0
    assert before.info["resolution_status"] == "RESOLVED_NO"
    assert sorted(before.info["tests_status"]["FAIL_TO_PASS"]["failure"]) == [
        "test_calc.py::test_add",
        "test_more.py::test_add_many",
    ]
    assert before.info["tests_status"]["PASS_TO_PASS"]["success"] == ["test_calc.py::test_sub"]
    assert before.info["test_patch_applied"] is True

    await fix_the_bug(host_env, calc_repo)
    after = await score("swe_bench", host_env, task, workdir=str(calc_repo.path))
    assert after.score == 1.0
    assert after.info["resolved"]
    assert after.info["resolution_status"] == "RESOLVED_FULL"
    assert sorted(after.info["tests_status"]["FAIL_TO_PASS"]["success"]) == [
        "test_calc.py::test_add",
        "test_more.py::test_add_many",
    ]
    assert "PASSED test_calc.py::test_add" in after.info["log_tail"]


async def test_evaluation_leaves_the_tree_as_it_found_it(host_env, calc_repo) -> None:
    await baseline("swe_bench", host_env, swe_bench_row(calc_repo), workdir=str(calc_repo.path))
    await fix_the_bug(host_env, calc_repo)
    await score("swe_bench", host_env, swe_bench_row(calc_repo), workdir=str(calc_repo.path))
    # Only the agent's change remains: the test patch is gone, its new file removed.
    assert calc_repo.status().split() == ["M", "calc.py"]


async def test_agent_edits_to_test_files_do_not_count(host_env, calc_repo) -> None:
    # A policy that "fixes" the test instead of the code gains nothing: the test patch's
    # files are the benchmark's, restored from the base before grading.
    task = swe_bench_row(calc_repo)
    await baseline("swe_bench", host_env, task, workdir=str(calc_repo.path))
    await host_env.write_file(
        str(calc_repo.path / "test_calc.py"), "def test_sub():\n    assert True\n"
    )
    result = await score("swe_bench", host_env, task, workdir=str(calc_repo.path))
    assert result.score == 0.0
    assert result.info["score_reason"] == "tampered"
    assert result.info["integrity"]["tampered"] == [
        {
            "kind": "protected_file",
            "path": "test_calc.py",
            "change": "modified",
            "rule": "task-paths",
        }
    ]


async def test_with_tampering_only_reported_the_test_files_are_still_restored(
    host_env, calc_repo
) -> None:
    task = swe_bench_row(calc_repo)
    _GRADERS[id(host_env)] = await prepare_grader(
        host_env,
        "swe_bench",
        task,
        settings={"workdir": str(calc_repo.path)},
        integrity={"on_tamper": "report"},
    )
    await host_env.write_file(
        str(calc_repo.path / "test_calc.py"), "def test_sub():\n    assert True\n"
    )
    await fix_the_bug(host_env, calc_repo)
    result = await score("swe_bench", host_env, task)
    assert result.score == 1.0  # graded on the benchmark's tests, which pass with the fix
    assert result.info["test_patch_applied"] is True
    assert [t["path"] for t in result.info["integrity"]["tampered"]] == ["test_calc.py"]


@pytest.mark.parametrize("protect_runner", [True, False])
async def test_the_repositorys_own_runner_is_the_benchmarks(
    host_env, calc_repo, protect_runner
) -> None:
    """A test command that runs a file of the repository (Django's tests/runtests.py) is
    read before any parser: that file is protected unless ``protect_runner`` is off."""
    task = swe_bench_row(calc_repo)
    tests = f"{PYTEST} test_calc.py test_more.py"
    task["eval_script"] = task["eval_script"].replace(tests, "bash ./run_tests.sh")
    config = {"workdir": str(calc_repo.path), "protect_runner": protect_runner}
    await baseline("swe_bench", host_env, task, **config)
    ids = ("test_calc.py::test_add", "test_more.py::test_add_many", "test_calc.py::test_sub")
    fake = f'p=PASS; printf "${{p}}ED %s\\n" {" ".join(ids)}\n'  # past the content rules
    await host_env.write_file(str(calc_repo.path / "run_tests.sh"), fake)
    result = await score("swe_bench", host_env, task, **config)
    if protect_runner:
        assert result.score == 0.0 and result.info["score_reason"] == "tampered"
        tampered = {(t["path"], t["rule"]) for t in result.info["integrity"]["tampered"]}
        assert tampered == {("run_tests.sh", "task-paths")}
    else:  # what the switch gives up: the edited runner reports what it likes
        assert result.score == 1.0, result.info


async def test_swebench_shaped_eval_script_applies_the_test_patch_itself(
    host_env, calc_repo
) -> None:
    task = swe_bench_full_script_row(calc_repo)
    await baseline("swe_bench", host_env, task, workdir=str(calc_repo.path))
    await fix_the_bug(host_env, calc_repo)
    result = await score("swe_bench", host_env, task, workdir=str(calc_repo.path))
    assert result.info["test_patch_applied"] is None  # left to the script
    assert result.score == 1.0
    assert "Applied patch test_calc.py cleanly" in result.info["log_tail"]


async def test_swe_rebench_generates_the_eval_script(host_env, calc_repo) -> None:
    task = swe_rebench_row(calc_repo)
    before = await score("swe_rebench", host_env, task, workdir=str(calc_repo.path))
    assert before.score == 0.0
    await fix_the_bug(host_env, calc_repo)
    after = await score("swe_rebench", host_env, task, workdir=str(calc_repo.path))
    assert after.score == 1.0
    assert after.info["dataset"] == "swe_rebench"


async def test_r2e_gym_runs_the_images_run_tests_script(host_env, calc_repo) -> None:
    if Path("/root/run_tests.sh").exists():
        pytest.skip("/root/run_tests.sh exists here and would be run instead of the repo's")
    before = await score("r2e_gym", host_env, r2e_gym_row(), workdir=str(calc_repo.path))
    assert before.score == 0.0
    assert before.info["status_mismatches"] == {
        "TestCalc.test_add": {"expected": "PASSED", "got": "FAILED"}
    }
    await fix_the_bug(host_env, calc_repo)
    after = await score("r2e_gym", host_env, r2e_gym_row(), workdir=str(calc_repo.path))
    assert after.score == 1.0
    assert after.info["exact_match"]


async def test_malformed_row_raises_a_clear_error_before_the_episode(host_env, calc_repo) -> None:
    task = swe_bench_row(calc_repo)
    del task["FAIL_TO_PASS"]
    with pytest.raises(TaskRowError, match=r"local__calc-1.*has no 'FAIL_TO_PASS'"):
        await prepare_grader(host_env, "swe_bench", task, settings={"workdir": str(calc_repo.path)})


async def test_missing_workdir_is_an_infrastructure_error_before_the_episode(
    host_env, calc_repo
) -> None:
    task = swe_rebench_row(calc_repo)
    with pytest.raises(GradingSetupError, match="'/no/such/testbed', does not exist"):
        await prepare_grader(
            host_env, "swe_rebench", task, settings={"workdir": "/no/such/testbed"}
        )


async def test_tests_running_past_the_timeout_score_zero(host_env, calc_repo) -> None:
    await baseline(
        "swe_bench", host_env, swe_bench_row(calc_repo), workdir=str(calc_repo.path), eval_timeout=3
    )
    await host_env.write_file(
        str(calc_repo.path / "calc.py"),
        "import time\n\n\ndef add(a, b):\n    time.sleep(60)\n    return a + b\n\n\n"
        "def sub(a, b):\n    return a - b\n",
    )
    result = await score(
        "swe_bench",
        host_env,
        swe_bench_row(calc_repo),
        workdir=str(calc_repo.path),
        eval_timeout=3,
    )
    assert result.score == 0.0
    assert result.info["failure_reason"] == "tests_timed_out"
    assert calc_repo.status().split() == ["M", "calc.py"]


async def test_test_patch_that_does_not_apply_scores_zero(host_env, calc_repo) -> None:
    task = swe_bench_row(calc_repo)
    task["test_patch"] = task["test_patch"].replace("assert sub(5, 3) == 2", "assert sub(9, 9)")
    result = await score("swe_bench", host_env, task, workdir=str(calc_repo.path))
    assert result.score == 0.0
    assert result.info["test_patch_applied"] is False
    assert result.info["failure_reason"] == "test_patch_did_not_apply"


async def test_r2e_gym_tests_outside_the_repo_are_put_back_before_grading(
    host_env, calc_repo, tmp_path
) -> None:
    # R2E-Gym's set-up moves run_tests.sh and r2e_tests to /root, out of the repository.
    outside = tmp_path / "root"
    outside.mkdir()
    (calc_repo.path / "r2e_tests").rename(outside / "r2e_tests")
    script = outside / "run_tests.sh"
    script.write_text(f"cd {calc_repo.path} && {PYTEST} {outside / 'r2e_tests'}\n")
    settings = {"workdir": str(calc_repo.path), "test_cmd": f"bash {script}",
                "protect_outside": [str(script), str(outside / "r2e_tests")]}  # fmt: skip
    _GRADERS[id(host_env)] = await prepare_grader(
        host_env, "r2e_gym", r2e_gym_row(), settings=settings
    )
    fake = "echo 'PASSED r2e_tests/test_1.py::TestCalc::test_add'"
    await host_env.write_file(str(script), fake + "\n")
    await host_env.write_file(str(outside / "r2e_tests" / "test_2.py"), "x = 1\n")
    result = await score("r2e_gym", host_env, r2e_gym_row())
    assert result.score == 0.0 and result.info["score_reason"] == "tampered"
    assert {(t["path"], t["change"], t["rule"]) for t in result.info["integrity"]["tampered"]} == {
        (str(script), "modified", "outside-paths"),
        (str(outside / "r2e_tests" / "test_2.py"), "added", "outside-paths"),
    }
    assert script.read_text().startswith("cd ")
    assert not (outside / "r2e_tests" / "test_2.py").exists()


def test_the_swe_rewards_grade_in_a_fresh_sandbox_by_default() -> None:
    from uniagent import AgentConfig, resolve

    for name, expected in (("swe_bench", "fresh"), ("r2e_gym", "fresh"), ("command", "episode")):
        agent = resolve(AgentConfig.model_validate({"reward": {"name": name}}))
        assert agent.reward is not None and agent.reward.grade_in == expected, name
    explicit = resolve(
        AgentConfig.model_validate({"reward": {"name": "swe_bench", "grade_in": "episode"}})
    )
    assert explicit.reward is not None and explicit.reward.grade_in == "episode"
