"""Token-exact trajectories for multi-turn, tool-using episodes.

``RolloutCache`` records the prompt, every model generation (ids and log-probs exactly
as the server returned them, mask 1) and every environment message (tokenized
incrementally with the tokenizer's own chat template, mask 0). See ``docs/rollout.md``.
"""

from __future__ import annotations

from uniagent.rollout.cache import (
    CHECK_ENV,
    PromptTooLongError,
    RolloutCache,
    RolloutError,
    TruncatedRollout,
)
from uniagent.rollout.exactness import Difference, ExactnessReport, strip_think_blocks
from uniagent.rollout.template import (
    TemplateAnalysis,
    TemplateAnalysisError,
    analyse_chat_template,
)

__all__ = [
    "CHECK_ENV",
    "Difference",
    "ExactnessReport",
    "PromptTooLongError",
    "RolloutCache",
    "RolloutError",
    "TemplateAnalysis",
    "TemplateAnalysisError",
    "TruncatedRollout",
    "analyse_chat_template",
    "strip_think_blocks",
]
