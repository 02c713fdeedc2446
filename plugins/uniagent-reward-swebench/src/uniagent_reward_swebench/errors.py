"""Errors of the SWE-bench rewards: infrastructure (exit reason ``reward_error``, masked).

Nothing the agent can cause raises them: failing tests, a test patch that no
longer applies and tests past ``eval_timeout`` score 0.0 instead.
"""

from __future__ import annotations

from uniagent import RewardInfraError


class SweBenchRewardError(RewardInfraError):
    """Base class: the reward could not be computed (the trajectory should not be trained on)."""


class TaskRowError(SweBenchRewardError, ValueError):
    """The task row lacks a field the reward needs, or a field is malformed."""


class EvaluationInfraError(SweBenchRewardError, RuntimeError):
    """The sandbox could not run the evaluation (missing work dir, broken environment)."""
