"""The three reward functions (``fn(ctx) -> RewardResult``) and what each task's grader protects."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ValidationError

from uniagent import (
    ConfigError,
    IntegrityDefaults,
    RewardContext,
    RewardResult,
    TestEnv,
    Workspace,
    script_test_env,
)
from uniagent_reward_swebench.config import (
    R2EGymRewardConfig,
    SweBenchRewardConfig,
    SweRebenchRewardConfig,
)
from uniagent_reward_swebench.evaluate import evaluate
from uniagent_reward_swebench.rows import Dataset, build_spec
from uniagent_reward_swebench.scripts import (
    END_TEST_OUTPUT,
    START_TEST_OUTPUT,
    patch_files,
    runner_files,
)


def _config(ctx: RewardContext, cls: type[SweBenchRewardConfig]) -> SweBenchRewardConfig:
    if ctx.settings is None:
        return cls()
    if isinstance(ctx.settings, cls):
        return ctx.settings
    data = ctx.settings.model_dump() if isinstance(ctx.settings, BaseModel) else ctx.settings
    if isinstance(data, Mapping):
        try:
            return cls.model_validate(dict(data))
        except ValidationError as exc:
            raise ConfigError(f"invalid {cls.__name__}:\n{exc}") from None
    raise ConfigError(
        f"the reward got a {type(ctx.settings).__name__} config; expected {cls.__name__}"
    )


async def _reward(
    dataset: Dataset, ctx: RewardContext, cls: type[SweBenchRewardConfig]
) -> RewardResult:
    config = _config(ctx, cls)
    if ctx.workspace.repo:
        # Where the grader found the checkout (in a fresh sandbox it can have moved).
        literal = ctx.workspace.repo.replace("{", "{{").replace("}", "}}")
        config = config.model_copy(update={"workdir": literal})
    spec = build_spec(dataset, ctx.task, config)
    return await evaluate(ctx, spec, config)


async def swe_bench_reward(ctx: RewardContext) -> RewardResult:
    """1.0 when the SWE-bench task is resolved (all FAIL_TO_PASS and PASS_TO_PASS tests pass)."""
    return await _reward("swe_bench", ctx, SweBenchRewardConfig)


async def swe_rebench_reward(ctx: RewardContext) -> RewardResult:
    """1.0 when the SWE-rebench task is resolved, graded like SWE-bench."""
    return await _reward("swe_rebench", ctx, SweRebenchRewardConfig)


async def r2e_gym_reward(ctx: RewardContext) -> RewardResult:
    """1.0 when the R2E-Gym task's tests end with their expected statuses."""
    return await _reward("r2e_gym", ctx, R2EGymRewardConfig)


_DEFAULTS: dict[str, type[SweBenchRewardConfig]] = {
    "swe_bench": SweBenchRewardConfig,
    "swe_rebench": SweRebenchRewardConfig,
    "r2e_gym": R2EGymRewardConfig,
}


def _workspace(dataset: Dataset) -> Any:
    def workspace(task: Mapping[str, Any], config: SweBenchRewardConfig | None) -> Workspace:
        """The checkout, its base commit and the test patch's files (the benchmark's)."""
        config = config or _DEFAULTS[dataset]()
        spec = build_spec(dataset, task, config)
        owned = tuple(f.path for f in patch_files(spec.test_patch))
        if config.protect_runner:  # the runner of the repository that the tests run
            owned += tuple(runner_files(_test_lines(spec.eval_script)[1], spec.workdir))
        if dataset == "r2e_gym":
            owned += ("run_tests.sh", "r2e_tests")  # where the set-up did not move them
        return Workspace(
            repo=spec.workdir if config.workdir is not None else None,
            base_commit=spec.base_commit,
            protect_paths=owned,
            outside_paths=tuple(config.protect_outside),
        )

    return workspace


def _test_env(dataset: Dataset) -> Any:
    def test_env(task: Mapping[str, Any], config: SweBenchRewardConfig | None) -> TestEnv:
        """How the eval script finds its interpreter: its activation and test commands."""
        spec = build_spec(dataset, task, config or _DEFAULTS[dataset]())
        before, tests = _test_lines(spec.eval_script)
        return script_test_env("\n".join(before), tests)

    return test_env


def _test_lines(eval_script: str) -> tuple[list[str], list[str]]:
    """The eval script's lines before its test output region, and the region's commands."""
    lines = eval_script.splitlines()
    starts = [i for i, line in enumerate(lines) if START_TEST_OUTPUT in line]
    ends = [i for i, line in enumerate(lines) if END_TEST_OUTPUT in line]
    tests = lines[starts[0] + 1 : ends[0]] if starts and ends else lines
    before = lines[: starts[0]] if starts else lines
    return before, tests


def integrity_defaults(dataset: Dataset) -> IntegrityDefaults:
    """The grader's defaults for one dataset: graded in a fresh sandbox (as the SWE-bench
    harness does), history scrubbed, Python harness protected, the test environment resolved
    as the eval script resolves it."""
    return IntegrityDefaults(
        scrub_history=True,
        workspace=_workspace(dataset),
        test_env=_test_env(dataset),
        grade_in="fresh",
    )
