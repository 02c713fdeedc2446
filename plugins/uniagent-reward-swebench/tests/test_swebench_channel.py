"""The status channel: the runner's own word on each test, checked against the log.

End to end in a real host sandbox (the grader's baseline first, then the agent's
edit, then the reward in a clean grading shell), with a pytest layout and a Django
layout (a runner that lives in the repository, graded with swebench's Django parser).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from swebench_helpers import FIXED, CalcRepo, django_row, make_django_repo, swe_bench_row
from uniagent_reward_swebench.channel import judge

from uniagent import StatusRecords
from uniagent.testing import grade, prepare_grader


async def graded(env: Any, repo: CalcRepo, row: dict[str, Any], calc: str, **config: Any) -> Any:
    """The grader's baseline, then ``calc.py`` as the agent leaves it, then the reward."""
    grader = await prepare_grader(
        env, "swe_bench", row, settings={"workdir": str(repo.path), **config}
    )
    await env.write_file(str(repo.path / "calc.py"), calc)
    return await grade(grader, env)


#: The code under test finishes the runner's status line of its own test: Django's verbose
#: format prints "test_add (...) ... " before the test and the status after it.
FINISH_THE_LINE = "import sys\n\n\ndef add(a, b):\n    sys.stderr.write('ok\\n')\n" + (
    "    sys.stderr.flush()\n    return a - b\n\n\ndef sub(a, b):\n    return a - b\n"
)
#: The code under test marks its own failure as expected (swebench counts XFAIL as passed).
SELF_XFAIL = (
    "def add(a, b):\n    import pytest\n\n    if a - b != a + b:\n"
    "        pytest.xfail('known')\n    return a - b\n\n\ndef sub(a, b):\n    return a - b\n"
)
#: Print every graded test as passed where the runner's own stdout goes, then leave before
#: pytest reports anything (the words and the exit put together, past the patch screen's rules).
PRINT_AND_LEAVE = """import os
import stat

WORD = "PAS" + "SED"
TESTS = ("test_calc.py::test_sub", "test_calc.py::test_add", "test_more.py::test_add_many")
LINES = "".join(f"{WORD} {test}\\n" for test in TESTS).encode()


def add(a, b):
    for fd in range(1, 64):
        try:
            if stat.S_ISFIFO(os.fstat(fd).st_mode):
                os.write(fd, LINES)
        except OSError:
            pass
    getattr(os, "_ex" + "it")(0)


def sub(a, b):
    return a - b
"""


@pytest.fixture
def django_repo(tmp_path: Path) -> CalcRepo:
    return make_django_repo(tmp_path)


async def test_a_fix_in_the_pytest_layout_is_compared_and_scores(host_env, calc_repo) -> None:
    result = await graded(host_env, calc_repo, swe_bench_row(calc_repo), FIXED)
    assert result.score == 1.0
    assert result.info["status_channel"] == "compared"
    assert "tampered" not in result.info


async def test_a_fix_in_the_django_layout_is_compared_and_scores(host_env, django_repo) -> None:
    result = await graded(host_env, django_repo, django_row(django_repo), FIXED)
    assert result.score == 1.0, result.info
    assert result.info["status_channel"] == "compared"


async def test_code_that_finishes_its_own_status_line_scores_zero(host_env, django_repo) -> None:
    row = django_row(django_repo)
    result = await graded(host_env, django_repo, row, FINISH_THE_LINE)
    assert result.score == 0.0
    [test] = __import__("json").loads(row["FAIL_TO_PASS"])
    assert result.info["status_disagreements"] == {test: {"log": "PASSED", "channel": "FAILED"}}
    assert result.info["tampered"] == [
        {
            "kind": "verdict",
            "rule": "status-channel",
            "path": test,
            "change": "the log says PASSED, the runner FAILED",
        }
    ]
    assert result.info["score_reason"] == "tampered"
    # The log alone (swebench's reading) is fooled: this is what the channel is for.
    fooled = await graded(host_env, django_repo, row, FINISH_THE_LINE, status_channel=False)
    assert fooled.score == 1.0
    assert fooled.info["status_channel"] == "off"


async def test_code_that_marks_its_own_failure_expected_scores_zero(host_env, calc_repo) -> None:
    row = swe_bench_row(calc_repo)
    result = await graded(host_env, calc_repo, row, SELF_XFAIL)
    assert result.score == 0.0
    tests = {"test_calc.py::test_add", "test_more.py::test_add_many"}
    assert set(result.info["not_passed"]) == tests
    assert "tampered" not in result.info  # not passed; nothing says the log was written to
    lenient = await graded(host_env, calc_repo, row, SELF_XFAIL, strict_statuses=False)
    assert lenient.score == 1.0  # swebench's reading counts XFAIL as passed


async def test_statuses_printed_by_code_that_leaves_early_score_zero(host_env, calc_repo) -> None:
    result = await graded(host_env, calc_repo, swe_bench_row(calc_repo), PRINT_AND_LEAVE)
    assert result.score == 0.0
    assert result.info["status_disagreements"]["test_calc.py::test_add"] == {
        "log": "PASSED",
        "channel": "ERROR",  # set up, never reported as run
    }
    assert {t["rule"] for t in result.info["tampered"]} == {"status-channel"}
    row = swe_bench_row(calc_repo)
    fooled = await graded(host_env, calc_repo, row, PRINT_AND_LEAVE, status_channel=False)
    assert fooled.score == 1.0  # the log alone believes it


def _judge(log_map: dict[str, str], records: str, parser: Any, **kw: Any) -> Any:
    return judge(
        parser=parser,
        test_spec=None,
        log_map=log_map,
        records=StatusRecords.parse(records),
        fail_to_pass=kw.pop("f2p", ["t.py::a"]),
        pass_to_pass=kw.pop("p2p", ["t.py::b"]),
        **kw,
    )


def test_the_channel_speaks_only_for_runs_it_saw() -> None:
    from swebench.harness.log_parsers.python import parse_log_pytest, parse_log_sympy

    passed = {"t.py::a": "PASSED", "t.py::b": "PASSED"}
    # No pytest session ran under the recorder (a runner started through tox): the log alone.
    assert _judge(passed, "", parse_log_pytest).state == "absent"
    # A runner the channel does not know.
    assert _judge(passed, '{"f": "pytest", "session": true}', parse_log_sympy).state == (
        "not_applicable"
    )
    # A session, and a test the log says passed that the runner never reported.
    run = [
        '{"f": "pytest", "session": true}',
        '{"f": "pytest", "id": "t.py::b", "when": "call", "o": "passed", "xfail": false}',
        "not a record",
    ]
    verdict = _judge(passed, "\n".join(run), parse_log_pytest)
    assert verdict.state == "compared"
    assert verdict.disagreements == {"t.py::a": {"log": "PASSED", "channel": None}}
    assert StatusRecords.parse("\n".join(run)).malformed == 1


def test_a_declared_xfail_counts_and_a_skipped_pass_to_pass_test_does_not() -> None:
    from swebench.harness.log_parsers.python import parse_log_pytest

    log_map = {"t.py::a": "XFAIL", "t.py::b": "SKIPPED"}
    run = [
        '{"f": "pytest", "session": true}',
        '{"f": "pytest", "id": "t.py::a", "when": "call", "o": "skipped", "xfail": true, '
        '"declared_xfail": true}',
        '{"f": "pytest", "id": "t.py::b", "when": "call", "o": "skipped", "xfail": false}',
    ]
    verdict = _judge(log_map, "\n".join(run), parse_log_pytest)
    assert verdict.disagreements == {}
    assert verdict.not_passed == {"t.py::b": "SKIPPED (a PASS_TO_PASS test must pass)"}
    # The task's own expected statuses may say a test is skipped.
    expected = {"t.py::a": "XFAIL", "t.py::b": "SKIPPED"}
    assert _judge(log_map, "\n".join(run), parse_log_pytest, expected=expected).not_passed == {}
    assert _judge(log_map, "\n".join(run), parse_log_pytest, strict=False).not_passed == {}


def test_with_no_record_of_the_run_no_expected_failure_counts() -> None:
    from swebench.harness.log_parsers.python import parse_log_pytest

    log_map = {"t.py::a": "XFAIL", "t.py::b": "PASSED"}
    verdict = _judge(log_map, "", parse_log_pytest)
    assert verdict.state == "absent" and list(verdict.not_passed) == ["t.py::a"]
    assert "no record of the runner" in verdict.not_passed["t.py::a"]
    assert _judge(log_map, "", parse_log_pytest, expected={"t.py::a": "XFAIL"}).not_passed == {}
    assert _judge(log_map, "", parse_log_pytest, strict=False).not_passed == {}


def test_an_eval_script_that_sets_pythonpath_keeps_the_recorder_first(tmp_path: Path) -> None:
    """``export PYTHONPATH=...`` in the eval script would start the tests' Python without the
    recorder: it is put first again after each such statement (a one-command prefix is not
    one: that command's own environment)."""
    import subprocess

    from uniagent_reward_swebench.evaluate import keep_recorder

    hook = tmp_path / "hook dir"
    script = (
        'set -u\nexport PYTHONPATH=/src\necho "1:$PYTHONPATH"\n'
        '  export PYTHONPATH="$PYTHONPATH:/lib"\necho "2:$PYTHONPATH"\n'
        "export PYTHONPATH=/a && echo \"3:$PYTHONPATH\"\nPYTHONPATH=/b sh -c 'echo 4:$PYTHONPATH'\n"
    )
    kept = keep_recorder(script, str(hook))
    out = subprocess.run(
        ["bash", "-c", kept], env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(hook)},
        capture_output=True, text=True, check=True,
    ).stdout.splitlines()  # fmt: skip
    assert out == [
        f"1:{hook}:/src",
        f"2:{hook}:{hook}:/src:/lib",
        f"3:{hook}:/a",
        "4:/b",
    ]
