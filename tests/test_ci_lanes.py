"""``.ci/lanes.py``: CI's nox sessions side by side, each log whole, every failure counted.

The sessions here are a stand-in for ``python -m nox -s NAME``: a script that leaves
files saying when it started and ended and synchronises on the other sessions' files
(never on time), so the tests show what overlaps and what does not.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

LANES = Path(__file__).resolve().parent.parent / ".ci" / "lanes.py"

#: ``-s NAME [-- ARGS]``: says it started, does what its name asks, says it ended.
FAKE_NOX = textwrap.dedent(
    """
    import json, os, sys, time
    from pathlib import Path
    argv = sys.argv[1:]
    name = argv[argv.index("-s") + 1]
    posargs = argv[argv.index("--") + 1:] if "--" in argv else []
    marks = Path(os.environ["MARKS"])
    # sessions that must not run now (apart.json: name -> names)
    rules = marks / "apart.json"
    apart = json.loads(rules.read_text()) if rules.exists() else {}
    for other in apart.get(name, []):
        if (marks / f"{other}.started").exists() and not (marks / f"{other}.ended").exists():
            sys.exit(f"{name} started beside {other}")
    (marks / f"{name}.started").touch()

    def wait_for(path):
        deadline = time.monotonic() + 120  # a safety net only: the partner shows up at once
        while not path.exists():
            if time.monotonic() > deadline:
                sys.exit(f"{name}: {path.name} never appeared")
            time.sleep(0.01)

    if name == "sleeper":  # runs until it is stopped
        (marks / "sleeper.pid").write_text(str(os.getpid()))
        (marks / "sleeper.ready").touch()
        time.sleep(600)
    for line in range(200):
        print(f"{name} line {line}", flush=True)
    if name.startswith("pair-"):  # both of a pair must run at once
        wait_for(marks / f"pair-{'b' if name == 'pair-a' else 'a'}.started")
    if name == "alone":  # every other session has ended, none runs beside it
        started = {p.stem for p in marks.glob("*.started")} - {"alone"}
        ended = {p.stem for p in marks.glob("*.ended")}
        if started != ended:
            sys.exit(f"alone started beside {sorted(started - ended)}")
    if posargs:
        print("posargs", " ".join(posargs))
    (marks / f"{name}.ended").touch()
    sys.exit(7 if name == "broken" else 0)
    """
)


def lanes_argv(tmp_path: Path, *args: str) -> tuple[list[str], dict[str, str]]:
    fake = tmp_path / "fake_nox.py"
    fake.write_text(FAKE_NOX)
    marks = tmp_path / "marks"
    marks.mkdir(exist_ok=True)
    nox = f"{sys.executable} {fake}"
    argv = [sys.executable, str(LANES), "--nox", nox, "--logs", str(tmp_path / "logs"), *args]
    return argv, {"MARKS": str(marks), "PATH": "/usr/bin:/bin"}


def run_lanes(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    argv, env = lanes_argv(tmp_path, *args)
    return subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env)


def blocks(stdout: str) -> dict[str, list[str]]:
    """Each session's printed log, between its header and its result line."""
    found: dict[str, list[str]] = {}
    current = None
    for line in stdout.splitlines():
        if line.startswith("lanes: ===== "):
            current = line.removeprefix("lanes: ===== ").removesuffix(" =====")
            found[current] = []
        elif current is not None and line.startswith(f"lanes: {current} "):
            current = None
        elif current is not None:
            found[current].append(line)
    return found


def test_two_lanes_run_two_sessions_at_once_and_each_log_is_printed_whole(tmp_path):
    proc = run_lanes(tmp_path, "--lanes", "2", "pair-a", "pair-b")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    printed = blocks(proc.stdout)
    for name in ("pair-a", "pair-b"):
        assert printed[name] == [f"{name} line {n}" for n in range(200)]
    assert "lanes: 2 sessions" in proc.stdout and "all passed" in proc.stdout


def test_a_session_run_alone_starts_after_every_other_has_ended(tmp_path):
    names = ["pair-a", "pair-b", "c", "d", "alone"]
    proc = run_lanes(tmp_path, "--lanes", "2", "--alone", "alone", *names)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert set(blocks(proc.stdout)) == set(names)
    assert proc.stdout.index("lanes: alone started") > max(
        proc.stdout.index(f"lanes: {name} passed") for name in names[:-1]
    )


def test_a_session_only_beside_some_runs_beside_them_and_never_beside_the_others(tmp_path):
    marks = tmp_path / "marks"
    marks.mkdir()
    # names as nox writes parametrized sessions: with '=', quotes, parentheses and commas
    d, e = "d(kind='x', n=1)", "e(kind='y', n=2)"
    (marks / "apart.json").write_text(json.dumps({"pair-a": [d, e], d: ["pair-a"]}))
    proc = run_lanes(
        tmp_path, "--lanes", "2", "--only-beside", "pair-a", "pair-b", "pair-a", d, "pair-b", e
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert set(blocks(proc.stdout)) == {"pair-a", "pair-b", d, e}
    # d and e waited for pair-a's end although a lane was free
    assert proc.stdout.index("lanes: pair-a passed") < proc.stdout.index(f"lanes: {d} started")
    assert proc.stdout.index("lanes: pair-a passed") < proc.stdout.index(f"lanes: {e} started")


def test_only_beside_must_name_listed_sessions(tmp_path):
    proc = run_lanes(tmp_path, "--only-beside", "c", "d|x", "c", "d")
    assert proc.returncode == 2
    assert "--only-beside 'c' names sessions not in the list: ['x']" in proc.stderr


def test_a_failed_session_fails_the_run_and_the_others_still_run(tmp_path):
    proc = run_lanes(tmp_path, "--lanes", "2", "--alone", "alone", "broken", "c", "d", "alone")
    assert proc.returncode == 1
    assert "lanes: broken FAILED (exit 7)" in proc.stdout
    assert "failed: broken" in proc.stdout
    for name in ("c", "d", "alone"):
        assert f"lanes: {name} passed" in proc.stdout
    assert blocks(proc.stdout)["broken"][-1] == "broken line 199"
    assert (tmp_path / "marks" / "alone.ended").exists()


def test_arguments_after_the_double_dash_reach_every_session(tmp_path):
    proc = run_lanes(tmp_path, "--lanes", "1", "c", "d", "--", "-k", "grading")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for name in ("c", "d"):
        assert blocks(proc.stdout)[name][-1] == "posargs -k grading"


def test_alone_must_name_a_listed_session(tmp_path):
    proc = run_lanes(tmp_path, "--alone", "stress", "c")
    assert proc.returncode == 2
    assert "--alone names sessions not in the list: ['stress']" in proc.stderr


def test_a_stopped_run_stops_the_sessions_it_started(tmp_path):
    argv, env = lanes_argv(tmp_path, "--lanes", "2", "sleeper", "c")
    marks = tmp_path / "marks"
    with subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True) as proc:
        while not (marks / "sleeper.ready").exists():  # the session is running
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            time.sleep(0.01)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, out
    assert "stopping every session" in out
    pid = int((marks / "sleeper.pid").read_text())
    assert not Path(f"/proc/{pid}").exists(), "the session's process still runs"
    assert not (marks / "sleeper.ended").exists()
