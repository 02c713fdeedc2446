"""Settings of the ``swe_bench``, ``swe_rebench`` and ``r2e_gym`` rewards."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class SweBenchRewardConfig(BaseModel):
    """Settings of the ``swe_bench`` reward (and the base of the other two)."""

    model_config = ConfigDict(extra="forbid")

    eval_timeout: float = Field(
        default=1800.0, gt=0, description="seconds the evaluation script may run in the sandbox"
    )
    workdir: str | None = Field(
        default="/testbed",
        min_length=1,
        description=(
            "the repository checkout in the sandbox; may use {repo_name}, {repo} and "
            "{instance_id} (e.g. '/{repo_name}' for SWE-rebench V2 images); null: the episode's "
            "work dir (where the env's post_setup put the checkout)"
        ),
    )
    apply_test_patch: Literal["auto", "always", "never"] = Field(
        default="auto",
        description=(
            "apply the row's test_patch before the eval script; 'auto' applies it unless the "
            "row's own eval_script applies patches itself (contains 'git apply')"
        ),
    )
    test_cmd: str | None = Field(
        default=None,
        description=(
            "test command for rows without an eval_script (and without a test command of "
            "their own); the test files of test_patch are appended"
        ),
    )
    log_parser: str | None = Field(
        default=None,
        description=(
            "swebench log parser for rows that name none (a key of "
            "swebench.harness.log_parsers.PARSER_REGISTRY)"
        ),
    )
    conda_env: str | None = Field(
        default="testbed",
        description=(
            "generated eval scripts activate this conda env when /opt/miniconda3 exists "
            "(as in SWE-bench images); null to never activate"
        ),
    )
    infra_failure_is_error: bool = Field(
        default=False,
        description=(
            "raise (exit reason reward_error, trajectory masked) instead of scoring 0.0 when "
            "the test output shows an environment failure (swebench's classifier: out of "
            "memory, network, ...). Off by default: the tested code prints into that output, "
            "so a policy could print such a line to have its own episode masked; turn it on "
            "only for trusted policies (evaluation). A missing work dir always raises"
        ),
    )
    log_tail_chars: int = Field(
        default=4000, ge=0, description="characters of the test log kept in RewardResult.info"
    )
    protect_outside: list[str] = Field(
        default_factory=list,
        description=(
            "absolute paths outside the checkout that the benchmark owns (test files, the "
            "test runner): snapshotted before the agent's first turn and put back before "
            "grading"
        ),
    )
    protect_runner: bool = Field(
        default=True,
        description=(
            "protect the repository's own test runner, the file the test command runs "
            "(Django's tests/runtests.py, sympy's bin/test): it reads the test results before "
            "any parser does, so an edit of it could report any result. Off only for a task "
            "set whose fixes legitimately change their runner"
        ),
    )

    status_channel: bool = Field(
        default=True,
        description=(
            "also ask the test runner for each test's status (a grader-owned recorder in the "
            "tests' Python: pytest's reports, unittest's and Django's results) and score 0 "
            "where the log counts a graded test as passed that the runner does not. Used "
            "where the row's log parser reads pytest's or Django's output; false: the log "
            "alone, as swebench's harness grades"
        ),
    )
    strict_statuses: bool = Field(
        default=True,
        description=(
            "a graded test passes only if it ran and passed: a skipped PASS_TO_PASS test "
            "fails (swebench counts it as maintained), and an expected failure counts only "
            "where the test declares it (a marker, or pytest.xfail() called from the test's "
            "own file or a conftest.py; not from the code under test: known with the status "
            "channel; where the channel has no record of the run, no expected failure "
            "counts). false: swebench's reading"
        ),
    )


class SweRebenchRewardConfig(SweBenchRewardConfig):
    """Settings of the ``swe_rebench`` reward."""

    normalize_test_names: bool = Field(
        default=True,
        description=(
            "strip timing suffixes ('[1.5ms]', 'in 200 msec', '(2s)') from test names on both "
            "sides, as SWE-rebench's grader does"
        ),
    )
    run_install_commands: bool = Field(
        default=False,
        description=(
            "run install_config.install before the tests (non-fatal), as SWE-rebench V2's "
            "harness does; its prebuilt images usually need none"
        ),
    )


class R2EGymRewardConfig(SweBenchRewardConfig):
    """Settings of the ``r2e_gym`` reward."""

    test_cmd: str | None = Field(
        default=None,
        description=(
            "test command; default: R2E-Gym's run_tests.sh (/root/run_tests.sh where R2E-Gym's "
            "set-up moved it, else run_tests.sh in the work dir)"
        ),
    )
    protect_outside: list[str] = Field(
        default_factory=lambda: ["/root/run_tests.sh", "/root/r2e_tests"],
        description=(
            "absolute paths outside the checkout that the benchmark owns: R2E-Gym's set-up "
            "moves its tests and run_tests.sh to /root, out of the repository's protection"
        ),
    )
    exact_match: bool = Field(
        default=True,
        description=(
            "R2E-Gym's own rule: besides every expected-PASSED test passing, every test must end "
            "with exactly its expected status and no test may be missing or extra"
        ),
    )
