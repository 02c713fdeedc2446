"""Exit reasons and their treatments: ground-floor vocabulary that every layer shares.

See docs/config.md, "Exit reasons". This module imports nothing else of uniagent.
"""

from __future__ import annotations

from enum import Enum
from typing import Literal


class ExitReason(str, Enum):
    """Why an episode ended."""

    FINISHED = "finished"
    MAX_STEP_LIMIT = "max_step_limit"
    TOKEN_LIMIT = "token_limit"
    FORMAT_ERROR = "format_error"
    TIMEOUT_ERROR = "timeout_error"
    AGENT_KILLED_SHELL = "agent_killed_shell"
    TERMINAL_NOT_ALIVE = "terminal_not_alive"
    ENV_ERROR = "env_error"
    REWARD_ERROR = "reward_error"
    MODEL_ERROR = "model_error"
    UNKNOWN_ERROR = "unknown_error"

    def __str__(self) -> str:
        return self.value


Treatment = Literal["train", "mask"]

#: Infrastructure failures are masked so a broken sandbox never teaches the model
#: that its answer was wrong; policy outcomes are trained on. ``format_error`` and
#: ``timeout_error`` only end an episode when their budget (``max_format_errors`` /
#: ``timeout_budget``) is spent: that is the policy's doing. (Syntax errors never end
#: one: they are fed back.)
#: ``agent_killed_shell`` (the agent's own command ended or wedged its shell while the
#: sandbox lives on) is the policy's doing too: trained on, with reward 0.
DEFAULT_EXIT_POLICY: dict[ExitReason, Treatment] = {
    ExitReason.FINISHED: "train",
    ExitReason.MAX_STEP_LIMIT: "train",
    ExitReason.TOKEN_LIMIT: "train",
    ExitReason.FORMAT_ERROR: "train",
    ExitReason.TIMEOUT_ERROR: "train",
    ExitReason.AGENT_KILLED_SHELL: "train",
    ExitReason.TERMINAL_NOT_ALIVE: "mask",
    ExitReason.ENV_ERROR: "mask",
    ExitReason.REWARD_ERROR: "mask",
    ExitReason.MODEL_ERROR: "mask",
    ExitReason.UNKNOWN_ERROR: "mask",
}
