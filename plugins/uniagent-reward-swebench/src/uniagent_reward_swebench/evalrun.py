"""One evaluation's run, read by its structure, never by markers the tested code can print.

The runner (:func:`runner_script`) is one command of the grading sandbox: it goes
to the checkout, applies the test patch, prints ``@@uniagent-<nonce> tests`` and
then sources the eval script (read whole before it runs, so the tested code
cannot rewrite what follows). Everything after that line is the **test
region**: what the tested code prints lands there, and no marker in it counts.
The grader learns the rest from outside the region:

- the runner's own steps from nonce markers *before* the region (the tested code
  has not run yet: it cannot print them, whatever it learns of the nonce);
- the test command's exit status from the command's own exit status (the eval
  script ends with ``exit $SWEBENCH_TEST_EXIT_CODE``), which the host reads from
  the process, not from the log;
- a timeout and an output over the limit from the grading sandbox (``timed_out``,
  ``truncated``);
- the revert of the test patch from a second command.

Lines in the region shaped like swebench's structural markers (``>>>>> Tests
Errored``, ``>>>>> Test Exit Code: 0``, ``>>>>> Patch Apply Failed``, ...) are
defused before swebench reads the log, so printing them neither passes nor masks.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from uniagent_reward_swebench.harness import parse_eval_script
from uniagent_reward_swebench.scripts import (
    APPLY_PATCH_FAIL,
    END_TEST_OUTPUT,
    RESET_FAILED,
    TESTS_TIMEOUT,
)

TEST_EXIT_CODE = ">>>>> Test Exit Code"
TESTS_ERROR = ">>>>> Tests Errored"
#: swebench's markers that decide a log's fate wherever they appear; defused in the region.
_STRUCTURAL = (APPLY_PATCH_FAIL, RESET_FAILED, TESTS_ERROR, TESTS_TIMEOUT, TEST_EXIT_CODE)
#: The runner's exit statuses for its own failures (before the region).
WORKDIR_MISSING_EXIT = 3
PATCH_FAILED_EXIT = 4


def marker(nonce: str, what: str) -> str:
    """A structural line of the runner for this evaluation."""
    return f"@@uniagent-{nonce} {what}"


def with_exit_status(eval_script: str) -> tuple[str, bool]:
    """The eval script, made to exit with its test command's status; whether it could be.

    swebench's scripts end with a ``git checkout`` that resets the test files, so
    their own status is the reset's: the test command's status is recorded right
    after it runs (before the end-of-output marker) and the script exits with it.
    A script without the end marker is left as it is (its status says nothing).
    """
    body = parse_eval_script(eval_script)
    for i, line in enumerate(body):
        if END_TEST_OUTPUT in line:
            body = [
                *body[:i],
                "SWEBENCH_TEST_EXIT_CODE=$?",
                *body[i:],
                'exit "$SWEBENCH_TEST_EXIT_CODE"',
            ]
            return "\n".join(["#!/bin/bash", "set -uxo pipefail", *body]) + "\n", True
    return "\n".join(["#!/bin/bash", "set -uxo pipefail", *body]) + "\n", False


def runner_script(
    *,
    workdir: str,
    eval_script_path: str,
    test_patch_path: str | None,
    nonce: str,
    channel: tuple[str, str] | None = None,
) -> str:
    """The command that applies the test patch and sources the eval script (see the module).

    ``channel``: ``(hook_dir, record_path)``: the status recorder
    (:mod:`uniagent.grading.statuses`) is put in ``hook_dir``, the record file is
    made empty, and both are handed to the tests' Python through the environment.
    """
    q = shlex.quote
    lines = []
    if channel is not None:
        from uniagent import status_recorder

        lines.append(status_recorder(*channel, nonce).rstrip("\n"))
    lines += [
        f"cd {q(workdir)} 2>/dev/null || {{ echo {q(marker(nonce, 'workdir-missing'))}; "
        f"exit {WORKDIR_MISSING_EXIT}; }}",
    ]
    if test_patch_path is not None:
        lines.append(
            f"git apply -v {q(test_patch_path)} || {{ echo {q(marker(nonce, 'patch-failed'))}; "
            f"exit {PATCH_FAILED_EXIT}; }}"
        )
    lines += [f"echo {q(marker(nonce, 'tests'))}", f"source {q(eval_script_path)}"]
    return "\n".join(lines) + "\n"


#: A test patch up to this size is reverted after the run (it travels in the command's text:
#: one argument of a process holds at most 128 KiB on Linux).
MAX_INLINE_PATCH = 96 << 10


def revert_script(*, workdir: str, test_patch: str, nonce: str) -> str | None:
    """The command that reverts the test patch after the run (so that the sandbox can be graded
    again); it prints a nonce marker when it did. ``None`` for a patch too large to inline.

    The patch travels in the command itself, not in a file: the tested code has run by now
    and can have replaced any file of the sandbox (the next grading restores the test files
    from the grader's own snapshot either way).
    """
    if len(test_patch.encode("utf-8", "surrogateescape")) > MAX_INLINE_PATCH:
        return None
    end = f"EOF_{nonce}"
    q = shlex.quote
    return (
        f"cd {q(workdir)} && git apply -R - >/dev/null 2>&1 <<'{end}' && "
        f"echo {q(marker(nonce, 'reverted'))}\n{test_patch}\n{end}\n"
    )


@dataclass(frozen=True)
class EvalRun:
    """What the runner's command gave, split at the start of the test region."""

    before: str
    region: str
    exit_code: int | None
    exit_known: bool
    timed_out: bool = False
    truncated: bool = False
    reset_failed: bool = False
    #: Whether the runner reached the test region at all.
    started: bool = True
    workdir_missing: bool = False
    patch_failed: bool = False

    @classmethod
    def read(
        cls,
        output: str,
        nonce: str,
        *,
        exit_code: int | None,
        exit_known: bool,
        timed_out: bool = False,
        truncated: bool = False,
    ) -> EvalRun:
        """Split ``output`` at the first start line; the runner's steps from before it."""
        start = marker(nonce, "tests") + "\n"
        before, sep, region = output.partition(start)
        lines = before.splitlines()
        return cls(
            before=before,
            region=region,
            exit_code=exit_code,
            exit_known=exit_known and bool(sep),
            timed_out=timed_out,
            truncated=truncated,
            started=bool(sep),
            workdir_missing=not sep and marker(nonce, "workdir-missing") in lines,
            patch_failed=not sep and marker(nonce, "patch-failed") in lines,
        )

    def with_revert(self, output: str, nonce: str) -> EvalRun:
        """This run, with the revert command's output taken into account."""
        from dataclasses import replace

        return replace(self, reset_failed=marker(nonce, "reverted") not in output.splitlines())

    def swebench_log(self) -> str:
        """The log swebench grades: the region defused, the structure added from outside it."""
        if not self.started:
            return (
                self.before
                + (f"\n{APPLY_PATCH_FAIL}\n" if self.patch_failed else "")
                + (f"\n{TESTS_TIMEOUT}\n" if self.timed_out else "")
            )
        parts = [defuse(self.region)]
        if self.exit_known and self.exit_code is not None and not self.timed_out:
            parts.append(f"\n{TEST_EXIT_CODE}: {self.exit_code}\n")
        if self.timed_out:
            parts.append(f"\n{TESTS_TIMEOUT}\n")
        if self.reset_failed:
            parts.append(f"\n{RESET_FAILED}\n")
        return "".join(parts)


def grader_markers(region: str) -> list[str]:
    """The grader's structural markers (swebench's, the runner's nonce markers) that the test
    region holds: inert there, but only the tested code prints them (self-masking)."""
    found = [text for text in _STRUCTURAL if text in region]
    return [*found, *(["@@uniagent-"] if "@@uniagent-" in region else [])]


def defuse(region: str) -> str:
    """``region`` with swebench's structural markers made inert (they are the tested code's)."""
    for text in _STRUCTURAL:
        region = region.replace(text, text.replace(">>>>> ", ">>>>> (in the test output) "))
    return region
