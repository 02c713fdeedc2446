"""What a reward function receives and returns (see ``uniagent_rewards``).

A reward never sees the agent's shell session. It gets a
:class:`~uniagent.grading.sandbox.GradingSandbox`: clean one-off shells in the
episode's sandbox after every process the agent started was stopped and the
protected files were put back (``grade_in: episode``), or in a fresh sandbox
holding only the agent's screened patch (``grade_in: fresh``). See
docs/rewards.md for what the grader trusts.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from uniagent.errors import UniAgentError
from uniagent.exit import ExitReason
from uniagent.protect.settings import Workspace

if TYPE_CHECKING:  # pragma: no cover
    from uniagent.grading.sandbox import GradingSandbox

C = TypeVar("C")


@dataclass(frozen=True)
class RewardContext(Generic[C]):
    """Everything a reward needs at the end of an episode.

    ``sandbox`` is the grading sandbox (``None`` for rewards declared with
    ``uses_sandbox=False``, which grade only the ``submission``); ``task`` is
    the task row; ``settings`` the reward's validated settings (an instance of
    ``RewardSpec.settings``, or ``None`` without one; ``config`` is its deprecated
    name); ``submission`` the output of the finishing tool (``submit``'s diff,
    ``finish``'s answer) or ``None``; ``workspace`` the repository being graded
    (path and base commit); ``control`` opens a control sandbox (``async with
    ctx.control() as sandbox``): the task as it was before the agent's first command, a
    fresh sandbox from its deployment and set-up with no change of the agent's, for a
    reward that must tell a check the agent broke from a check that is broken (``None``
    where the grader cannot start one; see :mod:`uniagent.grading.control`). ``verifier``
    opens a sandbox of the task's own verifier environment the same way (``None`` unless
    the task row has ``verifier_env``, the overrides of the agent's deployment that make
    it, e.g. a Harbor task's separate verifier image): fresh, set up, never the agent's.
    """

    sandbox: GradingSandbox | None
    task: Mapping[str, Any]
    settings: C
    messages: Sequence[Mapping[str, Any]] = ()
    exit_reason: ExitReason | None = None
    submission: str | None = None
    workspace: Workspace = field(default_factory=Workspace)
    control: Callable[[], AbstractAsyncContextManager[GradingSandbox]] | None = None
    verifier: Callable[[], AbstractAsyncContextManager[GradingSandbox]] | None = None

    @property
    def config(self) -> C:
        """Deprecated name of :attr:`settings` (until 0.4)."""
        warnings.warn(
            "RewardContext.config is deprecated since uniagent 0.3: read ctx.settings",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.settings

    def require_sandbox(self) -> GradingSandbox:
        """The grading sandbox (a clear error for a reward declared ``uses_sandbox=False``)."""
        if self.sandbox is None:
            raise RewardInfraError(
                "this reward was declared with uses_sandbox=False but needs the sandbox"
            )
        return self.sandbox


@dataclass(frozen=True)
class RewardResult:
    """A reward score plus details worth saving with the episode.

    ``turn_scores`` optionally credits model turns: ``{turn index: score}``, the index
    counting model turns from 0 (the first model call is turn 0). They go with the episode
    (``results.jsonl``) and, with ``reward.credit: turn`` or ``discounted``, onto each
    turn's last generated token in verl's ``rm_scores`` (see docs/training.md).
    """

    score: float
    info: Mapping[str, Any] = field(default_factory=dict)
    turn_scores: Mapping[int, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for turn, value in self.turn_scores.items():
            if isinstance(turn, bool) or not isinstance(turn, int) or turn < 0:
                raise TypeError(f"turn_scores: a key must be a turn index >= 0, got {turn!r}")
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise TypeError(f"turn_scores[{turn}]: a score must be a number, got {value!r}")

    @classmethod
    def coerce(cls, value: RewardResult | float | int | bool) -> RewardResult:
        """Accept a plain number from simple reward functions."""
        if isinstance(value, RewardResult):
            return value
        if isinstance(value, bool | int | float):
            return cls(score=float(value))
        raise TypeError(f"a reward must return a float or RewardResult, got {type(value).__name__}")


class RewardInfraError(UniAgentError):
    """The reward cannot be computed for reasons that are not the agent's (masked).

    Raise it (or a subclass) for a malformed task row, a missing work dir in the
    image, an environment failure the logs show: the episode ends
    ``reward_error`` and is masked from training. Anything the agent could have
    caused (failing tests, a timeout, a full disk) must score instead.
    """
