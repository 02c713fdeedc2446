"""Token-exact trajectories for multi-turn, tool-using episodes.

``Rollout.start`` builds a ``TokenRollout``: it records the prompt, every model
generation (ids and log-probs exactly as the server returned them, mask 1) and every
environment message (tokenized incrementally with the tokenizer's own chat template,
mask 0). ``Rollout.messages_only`` builds a ``MessageRollout`` (chat messages only,
for APIs that return text). See ``docs/rollout.md``.
"""

from __future__ import annotations

from typing import Any

from uniagent.rollout.cache import (
    CHECK_ENV,
    PromptTooLongError,
    Rollout,
    RolloutError,
    TruncatedRollout,
    deprecated_rollout_cache,
)
from uniagent.rollout.exactness import Difference, ExactnessReport, strip_think_blocks
from uniagent.rollout.messages import MessageRollout
from uniagent.rollout.template import (
    TemplateAnalysis,
    TemplateAnalysisError,
    analyse_chat_template,
)
from uniagent.rollout.tokens import TokenRollout

__all__ = [
    "CHECK_ENV",
    "Difference",
    "ExactnessReport",
    "MessageRollout",
    "PromptTooLongError",
    "Rollout",
    "RolloutError",
    "TemplateAnalysis",
    "TemplateAnalysisError",
    "TokenRollout",
    "TruncatedRollout",
    "analyse_chat_template",
    "strip_think_blocks",
]


def __getattr__(name: str) -> Any:
    if name == "RolloutCache":  # the old name of Rollout (deprecated in 0.3, gone in 0.4)
        return deprecated_rollout_cache(__name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
