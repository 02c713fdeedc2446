"""Hooks for every test suite of this repository (pytest loads this file for any test path
below it): ``--cpu-durations=N`` lists the N tests that used the most CPU, and a run with
``--dist loadgroup`` fails where pytest-xdist would ignore the ``xdist_group`` marks.

``--durations`` shows wall time, which on a busy machine (CI runs two suites side by side,
each on every core) says more about the neighbours than about the test. A test's CPU here
is that of the process running it and of the processes it started and waited for, from
the start of its set-up to the end of its teardown (a fixture shared by several tests
counts for the first that makes it). Processes nobody waits for (a container's, a sandbox's
under bubblewrap, whose init reaps them) are not counted.
"""

from __future__ import annotations

import resource
from typing import Any

import pytest

#: The user property that carries a test's CPU seconds from a worker to the report.
PROPERTY = "cpu_seconds"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("terminal reporting").addoption(
        "--cpu-durations",
        type=int,
        default=None,
        metavar="N",
        help="show the N tests that used the most CPU, set-up and teardown included (0: all)",
    )


def pytest_configure(config: pytest.Config) -> None:
    count = config.getoption("cpu_durations", None)
    if count is not None:
        config.pluginmanager.register(CpuDurations(count), "cpu-durations")


#: Why a test cannot run where it was sent (its xdist group was ignored).
_LOST = pytest.StashKey[str]()


@pytest.hookimpl(trylast=True)  # after xdist's own hook, which adds the groups to the ids
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In an xdist worker under ``--dist loadgroup``, every test with an ``xdist_group`` mark
    carries its group in its id by now: that is all xdist's scheduler reads. A pytest whose
    ids xdist can no longer change (pytest 9.2 with pytest-xdist 3.8: pytest-xdist#1386)
    spreads each group over the workers with no word (two Ray clusters, machine-wide tests
    side by side): here each such test fails instead (a worker cannot stop the run with a
    message of its own)."""
    if not getattr(config.option, "loadgroup", False):
        return
    lost = [
        item
        for item in items
        if item.get_closest_marker("xdist_group") and "@" not in item.nodeid.rpartition("]")[2]
    ]
    for item in lost:
        item.stash[_LOST] = (
            f"--dist loadgroup: pytest-xdist ignored the xdist_group marks of {len(lost)} "
            f"tests with pytest {pytest.__version__}: install a pytest that it supports "
            "(uniagent[test] pins one)"
        )


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if _LOST in item.stash:
        pytest.fail(item.stash[_LOST], pytrace=False)


def _cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    waited = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + waited.ru_utime + waited.ru_stime


_STARTED = pytest.StashKey[float]()


class CpuDurations:
    """Measures each test where it runs (an xdist worker too) and lists them where the
    reports arrive."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.rows: list[tuple[float, str]] = []

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> Any:
        item.stash[_STARTED] = _cpu()
        yield

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_teardown(self, item: pytest.Item) -> Any:
        yield
        started = item.stash.get(_STARTED, None)
        if started is not None:  # (the teardown's report is made after this, with it)
            item.user_properties.append((PROPERTY, round(_cpu() - started, 3)))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "teardown":
            for name, value in report.user_properties:
                if name == PROPERTY:
                    self.rows.append((float(value), report.nodeid))

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        rows = sorted(self.rows, reverse=True)
        shown = rows if self.count == 0 else rows[: self.count]
        total = sum(seconds for seconds, _ in rows)
        terminalreporter.write_sep(
            "=", f"slowest {len(shown)} tests by CPU ({total:.1f} s for {len(rows)} tests)"
        )
        for seconds, nodeid in shown:
            terminalreporter.write_line(f"{seconds:8.2f}s cpu  {nodeid}")
