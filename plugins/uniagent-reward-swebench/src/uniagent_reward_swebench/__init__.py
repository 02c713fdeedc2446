"""SWE-bench, SWE-rebench and R2E-Gym rewards for uniagent, graded by swebench 5.0.2."""

from __future__ import annotations

from uniagent_reward_swebench.config import (
    R2EGymRewardConfig,
    SweBenchRewardConfig,
    SweRebenchRewardConfig,
)
from uniagent_reward_swebench.errors import (
    EvaluationInfraError,
    SweBenchRewardError,
    TaskRowError,
)
from uniagent_reward_swebench.evaluate import evaluate, grade
from uniagent_reward_swebench.rewards import r2e_gym_reward, swe_bench_reward, swe_rebench_reward
from uniagent_reward_swebench.rows import EvalSpec, build_spec

__all__ = [
    "EvalSpec",
    "EvaluationInfraError",
    "R2EGymRewardConfig",
    "SweBenchRewardConfig",
    "SweBenchRewardError",
    "SweRebenchRewardConfig",
    "TaskRowError",
    "build_spec",
    "evaluate",
    "grade",
    "r2e_gym_reward",
    "swe_bench_reward",
    "swe_rebench_reward",
]
