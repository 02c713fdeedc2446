"""Run an evaluation in the grading sandbox and grade its log with swebench.

The core's grader has already stopped the agent's processes, restored the
files of the test patch and the test-harness files from the task's base, and
opens a clean shell per command (see the core's docs/rewards.md). The log comes
back through the exec channel and is read by its structure
(:mod:`uniagent_reward_swebench.evalrun`): nothing the tested code prints or
writes decides what the grader believes about the run.
"""

from __future__ import annotations

import asyncio
import re
import secrets
import shlex
import tempfile
import time
from pathlib import Path
from typing import Any

from uniagent import (
    RewardContext,
    RewardResult,
    StatusRecords,
    keep_recorder,
    module_shadow_reports,
    read_status_records,
)
from uniagent_reward_swebench.channel import family, judge
from uniagent_reward_swebench.config import SweBenchRewardConfig
from uniagent_reward_swebench.errors import EvaluationInfraError
from uniagent_reward_swebench.evalrun import (
    EvalRun,
    grader_markers,
    revert_script,
    runner_script,
    with_exit_status,
)
from uniagent_reward_swebench.harness import harness_module, light_harness
from uniagent_reward_swebench.rows import EvalSpec
from uniagent_reward_swebench.scripts import (
    APPLY_PATCH_FAIL,
    END_TEST_OUTPUT,
    RESET_FAILED,
    START_TEST_OUTPUT,
    TESTS_TIMEOUT,
    patch_files,
)

#: Seconds the revert of the test patch may take.
REVERT_TIMEOUT = 60.0
#: Bytes of test output graded at most; a longer output scores 0 (``test_output_too_large``).
MAX_LOG_BYTES = 64 << 20
#: At most this many R2E-Gym status mismatches are listed in the result.
MAX_MISMATCHES = 50


def final_eval_script(spec: EvalSpec) -> str:
    """The eval script as the grader runs it: swebench's header, and it exits with the test
    command's status (see :func:`~uniagent_reward_swebench.evalrun.with_exit_status`)."""
    return with_exit_status(spec.eval_script)[0]


def _unparsed(spec: EvalSpec, error: str) -> dict[str, Any]:
    """The report of a log its parser failed on: nothing resolved."""
    f2p, p2p = list(spec.fail_to_pass), list(spec.pass_to_pass)
    return {
        "resolution_status": "RESOLVED_NO",
        "tests_status": {
            "FAIL_TO_PASS": {"success": [], "failure": f2p},
            "PASS_TO_PASS": {"success": [], "failure": p2p},
        },
        "test_output_found": False,
        "failure_reason": "log_parser_failed",
        "parser_error": error[-500:],
        "infra_failure": False,
        "infra_failure_reason": None,
        "resolved": False,
    }


def _failure_reason(log: str) -> str:
    if APPLY_PATCH_FAIL in log:
        return "test_patch_did_not_apply"
    if TESTS_TIMEOUT in log:
        return "tests_timed_out"
    if RESET_FAILED in log:
        return "reset_failed"
    if not (START_TEST_OUTPUT in log and END_TEST_OUTPUT in log):
        return "no_test_output_markers"
    return "no_test_results"


def grade(
    spec: EvalSpec, log: str, records: StatusRecords | None = None, *, strict: bool = True
) -> dict[str, Any]:
    """Parse the test log and grade it with swebench's harness; returns the report.

    A log parser that fails on the log (the tested code's output can make one
    fail) grades as unresolved, ``failure_reason: log_parser_failed``. ``records``: the
    status channel's (:mod:`uniagent_reward_swebench.channel`), checked against the log;
    ``strict``: a graded test passes only if it ran and passed (see the config).
    """
    light_harness()
    from swebench.harness import grading as swebench_grading
    from swebench.harness.constants import FAIL_TO_PASS, PASS_TO_PASS, EvalType, ResolvedStatus
    from swebench.harness.grading import (
        get_eval_tests_report,
        get_logs_eval,
        get_resolution_status,
        parse_test_exit_code,
    )
    from swebench.harness.infra_failure import TIER_ENVIRONMENT, classify_text
    from swebench.harness.log_parsers import PARSER_REGISTRY
    from swebench.types import TestSpec

    test_spec = TestSpec(
        instance_id=spec.instance_id,
        image="",
        eval_script_list=[],
        repo=spec.repo,
        version="",
        FAIL_TO_PASS=list(spec.fail_to_pass),
        PASS_TO_PASS=list(spec.pass_to_pass),
        log_parser=spec.log_parser,
        eval_type=spec.eval_type,
    )
    with tempfile.TemporaryDirectory(prefix="uniagent-swebench-") as tmp:
        log_path = Path(tmp) / "test_output.txt"
        log_path.write_text(log, errors="surrogateescape")
        try:
            status_map, found = get_logs_eval(test_spec, str(log_path))
        except Exception as exc:  # a parser that chokes on what the tests printed
            return _unparsed(spec, f"{type(exc).__name__}: {exc}")

    parser = PARSER_REGISTRY[spec.log_parser]
    f2p, p2p = list(spec.fail_to_pass), list(spec.pass_to_pass)
    normalize = spec.normalize_test_name
    inconsistent = not found and _exit_contradicts_log(parser, test_spec, log, parse_test_exit_code)
    if normalize is not None:
        status_map = {normalize(k): v for k, v in status_map.items() if normalize(k)}
        f2p, p2p = [normalize(t) for t in f2p], [normalize(t) for t in p2p]
    report = get_eval_tests_report(
        status_map, {FAIL_TO_PASS: f2p, PASS_TO_PASS: p2p}, eval_type=EvalType(spec.eval_type)
    )
    status = get_resolution_status(report) if found else ResolvedStatus.NO.value
    resolved = status == ResolvedStatus.FULL.value
    result: dict[str, Any] = {
        "resolution_status": status,
        "tests_status": {FAIL_TO_PASS: report[FAIL_TO_PASS], PASS_TO_PASS: report[PASS_TO_PASS]},
        "test_output_found": found,
        "failure_reason": None,
        "infra_failure": False,
        "infra_failure_reason": None,
    }
    if not found:
        result["failure_reason"] = _failure_reason(log)
        classification = classify_text(log)
        if classification:
            reason, tier = classification
            result["infra_failure"] = tier == TIER_ENVIRONMENT
            result["infra_failure_reason"] = reason
    verdict = judge(
        parser=parser,
        test_spec=test_spec,
        log_map=status_map if found else {},
        records=records,
        fail_to_pass=f2p,
        pass_to_pass=p2p,
        normalize=normalize,
        resolve=getattr(swebench_grading, "_resolve_case", None),
        strict=strict,
        expected=None if spec.expected_statuses is None else dict(spec.expected_statuses),
    )
    result["status_channel"] = verdict.state
    if verdict.disagreements:
        result["status_disagreements"] = dict(list(verdict.disagreements.items())[:MAX_MISMATCHES])
        resolved = False
    if verdict.not_passed:
        result["not_passed"] = dict(list(verdict.not_passed.items())[:MAX_MISMATCHES])
        resolved = False
    if inconsistent:
        result["inconsistent_exit"] = True
    if spec.expected_statuses is not None and found:
        expected = dict(spec.expected_statuses)
        keys = sorted(set(expected) | set(status_map))
        mismatches = {
            k: {"expected": expected.get(k), "got": status_map.get(k)}
            for k in keys
            if expected.get(k) != status_map.get(k)
        }
        result["exact_match"] = not mismatches
        result["status_mismatches"] = dict(list(mismatches.items())[:MAX_MISMATCHES])
        resolved = resolved and not mismatches
    result["resolved"] = resolved
    return result


#: A line of an eval script that sets ``PYTHONPATH`` and does nothing else.
def _exit_contradicts_log(parser: Any, test_spec: Any, log: str, exit_code_of: Any) -> bool:
    """The test command exited non-zero while its log reports tests and not one failure.

    swebench's harness already grades such a log as no result; this says why: the log
    does not describe the run that happened (statuses printed by the tested code).
    """
    code = exit_code_of(log)
    if code in (None, 0):
        return False
    try:
        statuses = parser(log, test_spec)
    except Exception:  # the parser's failure is graded already (log_parser_failed)
        return False
    return bool(statuses) and not any(s in ("FAILED", "ERROR") for s in statuses.values())


#: Status words of test-result lines (pytest's -rA / -v, Django's and unittest's verbose lines).
_STATUS = re.compile(
    r"\b(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b|\.\.\.\s*(ok|FAIL|ERROR|skipped)\b"
)
_EQUIVALENT = {"ok": "PASSED", "FAIL": "FAILED", "skipped": "SKIPPED"}


def conflicting_results(log: str, tests: list[str]) -> dict[str, list[str]]:
    """Tests that the log reports with more than one distinct status.

    A real runner reports each test once (or the same status twice: progress and
    summary); conflicting lines mean something printed fake results into the log
    (code of the agent running at exit, say). Such a test counts as failed.
    """
    wanted = set(tests)
    seen: dict[str, set[str]] = {}
    for line in log.splitlines():
        match = _STATUS.search(line)
        if match is None:
            continue
        status = match.group(1) or _EQUIVALENT.get(match.group(2), match.group(2))
        for name in wanted:
            if name in line:
                seen.setdefault(name, set()).add(status)
    return {name: sorted(s) for name, s in seen.items() if len(s) > 1}


def _parser(name: str) -> Any:
    return harness_module("log_parsers").PARSER_REGISTRY.get(name)


def _verdict_tampering(
    result: dict[str, Any], record_problem: str | None, record_path: str
) -> list[dict[str, str]]:
    """Tamper reports (kind ``verdict``) for what the status checks found."""
    reports: list[dict[str, str]] = []
    for test, seen in result.get("status_disagreements", {}).items():
        reports.append({
            "kind": "verdict", "rule": "status-channel", "path": test,
            "change": f"the log says {seen['log']}, the runner {seen['channel'] or 'nothing'}",
            "detail": "the test log reports statuses the test runner did not",
        })  # fmt: skip
    if record_problem == "removed":
        reports.append({
            "kind": "verdict", "rule": "status-record", "path": record_path, "change": "removed",
            "detail": "the test run removed the grader's status record",
        })  # fmt: skip
    if result.get("inconsistent_exit"):
        reports.append({
            "kind": "verdict", "rule": "inconsistent-exit", "path": "",
            "change": "exited non-zero while its log reports no failing test",
            "detail": "the test command failed while its log reports no failure",
        })  # fmt: skip
    return reports


async def evaluate(
    ctx: RewardContext[SweBenchRewardConfig], spec: EvalSpec, config: SweBenchRewardConfig
) -> RewardResult:
    """Apply the test patch, run the eval script in the grading sandbox, grade; 1.0 if resolved."""
    sandbox = ctx.require_sandbox()
    q = shlex.quote
    nonce = secrets.token_hex(16)
    scratch = f"{sandbox.scratch}/swebench"
    eval_path = f"{scratch}/eval.sh"
    patch_path = f"{scratch}/test.patch" if spec.apply_test_patch else None
    patch = spec.test_patch if spec.test_patch.endswith("\n") else spec.test_patch + "\n"
    # Importing swebench's harness takes about a second: keep it off the event loop.
    eval_text, exit_known = await asyncio.to_thread(with_exit_status, spec.eval_script)
    # The status channel, where the row's parser reads a family the recorder knows.
    record_path, hook_dir = f"{scratch}/status-{nonce}.jsonl", f"{scratch}/hook-{nonce}"
    channel = config.status_channel and family(_parser(spec.log_parser)) is not None
    if channel:
        eval_text = keep_recorder(eval_text, hook_dir)

    made = await sandbox.run(f"mkdir -p {q(scratch)}", timeout=60, cwd="/")
    if made.exit_code != 0:
        raise RuntimeError(f"could not create {scratch} in the sandbox ({made.output[-300:]})")
    started = time.monotonic()
    await sandbox.write_file(eval_path, eval_text)
    if patch_path is not None:
        await sandbox.write_file(patch_path, patch)
    runner = runner_script(
        workdir=spec.workdir,
        eval_script_path=eval_path,
        test_patch_path=patch_path,
        nonce=nonce,
        channel=(hook_dir, record_path) if channel else None,
    )
    done = await sandbox.run(runner, timeout=config.eval_timeout, cwd="/", max_bytes=MAX_LOG_BYTES)
    elapsed = time.monotonic() - started
    run = EvalRun.read(
        done.output, nonce, exit_code=done.exit_code, exit_known=exit_known,
        timed_out=done.timed_out, truncated=done.truncated,
    )  # fmt: skip
    if run.workdir_missing:
        raise EvaluationInfraError(
            f"the work dir {spec.workdir!r} does not exist in the sandbox; set the reward "
            "config's workdir to the repository checkout (default /testbed, as in SWE-bench "
            "images)"
        )
    revert = None
    if patch_path is not None and run.started:
        revert = revert_script(workdir=spec.workdir, test_patch=patch, nonce=nonce)
    if revert is not None:
        reverted = await sandbox.run(revert, timeout=REVERT_TIMEOUT, cwd="/", max_bytes=1 << 16)
        run = run.with_revert(reverted.output, nonce)
    # No records: the channel is off; empty ones: a parser of no family it knows.
    records = StatusRecords() if config.status_channel and not channel else None
    record_problem = None
    if channel and run.started:
        records, record_problem = await read_status_records(sandbox, record_path)
    log = run.swebench_log()
    result = await asyncio.to_thread(grade, spec, log, records, strict=config.strict_statuses)
    tampered = _verdict_tampering(result, record_problem, record_path)
    if records is not None and records.shadows:
        owned = [f.path for f in patch_files(spec.test_patch)]
        shadows = await module_shadow_reports(
            sandbox, records, spec.workdir, spec.base_commit, owned
        )
        detail = "the tests imported a module of the agent's that shadows the standard library"
        tampered += [{**t, "detail": detail} for t in shadows]
        if tampered:
            result["resolved"] = False
    if record_problem is not None:
        result.update(resolved=False, status_channel=record_problem)
    if run.truncated:
        result.update(resolved=False, failure_reason="test_output_too_large")
    if result["infra_failure"] and config.infra_failure_is_error:
        raise EvaluationInfraError(
            f"the evaluation of {spec.instance_id} failed for environmental reasons "
            f"({result['infra_failure_reason']}); the log ends with:\n{log[-1500:]}"
        )
    conflicts = conflicting_results(run.region, [*spec.fail_to_pass, *spec.pass_to_pass])
    if conflicts:
        result["resolved"] = False
        result["conflicting_results"] = conflicts
    # What the tested code did to its output, for the probing counters (the score is as
    # graded): grader markers or a parser crash (self-masking), conflicting results (fakes).
    markers = grader_markers(run.region) if run.started else []
    probing = {
        *(["self_masking"] if markers or result["failure_reason"] == "log_parser_failed" else []),
        *(["artifacts"] if conflicts else []),
    }
    tail = done.output[-config.log_tail_chars :] if config.log_tail_chars else ""
    info: dict[str, Any] = {
        "dataset": spec.dataset,
        "instance_id": spec.instance_id,
        **result,
        "test_patch_applied": None if patch_path is None else not run.patch_failed,
        "test_exit_code": run.exit_code if run.exit_known else None,
        "log_parser": spec.log_parser,
        "eval_type": spec.eval_type,
        "eval_seconds": round(elapsed, 3),
        "log_tail": tail,
    }
    if tampered:
        info.update(
            score_reason="tampered",
            detail="; ".join(sorted({t["detail"] for t in tampered})),
            tampered=[{k: v for k, v in t.items() if k != "detail"} for t in tampered],
        )
    if markers:
        info["markers_in_test_output"] = markers
    if probing:
        info["probing"] = sorted(probing)
    return RewardResult(score=1.0 if result["resolved"] else 0.0, info=info)
