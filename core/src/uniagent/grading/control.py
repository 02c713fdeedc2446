"""The control sandbox: the task as it was before the agent's first command.

A reward that cannot tell whether a failure of its checks was the agent's doing or the
task's asks for one (``RewardContext.control``): a fresh sandbox from the task's
deployment and set-up (``post_setup`` run, the agent's tools not installed), with no
change of the agent's, opened as a grading sandbox in the work dir the episode's grading
used. The fresh sandbox is closed when the context ends.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Mapping
from typing import TYPE_CHECKING

from uniagent.grading import integrity
from uniagent.grading.sandbox import GradingSandbox
from uniagent.protect.settings import IntegritySettings
from uniagent.reward import RewardInfraError

if TYPE_CHECKING:  # pragma: no cover
    from uniagent.env import AgentEnv


@contextlib.asynccontextmanager
async def control_sandbox(
    new_env: Callable[[], AgentEnv],
    settings: IntegritySettings,
    session_env: Mapping[str, str],
    *,
    episode: AgentEnv,
    workdir: str | None,
    starting: Callable[[bool], None] = lambda _: None,
    what: str = "control",
    baseline: integrity.Baseline | None = None,
) -> AsyncIterator[GradingSandbox]:
    """A grading sandbox in a new sandbox of ``new_env``; ``workdir`` is the episode's
    (``episode``'s work dir mapped to the new one's).

    ``starting(True)`` is called before the start and ``starting(False)`` once it
    started. A sandbox that does not start is infrastructure (:class:`RewardInfraError`);
    ``what`` names it in the message. Without ``workdir``: the new sandbox's own. With the
    episode's ``baseline``, its grading PATH has the baseline's pyenv pin (the interpreter
    the episode's tests ran).
    """
    starting(True)
    try:
        fresh = new_env()
        await fresh.start()
    except Exception as exc:
        raise RewardInfraError(
            f"the {what} sandbox did not start: {type(exc).__name__}: {exc}"
        ) from exc
    finally:
        starting(False)
    try:
        try:
            environment = await integrity.environment_of(fresh, settings, session_env)
            if baseline is not None:
                environment = integrity.pinned_environment(environment, baseline)
            where = integrity.moved_repo(workdir, episode, fresh) if workdir else fresh.workdir
            sandbox = await GradingSandbox.open(fresh, environment, workdir=where, lazy=True)
        except Exception as exc:
            raise RewardInfraError(
                f"the {what} sandbox could not be opened: {type(exc).__name__}: {exc}"
            ) from exc
        try:
            yield sandbox
        finally:
            await sandbox.close()
    finally:
        await fresh.close()
