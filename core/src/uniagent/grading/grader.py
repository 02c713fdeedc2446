"""One episode's grader: the baseline before the first turn, the grading after the last.

``grade_in: episode``: every process of the agent is stopped, a clean grading
shell opened, the toolchain verified (a change falls back to a fresh sandbox or
scores 0), protected files restored from the snapshot, the agent's patch
scanned with the content rules, then the reward runs there.

``grade_in: fresh`` (the SWE-bench harness's method): the same stop, restore and
scan in the episode's sandbox, whose only use is then to give up the agent's
patch; a new sandbox is started from the task's own deployment and set-up, the
patch applied there, and the reward runs in it.

Failures are classified so that the policy cannot choose to be masked: what
fails after the agent's first command, in a sandbox still alive or one whose
server was ended from inside, is the policy's doing (score 0, trained on, the
exception in ``reward_info.error``), the reward's own exceptions included (the
tested code's output can cause them); so is grading past ``grading_timeout``.
Infrastructure (``reward_error``, masked) is only what the agent cannot reach: a
sandbox that died from outside, a fresh sandbox that cannot start or does not
reproduce the base, a :class:`~uniagent.reward.RewardInfraError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from uniagent.env.errors import EnvError, TerminalNotAliveError
from uniagent.exit import ExitReason
from uniagent.grading import integrity, outside, testenv
from uniagent.grading.control import control_sandbox
from uniagent.grading.integrity import Baseline, GradingSetupError, Tamper
from uniagent.grading.patch import (
    FilePatch,
    PatchTooLarge,
    apply_patch,
    join_patch,
    screen_patch,
    take_patch,
)
from uniagent.grading.sandbox import GradingSandbox, off_loop
from uniagent.protect.settings import IntegritySettings, TestEnv, Workspace
from uniagent.reward import RewardContext, RewardInfraError, RewardResult

if TYPE_CHECKING:  # pragma: no cover
    from uniagent.env import AgentEnv
    from uniagent.specs import RewardSpec

log = logging.getLogger(__name__)


class GradingInfraError(RewardInfraError):
    """Grading failed for reasons that are not the agent's (masked as ``reward_error``)."""


@dataclass
class Grade:
    """The reward of an episode and what the grader saw."""

    score: float
    info: dict[str, Any] = field(default_factory=dict)
    #: The reward's per-turn scores (``RewardResult.turn_scores``; none when scored 0 here).
    turn_scores: dict[int, float] = field(default_factory=dict)


@dataclass
class GradingPlan:
    """What to grade and how: the reward, its settings, and how to rebuild the sandbox."""

    spec: RewardSpec
    settings: Any
    task: Mapping[str, Any]
    grade_in: str
    integrity: IntegritySettings
    #: Opens a new, unstarted sandbox of the task for ``grade_in: fresh`` and the
    #: grader's controls (it is started and set up there; tools are not installed).
    open_fresh: Callable[[], AgentEnv] | None = None
    #: Opens a sandbox of the task's verifier environment (``RewardContext.verifier``).
    open_verifier: Callable[[], AgentEnv] | None = None
    #: The environment variables of the agent's session (``env.env``), for graders' shells.
    session_env: Mapping[str, str] = field(default_factory=dict)


class EpisodeGrader:
    """Prepares at the start (:meth:`prepare`) and grades at the end (:meth:`grade`)."""

    def __init__(self, plan: GradingPlan) -> None:
        self.plan = plan
        spec = plan.spec
        workspace = spec.integrity.workspace
        self.workspace = workspace(plan.task, plan.settings) if workspace else Workspace()
        self.baseline: Baseline | None = None
        self._tampered: list[Tamper] = []
        self.prepare_seconds = 0.0
        #: What grading does now ("checking", "starting the fresh sandbox", "the reward") and
        #: in which sandbox: a grading timeout is the agent's unless it hit a fresh start.
        self._phase = "checking"
        self._active: AgentEnv | None = None
        #: ``grade_in: fresh``: the fresh sandbox started while the agent works, and its start.
        self._ahead: tuple[AgentEnv, asyncio.Task[None]] | None = None

    @property
    def uses_sandbox(self) -> bool:
        """Whether the reward looks at the sandbox (else it grades only the submission)."""
        return self.plan.spec.uses_sandbox

    async def prepare(self, env: AgentEnv) -> dict[str, Any]:
        """Take the baseline in the freshly set-up sandbox; what it recorded."""
        if not self.uses_sandbox:
            return {}
        started = time.perf_counter()
        check = self.plan.integrity.verify_toolchain
        try:
            self.baseline = await integrity.capture(
                env,
                self.plan.integrity,
                self.plan.spec.integrity,
                self.workspace,
                self.plan.session_env,
                check_toolchain=check,
                after=self._after_capture,
            )
        finally:
            self.prepare_seconds = time.perf_counter() - started
        if self.plan.grade_in == "fresh" and self.baseline.base is None:
            raise GradingSetupError(
                f"grade_in: fresh needs a git repository with a commit at "
                f"{self.baseline.repo!r} (the agent's patch is taken against it)"
            )
        if self.plan.grade_in == "fresh" and self.plan.open_fresh is not None:
            # Started now, while the agent works: grading does not wait for its start-up.
            # :meth:`close` stops it whatever becomes of the episode.
            fresh = self.plan.open_fresh()
            self._ahead = (fresh, asyncio.ensure_future(fresh.start()))
        return self.baseline.report()

    def for_fork(self, moved: Mapping[str, str]) -> EpisodeGrader:
        """A grader for a fork of the episode's sandbox (a tree rollout's leaf), graded on
        its own: the same plan, and the baseline taken at the root before the agent's first
        command (a fork's own state is the agent's doing, never a baseline), its paths moved
        where the fork has them (``moved``: the root's directory -> the fork's)."""
        twin = EpisodeGrader(self.plan)
        twin.prepare_seconds = self.prepare_seconds
        if self.baseline is not None:
            twin.baseline = integrity.forked_baseline(self.baseline, moved)
            twin.workspace = integrity.forked_baseline(self.workspace, moved)
        return twin

    async def fresh_started(self) -> None:
        """Wait until the fresh sandbox started ahead is up (or has failed): what the agent's
        working time hides (benchmarks and tests stand in for it with this)."""
        if self._ahead is not None:
            await asyncio.wait({self._ahead[1]})

    async def _take_fresh(self) -> AgentEnv:
        """The fresh sandbox started ahead (or, if that one failed, one started now)."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            fresh, starting = ahead
            try:
                await starting  # cancelled with this grading: AgentEnv.start then closes it
                return fresh
            except Exception as exc:  # start() closed it
                log.info("the fresh sandbox started ahead failed (%s); starting another", exc)
        assert self.plan.open_fresh is not None, "grade_in: fresh without a sandbox to open"
        fresh = self.plan.open_fresh()
        await fresh.start()
        return fresh

    async def close(self) -> None:
        """Stop a fresh sandbox started ahead and not used (the episode was not graded, or
        failed, or was interrupted); a no-op otherwise, and idempotent."""
        ahead, self._ahead = self._ahead, None
        if ahead is None:
            return
        fresh, starting = ahead
        starting.cancel()  # nothing if it has started
        try:
            await asyncio.wait({starting})
        finally:
            if starting.done() and not starting.cancelled():
                starting.exception()  # retrieved: it is not reported as never retrieved
            await fresh.close()  # shielded and idempotent

    async def _after_capture(self, sandbox: GradingSandbox, baseline: Baseline) -> None:
        """The parts of the baseline outside the repository: the test environment (with the
        toolchain check) and the benchmark's own outside paths."""
        if self.plan.integrity.verify_toolchain:
            hook = self.plan.spec.integrity.test_env
            spec = hook(self.plan.task, self.plan.settings) if hook is not None else TestEnv()
            await testenv.discover(sandbox, baseline, spec)
        await outside.snapshot(
            sandbox, baseline, self.workspace.outside_paths, self.plan.integrity.snapshot_max_bytes
        )

    async def grade(
        self,
        env: AgentEnv,
        *,
        messages: Sequence[Mapping[str, Any]],
        exit_reason: ExitReason,
        submission: str | None,
    ) -> Grade:
        """Stop the agent, check and restore, run the reward; raise only for infrastructure."""
        context = {"messages": messages, "exit_reason": exit_reason, "submission": submission}
        if not self.uses_sandbox:
            return await self._run_reward(None, context, {})
        assert self.baseline is not None, "prepare() was not called"
        await env.stop_agent()
        self._phase, self._active = "checking", env
        limit = self.plan.integrity.grading_timeout
        work = asyncio.ensure_future(self._grade_open(env, context))
        try:
            done, _ = await asyncio.wait({work}, timeout=limit)
        except asyncio.CancelledError:
            work.cancel()
            raise
        if work in done:
            return work.result()
        work.cancel()
        with contextlib.suppress(BaseException):
            await work
        return await self._timed_out(limit)

    async def _grade_open(self, env: AgentEnv, context: dict[str, Any]) -> Grade:
        assert self.baseline is not None
        try:
            sandbox = await GradingSandbox.open(
                env, self.baseline.environment, workdir=self.baseline.repo, lazy=True
            )
        except Exception as exc:
            return await self._after_agent(env, exc, "opening the grading shell")
        try:
            return await self._grade(env, sandbox, context)
        finally:
            await sandbox.close()

    async def _timed_out(self, limit: float) -> Grade:
        """Grading ran past ``grading_timeout``: the tested code's doing unless infrastructure."""
        what = f"grading did not finish within {limit:g} s (integrity.grading_timeout)"
        if self._phase == "starting the fresh sandbox":
            raise GradingInfraError(f"{what}: the fresh sandbox did not start in time")
        active = self._active
        alive = active is None or await active.sandbox_alive()
        if not alive and not (active is not None and await active.ended_from_inside()):
            raise GradingInfraError(f"{what}, and the sandbox died ({self._phase})")
        log.info("%s while %s (scored 0)", what, self._phase)
        info = {"grade_in": self.plan.grade_in, **(self.baseline.report() if self.baseline else {})}
        return self._zero(info, "grading_timed_out", f"{what}, while {self._phase}")

    async def _grade(
        self, env: AgentEnv, sandbox: GradingSandbox, context: dict[str, Any]
    ) -> Grade:
        baseline, settings = self.baseline, self.plan.integrity
        assert baseline is not None
        mode = self.plan.grade_in
        info: dict[str, Any] = {"grade_in": mode, **baseline.report()}
        try:
            if mode == "episode":
                changed = await integrity.verify_toolchain(sandbox, baseline)
                env_changes, purged = await testenv.verify(sandbox, baseline)
                changed += env_changes
                if purged:
                    info["bytecode_purged"] = purged
                self._record(changed)
                if changed and (
                    settings.on_tamper == "zero" or settings.on_toolchain_tamper == "zero"
                ):
                    return self._zero(info, "tampered", "the toolchain changed")
                if changed:
                    mode = info["grade_in"] = "fresh"
                    info["fallback"] = "the toolchain changed: graded in a fresh sandbox"
            self._record(await integrity.screen(sandbox, baseline, restore=True))
            self._record(await outside.screen(sandbox, baseline))
            parts: list[FilePatch] = []
            if baseline.base is not None:
                taken = await take_patch(sandbox, baseline, settings.max_patch_bytes)
                if taken is not None:
                    parts = taken.parts
                    self._record(await off_loop(screen_patch, taken, baseline.rules))
                    info.update(taken.report())
        except PatchTooLarge as exc:
            return self._zero(info, "patch_too_large", str(exc))
        except Exception as exc:
            return await self._after_agent(env, exc, "checking the sandbox", info)
        info["tampered"] = [t.to_dict() for t in self._tampered]
        if settings.on_tamper == "zero" and any(t.scores for t in self._tampered):
            return self._zero(info, "tampered", "protected files, code or tools were changed")
        if mode == "episode":
            self._phase = "the reward"
            return await self._run_reward(sandbox, context, info, env=env)
        # Whole protected files were put back (their parts are gone); a shared config file's
        # edits stay: only its test-runner section is the benchmark's, and that is as it was.
        kept = [p for p in parts if not baseline.rules.protects(p.path)]
        return await self._grade_fresh(env, join_patch(kept), context, info)

    async def _grade_fresh(
        self, episode: AgentEnv, patch: bytes, context: dict[str, Any], info: dict[str, Any]
    ) -> Grade:
        baseline = self.baseline
        assert baseline is not None and baseline.repo is not None
        started = time.perf_counter()
        self._phase = "starting the fresh sandbox"
        try:
            fresh = await self._take_fresh()
        except Exception as exc:
            raise GradingInfraError(
                f"the fresh grading sandbox did not start: {type(exc).__name__}: {exc}"
            ) from exc
        try:
            environment = integrity.pinned_environment(
                await integrity.environment_of(
                    fresh, self.plan.integrity, self.plan.session_env, self.plan.spec.integrity
                ),
                baseline,
            )
            repo = integrity.moved_repo(baseline.repo, episode, fresh)
            probe = await GradingSandbox.open(fresh, environment, workdir=repo, lazy=True)
            # The reward's own (opening runs nothing); it takes over the probe's shell.
            sandbox = await GradingSandbox.open(fresh, environment, workdir=repo, lazy=True)
            try:
                return await self._probe_and_reward(
                    episode, fresh, probe, sandbox, repo, patch, context, info, started
                )
            finally:
                await sandbox.close()
        except (GradingSetupError, TerminalNotAliveError, EnvError) as exc:
            raise GradingInfraError(
                f"grading in the fresh sandbox failed: {type(exc).__name__}: {exc}"
            ) from exc
        finally:
            await fresh.close()

    async def _probe_and_reward(
        self,
        episode: AgentEnv,
        fresh: AgentEnv,
        probe: GradingSandbox,
        sandbox: GradingSandbox,
        repo: str,
        patch: bytes,
        context: dict[str, Any],
        info: dict[str, Any],
        started: float,
    ) -> Grade:
        """In the fresh sandbox: check what it shares with the episode's and apply the patch
        (``probe``), then run the reward (``sandbox``)."""
        baseline = self.baseline
        assert baseline is not None
        try:
            # What the fresh sandbox shares with the episode's (the host's directories
            # without isolation) must be as it was before the agent's first command.
            shared = await integrity.verify_toolchain(probe, baseline)
            shared += await outside.screen(probe, baseline)
            shared += (await testenv.verify(
                probe, baseline, since_baseline=False, repo=repo,
                moved=lambda path: integrity.moved_path(path, episode, fresh),
            ))[0]  # fmt: skip
            # (HEAD's tree asked in the same command: the patch leaves it as it is)
            tree, problem = await apply_patch(probe, repo, patch)
            if tree is None or tree != baseline.base_tree:
                raise GradingInfraError(
                    f"the fresh sandbox's {repo} holds tree {tree}, not the episode's base "
                    f"tree {baseline.base_tree} (commit {baseline.base}): the task's set-up "
                    "is not reproducible"
                )
        finally:
            await probe.close(hand_to=sandbox)
        info["fresh_setup_seconds"] = round(time.perf_counter() - started, 3)
        self._record(shared)
        if shared and self.plan.integrity.on_tamper == "zero":
            info["tampered"] = [t.to_dict() for t in self._tampered]
            return self._zero(
                info,
                "tampered",
                "what the fresh sandbox shares with the "
                "episode's (toolchain, test environment, the task's paths "
                "outside the repository) changed after the episode's start",
            )
        if problem is not None:
            return self._zero(info, "patch_did_not_apply", problem)
        self._phase, self._active = "the reward", fresh
        return await self._run_reward(sandbox, context, info, env=fresh, repo=repo)

    async def _run_reward(
        self,
        sandbox: GradingSandbox | None,
        context: dict[str, Any],
        info: dict[str, Any],
        *,
        env: AgentEnv | None = None,
        repo: str | None = None,
    ) -> Grade:
        ctx = RewardContext(
            sandbox=sandbox,
            task=self.plan.task,
            settings=self.plan.settings,
            workspace=self._workspace(repo),
            control=self._control(env, repo),
            verifier=self._verifier(env),
            **context,
        )
        started = time.perf_counter()
        try:
            outcome = RewardResult.coerce(await self.plan.spec.fn(ctx))
        except RewardInfraError:
            raise
        except Exception as exc:
            if sandbox is None or env is None:
                raise
            return await self._after_agent(env, exc, "the reward", info, probe=sandbox)
        if info:  # graded in a sandbox: the reward's own time, beside the checks'
            info["reward_seconds"] = round(time.perf_counter() - started, 3)
        return Grade(
            float(outcome.score),
            {**dict(outcome.info), **({"integrity": info} if info else {})},
            {int(turn): float(value) for turn, value in outcome.turn_scores.items()},
        )

    def _control(self, env: AgentEnv | None, repo: str | None) -> Any:
        """``RewardContext.control``: a fresh sandbox of the task, untouched by the agent."""
        if self.plan.open_fresh is None or env is None or self.baseline is None:
            return None

        def starting(now: bool) -> None:  # a grading timeout while it starts is not the agent's
            self._phase = "starting the fresh sandbox" if now else "the reward"

        workdir = repo or self.baseline.repo
        return functools.partial(
            control_sandbox, self.plan.open_fresh, self.plan.integrity, self.plan.session_env,
            episode=env, workdir=workdir, starting=starting, baseline=self.baseline,
        )  # fmt: skip

    def _verifier(self, env: AgentEnv | None) -> Any:
        """``RewardContext.verifier``: a fresh sandbox of the task's verifier environment."""
        if self.plan.open_verifier is None or env is None:
            return None

        def starting(now: bool) -> None:  # as for the control: not the agent's time
            self._phase = "starting the fresh sandbox" if now else "the reward"

        return functools.partial(
            control_sandbox, self.plan.open_verifier, self.plan.integrity, self.plan.session_env,
            episode=env, workdir=None, starting=starting, what="verifier",
        )  # fmt: skip

    def _workspace(self, repo: str | None = None) -> Workspace:
        baseline = self.baseline
        if baseline is None:
            return self.workspace
        return Workspace(repo or baseline.repo, baseline.base, self.workspace.protect_paths)

    async def _after_agent(
        self,
        env: AgentEnv,
        exc: BaseException,
        what: str,
        info: dict[str, Any] | None = None,
        *,
        probe: GradingSandbox | None = None,
    ) -> Grade:
        """A step failed after the agent acted: scored 0 and trained on, unless infrastructure.

        Infrastructure is only a sandbox that died from outside (and a
        :class:`~uniagent.reward.RewardInfraError`). A sandbox whose server was ended
        from inside, a step that broke in a sandbox that still runs, and an exception
        of the reward itself (``probe``: the tested code's output can make one) score 0,
        the exception recorded in ``error``.
        """
        info = dict(info or {})
        if isinstance(exc, RewardInfraError):
            raise exc
        failure = f"{what}: {type(exc).__name__}: {exc}"
        if not await env.sandbox_alive():
            if not await env.ended_from_inside():
                raise GradingInfraError(f"the sandbox died while {what}: {exc}") from exc
            log.info("the sandbox ended from inside while %s (scored 0): %s", what, exc)
            return self._zero(info, "sandbox_ended_by_agent", failure, error=_traceback(exc))
        if probe is not None and await _writable(probe):
            log.warning("%s failed in a healthy sandbox (scored 0, recorded): %s", what, exc)
            return self._zero(info, "reward_failed", failure, error=_traceback(exc))
        log.info("%s failed after the agent acted (scored 0): %s", what, exc)
        return self._zero(info, "sandbox_broken_by_agent", failure, error=_traceback(exc))

    def _record(self, found: list[Tamper]) -> None:
        seen = {(t.kind, t.path, t.change, t.rule) for t in self._tampered}
        self._tampered += [t for t in found if (t.kind, t.path, t.change, t.rule) not in seen]

    def _zero(
        self, info: dict[str, Any], reason: str, detail: str, *, error: str | None = None
    ) -> Grade:
        info = {**info, "tampered": [t.to_dict() for t in self._tampered]}
        out: dict[str, Any] = {"score_reason": reason, "detail": detail[-2000:], "integrity": info}
        if error is not None:
            out["error"] = error[-4000:]
        return Grade(0.0, out)


def _traceback(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc)).rstrip()


async def _writable(sandbox: GradingSandbox) -> bool:
    """Whether the grading scratch dir still takes a 1 MiB file (a full disk says no)."""
    try:
        done = await sandbox.run(
            f"head -c 1048576 /dev/zero > {sandbox.scratch}/probe && rm -f {sandbox.scratch}/probe",
            timeout=60,
            cwd="/",
        )
    except Exception:
        return False
    return done.exit_code == 0
