"""``.ci/durations.py``: the table CI prints at the end of every run, passed or failed."""

from __future__ import annotations

import json
import os
import runpy
import select
import signal
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / ".ci" / "durations.py"
table = runpy.run_path(str(SCRIPT))["table"]


def test_each_session_is_a_row_with_its_failures_and_errors_and_the_totals(tmp_path):
    path = tmp_path / "durations.jsonl"
    rows = [
        {"session": "tests(suite='core')", "seconds": 313.4, "cpu_seconds": 203.2,
         "machine_busy": 0.934, "status": "passed", "tests": 922, "failures": 0, "errors": 0,
         "skipped": 2},
        {"session": "lint", "seconds": 61.0, "status": "failed"},  # before the cpu column
        {"session": "tests(suite='integration')", "seconds": 977.0, "cpu_seconds": 292.0,
         "status": "failed", "tests": 140, "failures": 1, "errors": 2},
    ]  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + "\n")
    lines = table(path).splitlines()
    assert lines[0].split() == [
        "session", "wall", "cpu", "all", "cpu", "busy", "status", "tests", "failed", "skipped"
    ]  # fmt: skip
    assert lines[1].split() == [
        "tests(suite='core')", "313s", "203s", "-", "93%", "passed", "922", "0", "2"
    ]  # fmt: skip
    assert lines[2].split() == ["lint", "61s", "-", "-", "-", "failed", "0", "0", "0"]
    assert lines[3].split()[-3:] == ["140", "3", "0"], "failures and errors are counted together"
    assert lines[4].split() == ["total", "1351s", "495s", "-", "1062"]
    assert "side by side" in lines[5]
    # .ci/lanes.py's line for a session (written after the session's own) joins its row.
    with path.open("a") as out:
        out.write(json.dumps({"session": "lint", "all_cpu_seconds": 70.4}) + "\n")
        out.write(json.dumps({"session": "gone", "all_cpu_seconds": 1.0}) + "\n")  # no row
    lines = table(path).splitlines()
    assert lines[2].split() == ["lint", "61s", "-", "70s", "-", "failed", "0", "0", "0"]
    assert lines[4].split() == ["total", "1351s", "495s", "70s", "1062"]


def test_no_rows_and_no_file_say_so(tmp_path):
    empty = tmp_path / "durations.jsonl"
    empty.write_text("")
    assert table(empty) == "no nox session recorded a duration"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path / "absent.jsonl")],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert done.stdout.strip() == f"{tmp_path / 'absent.jsonl'}: no durations recorded"


def test_the_machines_busy_share_over_the_run_is_read_from_proc_stat(tmp_path):
    path = tmp_path / "durations.jsonl"
    path.write_text(json.dumps({"session": "lint", "seconds": 1.0, "status": "passed"}) + "\n")
    # Counters of a start long ago: 900 ticks busy (user, nice, system) of 1,000.
    start = tmp_path / "stat-start"
    start.write_text("cpu  300 300 300 50 50 0 0 0 0 0\n")
    with open("/proc/stat") as stat:
        now = [int(word) for word in stat.readline().split()[1:9]]
    busy, total = sum(now) - sum(now[3:5]) - 900, sum(now) - 1000
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--since", str(start), str(path)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("ci: machine: ") and last.endswith(" CPUs busy over the run")
    share = int(last.split()[2].rstrip("%"))
    assert abs(share - 100 * busy / total) <= 1, (last, busy, total)


CPU = runpy.run_path(str(SCRIPT.with_name("cpu_by_program.py")))


def _record(name: bytes, utime: int, stime: int, version: int = 3) -> bytes:
    return CPU["RECORD"].pack(0, version, 0, 0, 0, 0, 1, 1, 0, 0.0, utime, stime,
                              0, 0, 0, 0, 0, 0, name)  # fmt: skip


def test_process_accounting_records_are_summed_by_program():
    # comp_t: 13 bits of mantissa, 3 of base-8 exponent, in ticks of 1/100 s.
    assert CPU["comp_t"](150) == 150.0 and CPU["comp_t"]((1 << 13) | 100) == 800.0
    data = b"".join([
        _record(b"git", 150, 50),  # 2 s
        _record(b"git", 100, 0),  # 1 s
        _record(b"podman", (1 << 13) | 100, 0),  # 8 s
        _record(b"old-format", 9000, 0, version=2),  # not read
    ])  # fmt: skip
    assert CPU["programs"](data) == {"git": [3.0, 2], "podman": [8.0, 1]}
    lines = CPU["report"](data).splitlines()
    assert lines[0].startswith("ci: cpu by program (every process of the machine that ended: 11 s;")
    assert lines[2].split() == ["podman", "8s", "73%", "1"]
    assert lines[3].split() == ["git", "3s", "27%", "2"]
    assert CPU["report"](b"") == "ci: cpu by program: no processes were accounted"


def _suite(tmp_path: Path, tests: str) -> None:
    """A tiny suite in ``tmp_path``: the repository's conftest.py and ``test_suite.py``."""
    root = Path(__file__).resolve().parent.parent
    (tmp_path / "conftest.py").write_text((root / "conftest.py").read_text())
    (tmp_path / "test_suite.py").write_text(tests)


def test_the_cpu_report_lists_tests_by_the_cpu_they_used_workers_included(tmp_path):
    """``--cpu-durations`` (the repository's conftest.py): a test that burns CPU in itself
    and in a process it waits for comes first, with both counted; under xdist the workers'
    figures reach the report."""
    _suite(
        tmp_path,
        "import subprocess, sys, time\n\n\n"
        "def _burn(seconds):\n"
        "    end = time.process_time() + seconds\n"
        "    while time.process_time() < end:\n"
        "        pass\n\n\n"
        "def test_burns():\n"
        "    _burn(0.3)\n"
        "    code = 'import time\\nend = time.process_time() + 0.3\\n'\n"
        "    code += 'while time.process_time() < end: pass'\n"
        "    subprocess.run([sys.executable, '-c', code], check=True)\n\n\n"
        "def test_idle():\n"
        "    pass\n",
    )
    for extra in ([], ["-n", "2"]):
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--cpu-durations=5",
             *extra, str(tmp_path)],
            capture_output=True, text=True, cwd=tmp_path,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        lines = done.stdout.splitlines()
        head = next(i for i, line in enumerate(lines) if "slowest 2 tests by CPU" in line)
        first, second = lines[head + 1].split(), lines[head + 2].split()
        assert first[2].endswith("test_burns") and second[2].endswith("test_idle"), lines
        assert float(first[0].rstrip("s")) >= 0.6  # its own 0.3 s and its child's
        assert float(second[0].rstrip("s")) < 0.3


LANES = runpy.run_path(str(SCRIPT.with_name("lanes.py")))

#: A stand-in for ``python -m nox -s SESSION``: it starts a process it never waits for (a
#: double fork, as a daemon or a sandbox's reaped process is) that burns 0.5 s of CPU, waits
#: for it to end (EOF on a pipe), and leaves a second one running.
FAKE_NOX = """\
import os, subprocess, sys, time
r, w = os.pipe()
if os.fork() == 0:
    if os.fork():
        os._exit(0)
    os.close(r)
    end = time.process_time() + 0.5
    while time.process_time() < end:
        pass
    os._exit(0)
os.close(w)
os.wait()
os.read(r, 1)
left = subprocess.Popen(["sleep", "600"], start_new_session=True)
open(sys.argv[1], "w").write(str(left.pid))
"""


def test_a_sessions_cpu_counts_every_process_it_started_and_those_left_are_named(tmp_path):
    """Where ``.ci/lanes.py`` can make cgroup v1 ``cpuacct`` groups (root, on these
    machines), each session's line in the durations file has the CPU of the processes it
    never waited for, and the processes it left running are named."""
    groups = LANES["CpuGroups"]()
    if groups.root is None:
        pytest.skip("no cgroup v1 cpuacct hierarchy this process may write")
    groups.root.rmdir()
    fake = tmp_path / "fake_nox.py"
    fake.write_text(FAKE_NOX)
    durations, left = tmp_path / "durations.jsonl", tmp_path / "left.pid"
    done = subprocess.run(
        [sys.executable, str(SCRIPT.with_name("lanes.py")), "--logs", str(tmp_path / "logs"),
         "--durations", str(durations), "--nox", f"{sys.executable} {fake} {left}", "one"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    pid = int(left.read_text()) if left.exists() else None
    try:
        assert done.returncode == 0 and pid is not None, done.stdout + done.stderr
        (record,) = [json.loads(line) for line in durations.read_text().splitlines()]
        assert record["session"] == "one" and record["all_cpu_seconds"] >= 0.5, record
        assert f"lanes: one left 1 processes running: {pid} sleep" in done.stdout
    finally:
        if pid is not None:
            # Its group: found by the process left in it (the lanes' root is named by their
            # pid); it stayed while the process was in it.
            groups_of = [
                g for g in groups.root.parent.glob("uniagent-ci-*/one")
                if str(pid) in (g / "cgroup.procs").read_text().split()
            ]  # fmt: skip
            exited = os.pidfd_open(pid)
            os.kill(pid, signal.SIGKILL)
            select.select([exited], [], [])  # (not a child of this process: no wait for it)
            os.close(exited)
            for group in groups_of:
                group.rmdir()
                group.parent.rmdir()


def test_tests_of_one_xdist_group_run_in_one_worker(tmp_path):
    """``--dist loadgroup`` as the verl suite uses it (the repository's conftest.py): the
    tests of one ``xdist_group`` share a worker. With a pytest whose node ids xdist cannot
    give the group to (pytest 9.2 with pytest-xdist 3.8), the conftest fails each of them."""
    _suite(
        tmp_path,
        "import os\n\nimport pytest\n\n\n"
        "@pytest.mark.xdist_group('one')\n"
        "@pytest.mark.parametrize('i', range(6))\n"
        "def test_grouped(i, tmp_path_factory):\n"
        "    out = tmp_path_factory.getbasetemp().parent.parent / f'grouped-{i}'\n"
        "    out.write_text(os.environ['PYTEST_XDIST_WORKER'])\n\n\n"
        "@pytest.mark.parametrize('i', range(6))\n"
        "def test_free(i):\n"
        "    pass\n",
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2", "--dist",
         "loadgroup", f"--basetemp={tmp_path / 'run'}", str(tmp_path)],
        capture_output=True, text=True, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    workers = {(tmp_path / f"grouped-{i}").read_text() for i in range(6)}
    assert len(workers) == 1, workers
