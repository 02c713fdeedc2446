"""Errors of the SWE-bench rewards; the loop reports any of them as exit reason ``reward_error``."""

from __future__ import annotations

from uniagent.errors import UniAgentError


class SweBenchRewardError(UniAgentError):
    """Base class: the reward could not be computed (the trajectory should not be trained on)."""


class TaskRowError(SweBenchRewardError, ValueError):
    """The task row lacks a field the reward needs, or a field is malformed."""


class EvaluationInfraError(SweBenchRewardError, RuntimeError):
    """The sandbox could not run the evaluation (missing work dir, broken environment)."""
