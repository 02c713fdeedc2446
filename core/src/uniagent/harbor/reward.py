"""The ``harbor`` reward: a Harbor task's ``tests/test.sh`` as the verifier.

At grading time, in the grading sandbox (after the agent's processes were stopped and
the protected files put back): ``/tests`` and ``/logs/verifier`` must be empty (anything
there is the agent's, reported as tampering and scored 0); the task's ``tests/`` is copied
in (first into the grading scratch directory, which did not exist while the agent ran),
``test.sh`` runs in the work dir with the task's ``[verifier]`` timeout, env and user,
and the reward is read back through the sandbox's bounded reads: ``reward.txt`` (one
number), else ``reward.json`` / ``rewards.json`` (named numbers, each recorded in the
result's ``rewards``; ``reward_key`` picks one, by default ``reward`` or the only one,
else their mean). A verifier that runs past its timeout scores 0.

``test.sh`` runs the agent's code with the agent's rights, so a verifier that writes no
readable reward (it crashed, or wrote an empty file, not a number, bad JSON) may be the
agent's doing, and masking it would let the policy choose to be masked. So it runs once
more in the same sandbox (its inputs copied in again): a reward now is used, the first
failure kept in ``info["verifier_retried"]``. Failing again, it runs in the control
sandbox (``RewardContext.control``: the task as it was before the agent's first
command). A readable reward there makes the
failure the agent's: score 0, trained on, ``score_reason: verifier_failed`` with the
failures in ``error``. A failure or a timeout there too means the task's verifier is
broken (or the machine too slow): infrastructure (``reward_error``, masked and
retried), naming both. Without a control
(a grader embedded without ``open_fresh``) the failure is masked, an opening the message
names.
"""

from __future__ import annotations

import io
import json
import math
import posixpath
import shlex
import tarfile
import tempfile
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from uniagent.grading.sandbox import GradingReadError, GradingSandbox
from uniagent.harbor.paths import ARTIFACTS, TESTS
from uniagent.harbor.paths import VERIFIER_LOGS as LOGS
from uniagent.harbor.schema import expand_variables
from uniagent.reward import RewardContext, RewardInfraError, RewardResult

#: The reward files, in the order they are read (the first present wins).
REWARD_FILES = ("reward.txt", "reward.json", "rewards.json")
#: Bytes of a reward file read at most.
REWARD_BYTES = 1 << 20
#: Exit status of the wrapper when the verifier's user cannot be taken.
_NO_USER = 125


class HarborRewardConfig(BaseModel):
    """Settings of the ``harbor`` reward."""

    model_config = ConfigDict(extra="forbid")

    reward_key: str | None = Field(
        None,
        description="the named reward (of reward.json) used as the score; default: `reward`, "
        "or the only one, else `aggregate` over all",
    )
    aggregate: Literal["mean", "min"] = Field(
        "mean", description="how several named rewards make the score without reward_key"
    )
    timeout: float | None = Field(
        None, gt=0, description="seconds test.sh may run; default: the task's verifier.timeout_sec"
    )
    output_chars: int = Field(2000, ge=0, description="tail of the verifier's output kept")


def harbor_row(task: Mapping[str, Any]) -> Mapping[str, Any]:
    """The task's ``harbor`` section (made by the Harbor task loader)."""
    row = task.get("harbor")
    if not isinstance(row, Mapping) or not isinstance(row.get("dir"), str):
        raise RewardInfraError(
            "the harbor reward grades Harbor tasks: run it with --data on a Harbor task folder"
        )
    return row


def resolve_env(env: Mapping[str, str], where: str) -> dict[str, str]:
    """``${VAR}`` and ``${VAR:-default}`` in the values, from this process's environment
    (checked when the task was loaded: unset now, it is infrastructure)."""
    try:
        return expand_variables(env, where)
    except KeyError as exc:
        raise RewardInfraError(str(exc.args[0])) from None


def as_user(command: str, user: str | None) -> str:
    """``command`` run as ``user``: directly when the sandbox runs as that user, else with
    ``runuser`` (as root, where the sandbox can switch users: a container, not bubblewrap)."""
    if not user:
        return command
    u = shlex.quote(user)
    return (
        f'if [ "$(id -un)" = {u} ] || [ "$(id -u)" = {u} ]; then {command}; '
        f'elif [ "$(id -u)" = 0 ] && command -v runuser >/dev/null && runuser -u {u} -- true '
        f"2>/dev/null; then runuser -u {u} -- {command}; "
        f"else echo 'cannot run as user '{u}' here (it runs as '\"$(id -un)\"')'; "
        f"exit {_NO_USER}; fi"
    )


class VerifierInputsError(RuntimeError):
    """``/tests`` or ``/logs/verifier`` could not be listed or prepared.

    Not a :class:`RewardInfraError`: in a fresh sandbox both are absent or empty, so the
    grader decides (the agent's doing in a sandbox that still works: scored 0).
    """


async def verifier_inputs_left(sandbox: GradingSandbox) -> list[str]:
    """What is in ``/tests`` and ``/logs/verifier`` before the tests are copied in.

    Either may be a symlink to a private directory (the host backend's); what it
    leads to must be a directory or nothing (a symlink left there, a loop, a file: listed).
    """
    listing = await sandbox.run(
        f'for d in {TESTS} {LOGS}; do t=$(readlink -m "$d") || {{ echo "$d"; continue; }}; '
        'if [ -L "$t" ] || { [ -e "$t" ] && [ ! -d "$t" ]; }; then echo "$d"; '
        'elif [ -d "$t" ]; then find "$t" -mindepth 1 -maxdepth 2 | head -n 20; fi; done',
        timeout=60,
        cwd="/",
    )
    if listing.exit_code != 0 or listing.timed_out:
        raise VerifierInputsError(f"could not list {TESTS} and {LOGS}: {listing.output[-300:]}")
    return [line for line in listing.output.splitlines() if line.strip()]


async def copy_tests(sandbox: GradingSandbox, tests: Path, *, bundled: bool = False) -> None:
    """``tests/`` into the scratch dir (new at grading time), then into an empty ``/tests``;
    an empty ``/logs/verifier`` the verifier's user can write. ``bundled`` (a separate
    verifier's image that holds the tests): its own ``/tests`` is kept when it has a
    ``test.sh``, as Harbor keeps it."""
    staged = f"{sandbox.scratch}/tests"
    await sandbox.upload(str(tests), staged)
    copy = (
        f'mkdir -p "$t" && find "$t" -mindepth 1 -delete && cp -R {shlex.quote(staged)}/. "$t"/ '
        '&& chmod -R a+rX "$t"'
    )
    if bundled:
        copy = f'{{ [ -f "$t/test.sh" ] || {{ {copy}; }}; }}'
    done = await sandbox.run(
        f't=$(readlink -m {TESTS}) l=$(readlink -m {LOGS}) && mkdir -p "$l" && '
        f'find "$l" -mindepth 1 -delete && {copy} && chmod 777 "$l"',
        timeout=120,
        cwd="/",
    )
    if done.exit_code != 0:
        raise VerifierInputsError(f"could not copy the tests into {TESTS}: {done.output[-500:]}")


async def read_rewards(sandbox: GradingSandbox) -> tuple[str, dict[str, float]] | None:
    """The first reward file there is and its rewards; ``None`` when there is none."""
    for name in REWARD_FILES:
        try:
            data = await sandbox.read_bytes(f"{LOGS}/{name}", max_bytes=REWARD_BYTES)
        except GradingReadError:
            continue
        return name, parse_rewards(name, data.decode("utf-8", "replace"))
    return None


def parse_rewards(name: str, text: str) -> dict[str, float]:
    """The rewards of a reward file: ``reward.txt`` one number, the JSON files named ones."""
    if not text.strip():
        raise RewardInfraError(f"the verifier wrote an empty {name}")
    if name == "reward.txt":
        try:
            found: Any = {"reward": float(text.strip())}
        except ValueError:
            raise RewardInfraError(f"{name} is not a number: {text[:80]!r}") from None
    else:
        try:
            found = json.loads(text)
        except json.JSONDecodeError as exc:
            raise RewardInfraError(f"{name} is not valid JSON: {exc.msg}") from None
        if not isinstance(found, dict) or not found:
            raise RewardInfraError(f"{name} must be an object of named numbers")
    for key, value in found.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise RewardInfraError(f"{name}: reward {key!r} is not a number: {value!r}")
        if not math.isfinite(value):
            raise RewardInfraError(f"{name}: reward {key!r} is not finite: {value!r}")
    return {str(k): float(v) for k, v in found.items()}


def choose(rewards: Mapping[str, float], settings: HarborRewardConfig) -> tuple[str, float]:
    """The score of the rewards: the named one, ``reward``, the only one, or the aggregate."""
    key = settings.reward_key
    if key is not None:
        if key not in rewards:
            raise RewardInfraError(
                f"reward.settings.reward_key: the verifier wrote no reward {key!r} "
                f"(it wrote {', '.join(sorted(rewards))})"
            )
        return key, rewards[key]
    if "reward" in rewards:
        return "reward", rewards["reward"]
    if len(rewards) == 1:
        return next(iter(rewards.items()))
    values = list(rewards.values())
    score = min(values) if settings.aggregate == "min" else sum(values) / len(values)
    return settings.aggregate, score


class VerifierFailed(RewardInfraError):
    """``test.sh`` wrote no readable reward (it crashed, or wrote one that does not read)."""


async def run_verifier(
    sandbox: GradingSandbox,
    tests: Path,
    verifier: Mapping[str, Any],
    settings: HarborRewardConfig,
    timeout: float,
    *,
    bundled: bool = False,
) -> tuple[RewardResult, dict[str, Any]]:
    """``tests/`` copied in (``/tests`` and ``/logs/verifier`` emptied first; with
    ``bundled``, the image's own ``/tests`` is kept if it has a test.sh), ``test.sh`` run
    and its reward read: the result, and what the run showed (also on failure).

    Raises :class:`VerifierFailed` when no readable reward came of it.
    """
    await copy_tests(sandbox, tests, bundled=bundled)
    env = resolve_env(verifier.get("env") or {}, "verifier.env")
    command = " ".join(
        ["env", *(shlex.quote(f"{k}={v}") for k, v in env.items()), "bash", f"{TESTS}/test.sh"]
    )
    done = await sandbox.run(as_user(command, verifier.get("user")), timeout=timeout)
    shown: dict[str, Any] = {
        "exit_code": done.exit_code,
        "timed_out": done.timed_out,
        "output_tail": done.output[-settings.output_chars :] if settings.output_chars else "",
    }
    if done.timed_out:
        shown.update(score_reason="verifier_timed_out", detail=f"test.sh ran past {timeout:g} s")
        return RewardResult(0.0, shown), shown
    try:
        found = await read_rewards(sandbox)
        if found is None:
            raise VerifierFailed(
                f"the verifier crashed: test.sh exited {done.exit_code} and wrote none of "
                f"{', '.join(REWARD_FILES)} in {LOGS}; output: {done.output[-500:]}"
            )
        name, rewards = found
        key, score = choose(rewards, settings)
    except VerifierFailed:
        raise
    except RewardInfraError as exc:
        raise VerifierFailed(f"{exc} (test.sh exited {done.exit_code})") from None
    shown.update(reward_file=name, rewards=rewards, reward_key=key)
    return RewardResult(score, shown), shown


async def check_user(sandbox: GradingSandbox, verifier: Mapping[str, Any]) -> None:
    """The verifier's user can be taken here (else infrastructure), asked before
    ``test.sh`` runs: its exit status, which the tested code sets, says nothing of it."""
    user = verifier.get("user")
    if not user:
        return
    done = await sandbox.run(as_user("true", user), timeout=60, cwd="/")
    if done.exit_code == _NO_USER and "cannot run as user" in done.output:
        raise RewardInfraError(f"[verifier] user: {done.output.strip()[-200:]}")


async def harbor_reward(ctx: RewardContext[HarborRewardConfig]) -> RewardResult:
    """Run the task's verifier in the grading sandbox and score what it wrote; on a failure,
    once more there, then in the control sandbox to tell whose failure it is. A separate
    verifier runs in its own sandbox instead (:func:`separate_verifier`)."""
    settings = ctx.settings
    row = harbor_row(ctx.task)
    sandbox = ctx.require_sandbox()
    tests = Path(row["dir"]) / "tests"
    if not (tests / "test.sh").is_file():
        raise RewardInfraError(f"task {row.get('name')}: {tests}/test.sh is missing")
    verifier = dict(row.get("verifier") or {})
    timeout = settings.timeout or float(verifier.get("timeout_sec") or 600.0)
    info: dict[str, Any] = {"verifier_timeout": timeout}
    if row.get("verifier_mode") == "separate":
        return await separate_verifier(ctx, row, tests, verifier, timeout, info)
    left = await verifier_inputs_left(sandbox)
    if left:
        info.update(
            score_reason="tampered",
            detail=f"the agent left files where the verifier's inputs go: {', '.join(left)}",
            tampered=[{"kind": "verifier_input", "path": p} for p in left],
        )
        return RewardResult(0.0, info)
    try:
        await check_user(sandbox, verifier)
    except RewardInfraError as exc:
        if ctx.control is None:
            raise
        # The agent may have removed the user (or runuser): the task untouched tells.
        async with ctx.control() as control:
            await check_user(control, verifier)  # fails there too: infrastructure
        info.update(
            score_reason="verifier_failed",
            detail="the verifier's user cannot be taken after the agent's changes, and can "
            "on the task untouched by the agent",
            error=str(exc),
        )
        return RewardResult(0.0, info)
    # a second run in the same sandbox: the failure may have been transient
    done = await _twice(lambda: run_verifier(sandbox, tests, verifier, settings, timeout), info)
    if isinstance(done, RewardResult):
        return done
    return await judge_failure(ctx, tests, verifier, settings, timeout, info, done)


async def _twice(
    run: Callable[[], Awaitable[tuple[RewardResult, dict[str, Any]]]], info: dict[str, Any]
) -> RewardResult | list[str]:
    """The verifier's result with ``info``, from its first run or, that failing, its
    second (the first failure in ``verifier_retried``); both failures if both failed."""
    failures: list[str] = []
    for _ in range(2):
        try:
            result, shown = await run()
        except VerifierFailed as exc:
            failures.append(str(exc))
            continue
        if failures:
            info["verifier_retried"] = failures[0]
        return RewardResult(result.score, {**info, **shown})
    return failures


async def judge_failure(
    ctx: RewardContext[HarborRewardConfig],
    tests: Path,
    verifier: Mapping[str, Any],
    settings: HarborRewardConfig,
    timeout: float,
    info: dict[str, Any],
    failures: list[str],
) -> RewardResult:
    """The verifier failed twice on the agent's work: run it in the control sandbox (the
    task untouched). It works there: the agent broke it (0, trained on). It fails there
    too, or no control can be had: infrastructure (masked)."""
    first, second = failures
    if ctx.control is None:
        raise RewardInfraError(
            f"the verifier failed twice ({first}; again: {second}) and there is no control "
            "sandbox to tell whether the agent's changes made it fail, so the episode is "
            "masked (an opening: the policy can mask its failures by breaking the verifier; "
            "graded through uniagent run, verify or the verl adapter a control is started "
            "from the task's deployment)"
        )
    try:
        async with ctx.control() as control:
            await check_user(control, verifier)
            checked, shown = await run_verifier(control, tests, verifier, settings, timeout)
    except VerifierFailed as exc:
        raise RewardInfraError(
            f"the task's verifier is broken: it failed on the agent's work ({first}; "
            f"again: {second}) and on the task untouched by the agent ({exc})"
        ) from None
    except RewardInfraError:
        raise
    except Exception as exc:  # the control sandbox's own failure is never the agent's
        raise RewardInfraError(
            f"the verifier failed twice on the agent's work ({first}; again: {second}) and "
            f"the control sandbox failed too: {type(exc).__name__}: {exc}"
        ) from exc
    return _control_verdict(
        info, failures, checked, shown, timeout, "on the agent's work",
        "on the task untouched by the agent",
    )  # fmt: skip


def _control_verdict(
    info: dict[str, Any],
    failures: list[str],
    checked: RewardResult,
    shown: Mapping[str, Any],
    timeout: float,
    on: str,
    control: str,
) -> RewardResult:
    """The verifier failed twice ``on`` the agent's work, then ran in the control
    (``control`` says where): past its timeout there, it is broken for everyone or the
    machine is too slow (infrastructure); a reward there makes it 0, ``verifier_failed``."""
    first, second = failures
    if shown.get("timed_out"):
        raise RewardInfraError(
            f"the verifier failed twice {on} ({first}; again: {second}) and ran past its "
            f"timeout ({timeout:g} s) {control}"
        )
    info.update(
        score_reason="verifier_failed",
        detail=f"the verifier wrote no readable reward, twice, {on}; {control} it "
        f"{_outcome(checked, shown)}",
        error=f"{first}\nagain: {second}"[-4000:],
        verifier_retried=first,
        control={k: shown[k] for k in ("exit_code", "timed_out", "reward_file") if k in shown}
        | {"score": checked.score},
    )
    return RewardResult(0.0, info)


def _outcome(result: RewardResult, shown: Mapping[str, Any]) -> str:
    return f"wrote {shown.get('reward_file')} (score {result.score:g})"


# -- a separate verifier ------------------------------------------------------------------

#: Bytes of the agent's artifacts a separate verifier is given at most.
ARTIFACT_BYTES = 64 << 20

#: Packs the existing paths of $PATHS (one a line, relative to /) into $OUT: symlinks as
#: symlinks (never followed), special files as entries (left out when unpacked).
_PACK_ARTIFACTS = r"""
cd / || exit 3
: > "$OUT.list"
while IFS= read -r p; do
  if [ -e "$p" ] || [ -L "$p" ]; then printf '%s\n' "$p" >> "$OUT.list"; fi
done < "$PATHS"
tar --no-wildcards --verbatim-files-from -cf "$OUT" -T "$OUT.list" 2>"$OUT.err" \
  || { cat "$OUT.err"; exit 4; }
exit 0
"""


async def collect_artifacts(sandbox: GradingSandbox, paths: list[str], into: Path) -> list[str]:
    """The agent's ``paths`` (absolute) from its grading sandbox into ``into``, each at its
    own path below it; what was there.

    A tar made in the sandbox is read through the bounded read and unpacked here keeping
    only regular files and directories at or below one of ``paths``: no symlink or hard
    link (one could lead the verifier to its own files, ``../../tests/expected``), no
    device, FIFO or sparse member, nothing elsewhere (a replaced ``tar`` could name
    ``tests/test.sh``), at most :data:`ARTIFACT_BYTES` in all; modes as tarfile's
    ``data`` filter leaves them (no set-uid bits). Raises :class:`ArtifactsError` for an
    archive that does not read or is too large unpacked.
    """
    scratch = sandbox.scratch
    roots = [posixpath.normpath(p).lstrip("/") for p in paths]
    await sandbox.write_file(f"{scratch}/artifacts.paths", "".join(f"{r}\n" for r in roots))
    variables = f"PATHS={shlex.quote(scratch + '/artifacts.paths')} "
    variables += f"OUT={shlex.quote(scratch + '/artifacts.tar')}\n"
    done = await sandbox.run(variables + _PACK_ARTIFACTS, timeout=300, cwd="/")
    if done.exit_code != 0 or done.timed_out:
        raise ArtifactsError(f"packing the artifacts failed: {done.output[-500:]}")
    data = await sandbox.read_bytes(f"{scratch}/artifacts.tar", max_bytes=ARTIFACT_BYTES)
    unpack_artifacts(data, roots, into)
    return [p for p, r in zip(paths, roots, strict=True) if (into / r).exists()]


def unpack_artifacts(
    data: bytes, roots: list[str], into: Path, limit: int = ARTIFACT_BYTES
) -> None:
    """The tar ``data`` unpacked into ``into``: only regular files and directories at or
    below one of ``roots`` (relative paths), at most ``limit`` bytes of files in all (see
    :func:`collect_artifacts`); :class:`ArtifactsError` if it does not read or is too large."""
    total = 0

    def keep(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo | None:
        nonlocal total
        name = posixpath.normpath(member.name.lstrip("/"))
        inside = any(name == r or name.startswith(r + "/") for r in roots)
        if not inside or not (member.isreg() or member.isdir()) or member.issparse():
            return None
        total += member.size if member.isreg() else 0
        if total > limit:
            raise ArtifactsError(f"the artifacts unpack to more than {limit} bytes")
        try:
            return tarfile.data_filter(member, dest)
        except tarfile.FilterError:
            return None

    try:
        with tarfile.open(fileobj=io.BytesIO(data)) as archive:
            archive.extractall(into, filter=keep)
    except (tarfile.TarError, OSError, ValueError) as exc:
        raise ArtifactsError(f"the artifacts do not unpack: {type(exc).__name__}: {exc}") from None


class ArtifactsError(RuntimeError):
    """The agent's artifacts could not be packed in its sandbox (the agent's doing: its
    sandbox still works, and only what it wrote is packed)."""


async def place_artifacts(sandbox: GradingSandbox, staged: Path, found: list[str]) -> None:
    """The artifacts staged on this machine (``found``: the paths that were there) into the
    verifier's sandbox, each at its path."""
    if not found:
        return
    remote = f"{sandbox.scratch}/artifacts"
    await sandbox.upload(str(staged), remote)
    await sandbox.write_file(f"{remote}.list", "".join(f"{p.lstrip('/')}\n" for p in found))
    done = await sandbox.run(
        # (the host backend's /logs is a symlink into the sandbox's /tmp: kept, not replaced)
        f"set -o pipefail; cd {shlex.quote(remote)} && tar --no-wildcards --verbatim-files-from "
        f"-cf - -T {shlex.quote(remote + '.list')} | tar -xf - -C / "
        "--keep-directory-symlink --no-same-owner --no-overwrite-dir && "
        f'{{ a=$(readlink -m {ARTIFACTS}); [ ! -d "$a" ] || chmod -R a+rX "$a"; }}',
        timeout=300,
        cwd="/",
    )
    if done.timed_out:
        raise RewardInfraError("putting the agent's artifacts in the verifier's sandbox timed out")
    if done.exit_code != 0:
        # What they are is the agent's (a file where the verifier's image has a directory,
        # more than its disk takes): whose failure it is, the run without them tells.
        raise ArtifactsNotPlaced(
            f"the agent's artifacts could not be put in the verifier's sandbox (exit "
            f"{done.exit_code}): {done.output[-500:]}"
        )


class ArtifactsNotPlaced(VerifierFailed):
    """The artifacts did not go into the verifier's sandbox: a failure of the verifier on
    them, judged as one (again in a new sandbox, then without them)."""


async def separate_verifier(
    ctx: RewardContext[HarborRewardConfig],
    row: Mapping[str, Any],
    tests: Path,
    verifier: Mapping[str, Any],
    timeout: float,
    info: dict[str, Any],
) -> RewardResult:
    """The verifier in a sandbox of its own environment, given only the agent's artifacts
    (``/logs/artifacts`` and the task's ``artifacts``, each at its path).

    It fails twice (a new sandbox each time; the artifacts that cannot be put there count
    as a failure): run once more without the artifacts. A readable reward there makes the
    failure the artifacts' doing: the agent's, score 0. A failure there too is the task's
    or the machine's: infrastructure (masked).
    """
    if ctx.verifier is None:
        raise RewardInfraError(
            "this task's verifier runs in a separate environment, and this grader has no "
            "sandbox for it (the task row has no verifier_env: run it with --data on the "
            "Harbor task folder, through uniagent run, verify or data prepare with a config)"
        )
    bundled = bool(row.get("verifier_bundled"))
    with tempfile.TemporaryDirectory(prefix="uniagent-artifacts-") as tmp:
        staged = Path(tmp)
        try:
            found = await collect_artifacts(
                ctx.require_sandbox(), list(row.get("artifacts") or []), staged
            )
        except (ArtifactsError, GradingReadError) as exc:
            info.update(score_reason="artifacts_unreadable", detail=str(exc)[-1000:])
            return RewardResult(0.0, info)
        info["artifacts"] = found
        # each run in a new sandbox: a failure may have been transient
        done = await _twice(
            lambda: _verify_apart(ctx, (staged, found), tests, verifier, timeout, bundled), info
        )
    if isinstance(done, RewardResult):
        return done
    failures = done
    first, second = failures
    with tempfile.TemporaryDirectory(prefix="uniagent-artifacts-") as none:
        try:
            checked, shown = await _verify_apart(
                ctx, (Path(none), []), tests, verifier, timeout, bundled
            )
        except VerifierFailed as exc:
            raise RewardInfraError(
                f"the task's verifier is broken: it failed on the agent's artifacts ({first}; "
                f"again: {second}) and without them ({exc})"
            ) from None
    return _control_verdict(
        info, failures, checked, shown, timeout, "on the agent's artifacts", "without them"
    )


async def _verify_apart(
    ctx: RewardContext[HarborRewardConfig],
    artifacts: tuple[Path, list[str]],
    tests: Path,
    verifier: Mapping[str, Any],
    timeout: float,
    bundled: bool,
) -> tuple[RewardResult, dict[str, Any]]:
    """One run of the verifier in a new verifier sandbox given the artifacts (staged here,
    and the paths that were there).

    :class:`VerifierFailed` when it wrote no readable reward; any other failure there is
    infrastructure (the sandbox is never the agent's)."""
    if ctx.verifier is None:  # (checked by the caller)
        raise RewardInfraError("no verifier sandbox")
    try:
        async with ctx.verifier() as sandbox:
            await place_artifacts(sandbox, *artifacts)
            await check_user(sandbox, verifier)
            return await run_verifier(
                sandbox, tests, verifier, ctx.settings, timeout, bundled=bundled
            )
    except RewardInfraError:  # VerifierFailed included
        raise
    except Exception as exc:
        raise RewardInfraError(
            f"the verifier's sandbox failed: {type(exc).__name__}: {exc}"
        ) from exc
