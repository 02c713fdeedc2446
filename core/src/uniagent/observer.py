"""What an episode is doing right now, for progress displays: an optional observer.

:func:`uniagent.episode.run_episode` and the interaction loop call an
:class:`EpisodeObserver` when a phase begins, a model turn begins and a tool
call is about to run. Calls are synchronous and must be cheap (they run on the
event loop between awaits); they never change what the episode does. The
default is :data:`NULL_OBSERVER`, which does nothing.
"""

from __future__ import annotations

from typing import Literal, Protocol

#: The phases of an episode, in order (``baseline`` and ``grading`` only with a reward;
#: ``ready`` only in a run with sandboxes prepared ahead: the sandbox is set up and waits for
#: one of the run's ``concurrency`` agent slots).
Phase = Literal["setup", "tools", "baseline", "ready", "agent", "grading", "close"]


class EpisodeObserver(Protocol):
    """Told what one episode is doing; every method returns at once."""

    def phase(self, name: Phase) -> None:
        """A phase of the episode begins (the previous one ends)."""

    def turn(self, number: int) -> None:
        """Model turn ``number`` (1, 2, ...) begins: the model is being queried."""

    def tool(self, name: str) -> None:
        """A call of tool ``name`` is about to run in the sandbox."""


class NullObserver:
    """An observer that ignores everything (the default)."""

    def phase(self, name: Phase) -> None:
        """Ignored."""

    def turn(self, number: int) -> None:
        """Ignored."""

    def tool(self, name: str) -> None:
        """Ignored."""


NULL_OBSERVER: EpisodeObserver = NullObserver()
