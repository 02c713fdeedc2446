"""Entry point of uniagent-reward-swebench: the swe_bench, swe_rebench and r2e_gym rewards."""

from __future__ import annotations

from collections.abc import Iterator

from uniagent import RewardSpec, hookimpl
from uniagent_reward_swebench.config import (
    R2EGymRewardConfig,
    SweBenchRewardConfig,
    SweRebenchRewardConfig,
)
from uniagent_reward_swebench.rewards import (
    integrity_defaults,
    r2e_gym_reward,
    swe_bench_reward,
    swe_rebench_reward,
)


@hookimpl
def uniagent_rewards() -> Iterator[RewardSpec]:
    """The three SWE rewards, each graded by swebench's harness in a grading sandbox."""
    yield RewardSpec(
        name="swe_bench",
        fn=swe_bench_reward,
        settings=SweBenchRewardConfig,
        description="1.0 when a SWE-bench instance is resolved (swebench 5.0.2 grading)",
        integrity=integrity_defaults("swe_bench"),
    )
    yield RewardSpec(
        name="swe_rebench",
        fn=swe_rebench_reward,
        settings=SweRebenchRewardConfig,
        description="1.0 when a SWE-rebench instance is resolved (graded like SWE-bench)",
        integrity=integrity_defaults("swe_rebench"),
    )
    yield RewardSpec(
        name="r2e_gym",
        fn=r2e_gym_reward,
        settings=R2EGymRewardConfig,
        description="1.0 when an R2E-Gym instance's tests end with their expected statuses",
        integrity=integrity_defaults("r2e_gym"),
    )
