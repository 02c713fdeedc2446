"""The ``swe_bench`` rewards' status channel: the log's statuses checked against the runner's.

The eval run gets the core's status recorder (:mod:`uniagent.grading.statuses`: a
grader-owned start-up module in the tests' Python that records what pytest, unittest
and Django's runner report, outside the log). The grader renders the records as lines
of the runner's own format and reads them with the row's own swebench parser
(:func:`judge`), so that both status maps name tests alike, and lists every graded test
the log counts as passed that the runner does not: the log was written to (0, a
``verdict`` tamper report). Only the two families the recorder knows are compared
(pytest's ``-rA`` parsers, Django's); for any other runner, or a run where no pytest
session or unittest run started under the recorder (a runner started through ``tox``,
say), the log alone decides, as before, and the result says so (``status_channel``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from uniagent import StatusRecords

#: The swebench parsers that read pytest's ``-rA`` lines, and Django's; the rest: log only.
PYTEST_PARSERS = frozenset(
    {"parse_log_pytest", "parse_log_pytest_options", "parse_log_pytest_v2"}
    | {"parse_log_matplotlib", "parse_log_seaborn"}
)
DJANGO_PARSERS = frozenset({"parse_log_django"})


def family(parser: Callable[..., Any] | None) -> str | None:
    """``"pytest"``, ``"unittest"`` or ``None``: which records a swebench parser is checked
    against (the parser's function, as swebench's registry maps the row's parser name)."""
    name = getattr(parser, "__name__", "")
    if name in PYTEST_PARSERS:
        return "pytest"
    if name in DJANGO_PARSERS:
        return "unittest"
    return None


#: The statuses swebench counts as passed.
PASSED = ("PASSED", "XFAIL")


@dataclass
class Verdict:
    """What the channel and the strict reading say about the graded tests."""

    #: ``compared``; ``absent`` (no session of the parser's family ran under the recorder);
    #: ``not_applicable`` (a parser of no family the channel knows); ``off``.
    state: str
    #: Graded tests the log counts as passed and the channel does not: ``{log, channel}``.
    disagreements: dict[str, dict[str, str | None]] = field(default_factory=dict)
    #: Graded tests swebench counts as passed that did not pass: why.
    not_passed: dict[str, str] = field(default_factory=dict)


def judge(
    *,
    parser: Callable[..., Any],
    test_spec: Any,
    log_map: dict[str, str],
    records: StatusRecords | None,
    fail_to_pass: list[str],
    pass_to_pass: list[str],
    normalize: Callable[[str], str] | None = None,
    resolve: Callable[[str, dict[str, str]], str | None] | None = None,
    strict: bool = True,
    expected: dict[str, str] | None = None,
) -> Verdict:
    """Check the graded tests of a parsed log (``log_map``, names as the task's lists name
    them) against the channel's records, and read them strictly.

    ``resolve`` finds a test's key in a status map (swebench's, which allows the truncated
    parametrised names of SWE-bench Verified); ``normalize`` is the row's test-name
    normalisation (SWE-rebench's timing suffixes), applied to the channel's names too.
    """
    find = resolve or (lambda test, statuses: test if test in statuses else None)
    kind = family(parser)
    if records is None:
        state = "off"
    elif kind is None:
        state = "not_applicable"
    elif kind not in records.sessions:
        state = "absent"
    else:
        state = "compared"
    channel: dict[str, str] = {}
    undeclared: dict[str, str] = {}
    if state == "compared" and records is not None and kind is not None:
        channel = _named(parser(records.log(kind), test_spec), normalize)
        undeclared = _named(parser(records.undeclared_xfail_log(), test_spec), normalize)
    verdict = Verdict(state)
    graded = [*fail_to_pass, *pass_to_pass]
    for test in graded:
        key = find(test, log_map)
        said = log_map.get(key) if key is not None else None
        if said not in PASSED:
            continue
        if state == "compared":
            other = find(test, channel)
            got = channel.get(other) if other is not None else None
            if got != said:
                verdict.disagreements[test] = {"log": said, "channel": got}
                continue
        if not strict or (expected is not None and expected.get(test) == said):
            continue
        if said == "XFAIL" and find(test, undeclared) is not None:
            verdict.not_passed[test] = (
                "XFAIL, and the test did not declare it (pytest.xfail() came from the code "
                "under test)"
            )
        elif said == "XFAIL" and state == "absent":
            verdict.not_passed[test] = (
                "XFAIL, and no record of the runner tells whether the test declared it (the "
                "status recorder did not run in the tests' Python)"
            )
    if strict:
        for test in pass_to_pass:
            key = find(test, log_map)
            skipped = key is not None and log_map[key] == "SKIPPED"
            if skipped and (expected is None or expected.get(test) != "SKIPPED"):
                verdict.not_passed[test] = "SKIPPED (a PASS_TO_PASS test must pass)"
    return verdict


def _named(statuses: dict[str, str], normalize: Callable[[str], str] | None) -> dict[str, str]:
    if normalize is None:
        return statuses
    return {normalize(k): v for k, v in statuses.items() if normalize(k)}
