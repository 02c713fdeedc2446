"""The interaction loop and the episode around it."""

from uniagent.exit import DEFAULT_EXIT_POLICY, ExitReason
from uniagent.interaction.metrics import EpisodeMetrics

__all__ = ["DEFAULT_EXIT_POLICY", "EpisodeMetrics", "ExitReason"]
