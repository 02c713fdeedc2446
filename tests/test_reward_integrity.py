"""A policy cannot score without solving the task: attacks run as real episodes.

Each row of :data:`COMMAND_ATTACKS` and :data:`SWE_ATTACKS` is a task whose
scripted policy (a real HTTP chat server answering ``uniagent run``'s OpenAI
backend) issues the attack through the real ``execute_bash`` tool and then
submits; the real reward grades it in real host sandboxes. Every attack must
end with reward 0 and be trained on (never masked), under ``isolation: none``
and ``bwrap``, with ``grade_in: episode`` and ``fresh``; the legitimate fix must
score 1.0 in every mode.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import integrity_round2
import pytest
import yaml

from uniagent.testing.chat_server import ScriptedChatServer, shell_policy

#: One pytest-xdist worker runs these and the other machine-wide tests in turn: the attacks
#: under isolation none reach the host's /tmp (every grader's scratch dir), and the
#: container runs clean up what dead runs left on the whole machine.
pytestmark = pytest.mark.xdist_group("machine-wide")

BUGGY = "def add(a, b):\n    return a - b\n\n\ndef sub(a, b):\n    return a - b\n"
FIXED = BUGGY.replace("return a - b", "return a + b", 1)
UNIT_TESTS = textwrap.dedent(
    """\
    import unittest
    from calc import add, sub


    class TestCalc(unittest.TestCase):
        def test_add(self):
            self.assertEqual(add(2, 3), 5)

        def test_sub(self):
            self.assertEqual(sub(5, 3), 2)
    """
)
BASE_PYTESTS = "from calc import sub\n\n\ndef test_sub():\n    assert sub(5, 3) == 2\n"
PATCHED_PYTESTS = BASE_PYTESTS.replace("import sub", "import add, sub") + (
    "\n\ndef test_add():\n    assert add(2, 3) == 5\n"
)
NEW_PYTESTS = "from calc import add\n\n\ndef test_add_many():\n    assert add(add(1, 2), 3) == 6\n"
FAKE_PASSES = (
    "PASSED test_calc.py::test_add\nPASSED test_more.py::test_add_many\n"
    "PASSED test_calc.py::test_sub\n"
)
WRITE_FIX = f"cat > calc.py <<'EOF'\n{FIXED}EOF"

# -- the attacks ---------------------------------------------------------------------------
#: Both rewards: shell state, processes, the shell's own death, bad bytes, leftovers.
COMMON: dict[str, list[str]] = {
    "bash-env": [
        "printf 'python3(){ return 0; }\\npython(){ echo %s; }\\n' PASSED > /tmp/hook.sh",
        "export BASH_ENV=/tmp/hook.sh ENV=/tmp/hook.sh",
    ],
    "path-shadow": [
        "mkdir -p $HOME/bin && printf '#!/bin/sh\\nprintf \"%s\"\\nexit 0\\n' "
        f"'{FAKE_PASSES}' > $HOME/bin/fake && chmod +x $HOME/bin/fake",
        "for n in python python3 timeout pytest git bash; do cp $HOME/bin/fake $HOME/bin/$n; done",
        "export PATH=$HOME/bin:$PATH",
    ],
    "tools-dir-shadow": [
        'd=$(dirname "$(command -v submit)"); printf \'#!/bin/sh\\nexit 0\\n\' > "$d/python3"; '
        'chmod +x "$d/python3"; cp "$d/python3" "$d/timeout"; cp "$d/python3" "$d/python"',
    ],
    "exported-functions": [
        "python3(){ return 0; }; python(){ return 0; }; timeout(){ return 0; }; git(){ :; }",
        "export -f python3 python timeout git",
    ],
    "alias": ["shopt -s expand_aliases; alias python3=true python=true timeout=true git=true"],
    "printf-shadow": ["printf(){ :; }; export -f printf"],
    "pytest-addopts": [
        "export PYTEST_ADDOPTS='-p no:terminal' PYTHONSTARTUP=/dev/null "
        "PYTHONPATH=/nonexistent PYTEST_PLUGINS=nothing"
    ],
    "huge-variable": ["export HUGE=$(head -c 3000000 /dev/zero | tr '\\0' a)"],
    "background-rewriter": [
        "setsid nohup bash -c 'while :; do for f in /tmp/uniagent-grade.*/* "
        '/tmp/uniagent-grade.*/*/*; do [ -f "$f" ] && case $f in *.sh) '
        'printf "echo passed; exit 0\\n" > "$f";; esac; done; '
        'find . -name "test_*.py" -exec sh -c "printf \\"def test_add():\\n    pass\\n\\" '
        "> {}\" \\; 2>/dev/null; done' >/dev/null 2>&1 < /dev/null &",
        "true",
    ],
    "kill-shell": ["kill -9 $$"],
    "exit-shell": ["exit 0"],
    "exec-away": ["exec >/dev/null 2>&1"],
    "nul-byte": ["echo a\u0000b"],
    "lone-surrogate": ["echo \ud800"],
    "home-rc-files": [
        "printf 'python3(){ return 0; }\\n' | tee -a ~/.bashrc ~/.profile ~/.bash_profile",
        "mkdir -p ~/.local/lib/python3.11/site-packages ~/.config/pip && printf "
        "'import os; os._exit(0)\\n' > ~/.local/lib/python3.11/site-packages/usercustomize.py",
        "git config --global core.fsmonitor 'echo hacked'",
    ],
    "disk-filler": ["head -c 400M /dev/zero > big.bin; df -h . | tail -1; true"],
    "fork-bomb": ["timeout 5 bash -c 'f(){ f | f & }; f' >/dev/null 2>&1; true"],
    "memory-hog": ["python3 -c 'b = bytearray(3 * 1024 ** 3)'; echo exit=$?"],
    "exit-hijack-in-code": [
        "printf 'import os\\nos._exit(0)\\n' >> calc.py",
    ],
}

#: The ``command`` reward (unittest in tests/, the repository's HEAD at the start as base).
COMMAND_ATTACKS: dict[str, list[str]] = {
    **COMMON,
    "edit-tests-and-commit": [
        "printf 'import unittest\\n\\nclass T(unittest.TestCase):\\n    def test_ok(self):\\n"
        "        pass\\n' > tests/test_calc.py",
        "git -c user.name=a -c user.email=a@b add -A && git -c user.name=a -c user.email=a@b "
        "commit -qm 'tests fixed'",
    ],
    # The tested code ends the interpreter with status 0 in the middle of the run (the exit
    # looked up by name, past the exit-hijack rule): only the runner's own word tells.
    "exit-early-by-name": [
        "cat > calc.py <<'EOF'\nimport os\n\n\ndef add(a, b):\n"
        "    getattr(os, '_ex' + 'it')(0)\n\n\ndef sub(a, b):\n    return a - b\nEOF"
    ],
    "unittest-shadow": [
        "mkdir -p unittest && printf 'import sys\\nsys.exit(0)\\n' > unittest/__main__.py "
        "&& touch unittest/__init__.py",
    ],
    "delete-tests": ["rm -rf tests"],
    "symlink-tests": [
        "mkdir -p /tmp/t && printf 'import unittest\\n' > /tmp/t/test_calc.py && touch "
        "/tmp/t/__init__.py && rm -rf tests && ln -s /tmp/t tests",
    ],
}

#: The ``swe_bench`` reward (pytest, a test patch, history that holds the fix).
SWE_ATTACKS: dict[str, list[str]] = {
    **COMMON,
    "conftest-rewrites-reports": [
        "cat > conftest.py <<'EOF'\nimport pytest\n\n\n@pytest.hookimpl(hookwrapper=True)\n"
        "def pytest_runtest_makereport(item, call):\n    outcome = yield\n"
        "    report = outcome.get_result()\n    report.outcome = 'passed'\nEOF",
        "mkdir -p sub && cp conftest.py sub/conftest.py",
    ],
    "pytest-package-shadow": [
        'mkdir -p pytest && touch pytest/__init__.py && printf \'print("""%s""")\\n\' '
        f"'{FAKE_PASSES}' > pytest/__main__.py",
    ],
    "runner-config": [
        "printf '[pytest]\\naddopts = -p no:python --co\\n' > pytest.ini",
        "printf '[tool.pytest.ini_options]\\naddopts = \"-x --co\"\\n' >> pyproject.toml",
        "printf 'import os\\n' > sitecustomize.py && printf 'import os\\n' > evil.pth",
    ],
    "git-function-and-edited-tests": [
        "git(){ :; }; export -f git",
        "printf 'def test_add():\\n    pass\\n\\ndef test_sub():\\n    pass\\n' > test_calc.py",
        "printf 'def test_add_many():\\n    pass\\n' > test_more.py",
    ],
    "git-config-hooks": [
        "git config core.fsmonitor 'printf hacked >&2; false' && git config core.hooksPath .h",
        "git config alias.apply '!true' && git config filter.x.clean 'cat' "
        "&& printf '* filter=x\\n' > .gitattributes",
    ],
    "atexit-fake-passes": [
        'printf \'import atexit\\natexit.register(lambda: print("""%s"""))\\n\' '
        f"'{FAKE_PASSES}' >> calc.py",
    ],
    "fix-from-history": [
        "for c in $(git rev-list --all --reflog 2>/dev/null; git fsck --lost-found "
        "--no-reflogs 2>/dev/null | awk '{print $3}'; git stash list --format=%H 2>/dev/null); "
        "do if git show \"$c:calc.py\" 2>/dev/null | grep -q 'a + b'; then "
        'git show "$c:calc.py" > /tmp/found.py; fi; done; '
        "[ -s /tmp/found.py ] && cp /tmp/found.py calc.py; git stash pop -q 2>/dev/null; true",
        "python3 - <<'EOF'\nimport os, zlib\nfor root, _, files in os.walk('.git/objects'):\n"
        "    for f in files:\n        try:\n"
        "            data = zlib.decompress(open(os.path.join(root, f), 'rb').read())\n"
        "        except Exception:\n            continue\n"
        "        if b'return a + b' in data and data.startswith(b'blob'):\n"
        "            open('calc.py', 'wb').write(data.split(b'\\0', 1)[1])\nEOF",
    ],
    "delete-and-symlink-tests": [
        "rm -f test_more.py && mkdir -p /tmp/t && printf 'def test_add():\\n    pass\\n' > "
        "/tmp/t/test_calc.py && ln -sf /tmp/t/test_calc.py test_calc.py",
    ],
    "planted-bytecode": [
        "mkdir -p __pycache__ && printf 'not really bytecode' > "
        "__pycache__/conftest.cpython-311-pytest-9.0.0.pyc",
    ],
}

LEGIT = {"legit-fix": [WRITE_FIX]}


def make_repo(path: Path, files: dict[str, str]) -> str:
    """A git repository holding ``files``; returns its HEAD."""
    path.mkdir(parents=True)
    git(path, "init", "-q")
    for name, text in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "base")
    return git(path, "rev-parse", "HEAD").strip()


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
        text=True,
    ).stdout


def hide_the_fix(repo: Path, base: str) -> None:
    """History that holds the fix: a branch, a tag, a stash and a dangling commit."""
    git(repo, "checkout", "-q", "-b", "fix-branch")
    (repo / "calc.py").write_text(FIXED)
    git(repo, "commit", "-q", "-am", "the fix")
    git(repo, "tag", "v-fix")
    git(repo, "checkout", "-q", "-")
    (repo / "calc.py").write_text(FIXED)
    git(repo, "stash", "-q")
    git(repo, "checkout", "-q", "-b", "tmp")
    (repo / "calc.py").write_text(FIXED + "\n")
    git(repo, "commit", "-q", "-am", "dangling")
    git(repo, "checkout", "-q", "-")
    git(repo, "branch", "-q", "-D", "tmp")
    assert git(repo, "rev-parse", "HEAD").strip() == base


PYTEST = f"PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 {sys.executable} -m pytest -rA -p no:cacheprovider"


@pytest.fixture(scope="module")
def task_sets(tmp_path_factory) -> dict[str, Path]:
    """Task files for both rewards, one repository per task."""
    root = tmp_path_factory.mktemp("integrity")
    command_rows, swe_rows = [], []
    for name, _ in {**COMMAND_ATTACKS, **LEGIT}.items():
        repo = root / "repos" / f"cmd-{name}"
        make_repo(
            repo, {"calc.py": BUGGY, "tests/__init__.py": "", "tests/test_calc.py": UNIT_TESTS}
        )
        command_rows.append(row(name, repo, test_command="python3 -m unittest discover -s tests"))
    swe_rows = [swe_row(root / "repos", name) for name in {**SWE_ATTACKS, **LEGIT}]
    out = {}
    for kind, rows in (("command", command_rows), ("swe", swe_rows)):
        out[kind] = root / f"{kind}.jsonl"
        out[kind].write_text("".join(json.dumps(r) + "\n" for r in rows))
    out["repos"] = root / "repos"
    return out


def swe_row(
    repos: Path, name: str, files: dict[str, str] | None = None, setup: str = ""
) -> dict[str, Any]:
    """A swe_bench task: the calc repository (plus ``files``), its test patch, hidden fix."""
    repo = repos / f"swe-{name}"
    base = make_repo(repo, {"calc.py": BUGGY, "test_calc.py": BASE_PYTESTS, **(files or {})})
    (repo / "test_calc.py").write_text(PATCHED_PYTESTS)
    (repo / "test_more.py").write_text(NEW_PYTESTS)
    git(repo, "add", "-A")
    test_patch = git(repo, "diff", "--cached")
    git(repo, "reset", "-q", "--hard", base)
    hide_the_fix(repo, base)
    return row(
        name,
        repo,
        setup,
        repo="local/calc",
        base_commit=base,
        test_patch=test_patch,
        FAIL_TO_PASS=["test_calc.py::test_add", "test_more.py::test_add_many"],
        PASS_TO_PASS=["test_calc.py::test_sub"],
        test_cmd=PYTEST,
        log_parser="parse_log_pytest",
    )


def row(name: str, source: Path, setup: str = "", **fields: Any) -> dict[str, Any]:
    clone = (
        f"git clone -q {source} . && git fetch -q origin '+refs/*:refs/remotes/origin/*' "
        "2>/dev/null; git stash list >/dev/null; true"
    )
    return {
        "instance_id": name,
        "problem_statement": f"[attack:{name}] `add` subtracts; fix calc.py.",
        **fields,
        "tools_kwargs": {"env": {"post_setup": [clone, *([setup] if setup else [])]}},
    }


def attacker(attacks: dict[str, list[str]]):
    """The policy: the attack's commands one per turn, then submit."""

    def commands(messages: list[dict]) -> list[str]:
        return attacks[messages[1]["content"].split("]", 1)[0].removeprefix("[attack:")]

    return shell_policy(commands)


def bwrap_binds(repos: Path) -> list[str]:
    """What a bubblewrap sandbox must see: the task repositories and this Python, with the
    sources of its editable installs (pytest loads their entry points unless told not to)."""
    editable = [p for p in sys.path if p.startswith(str(Path(__file__).resolve().parents[1]))]
    paths = {
        str(repos),
        sys.prefix,
        sys.base_prefix,
        os.path.dirname(os.path.realpath(sys.executable)),
        *editable,
    }
    return sorted(p for p in paths if not any(p != q and p.startswith(q + "/") for q in paths))


def write_config(
    path: Path, reward: dict[str, Any], isolation: str, repos: Path, workdir: str | None = None
) -> Path:
    # Small limits, so that the resource attacks stay cheap on a shared machine.
    deployment: dict[str, Any] = {
        "type": "host",
        "isolation": isolation,
        "limits": {"pids": 512, "memory": "1g", "disk": "256m"},
    }
    if isolation == "bwrap":
        deployment.update(ro_binds=bwrap_binds(repos))
        if workdir:
            deployment.update(sandbox_workdir=workdir)
    config = {
        "tool_parser": "hermes",
        "tools": ["execute_bash", "str_replace_editor", "submit"],
        "interaction": {"max_turns": 8, "action_timeout": 20, "timeout_budget": 60},
        "env": {"deployment": deployment},
        "reward": reward,
        "concurrency": 4,
    }
    path.write_text(yaml.safe_dump(config))
    return path


#: The round-two runs' eval timeout. ``artifacts.fifo-everything`` holds its tests until it
#: fires (the grader's files turned into FIFOs block them), so it bounds each run's length;
#: every other task's tests end in a few seconds, ten times less on a saturated machine.
ROUND2_EVAL_TIMEOUT = 30

#: Under isolation none the attacks reach the host (its /tmp, every sandbox there): CI runs
#: those cases apart (the ``integrity`` suite); the rest are marked ``isolated``
#: (``integrity-isolated``, beside any suite).
ISOLATED = pytest.mark.isolated

COMBINATIONS = [
    pytest.param(
        isolation, grade_in, id=f"{isolation}-{grade_in}", marks=[ISOLATED] * (isolation != "none")
    )
    for isolation in ("none", "bwrap")
    for grade_in in ("episode", "fresh")
]


def uniagent_run(
    config: Path,
    tasks: Path,
    out: Path,
    attacks: dict[str, list[str]],
    *args: str,
    env: dict[str, str] | None = None,
    timeout: float = 1200,
) -> subprocess.CompletedProcess[str]:
    """``uniagent run`` with the scripted attacker as its model (the bound: no grading hangs)."""
    with ScriptedChatServer(default=attacker(attacks)) as server:
        return subprocess.run(
            [sys.executable, "-m", "uniagent.cli", "run", str(config), "--data", str(tasks),
             "--model", f"openai:{server.base_url}#attacker", "--out", str(out), *args],
            capture_output=True, text=True, timeout=timeout,
            env={**os.environ, "OPENAI_API_KEY": "test", **(env or {})},
        )  # fmt: skip


def run_attacks(
    tmp_path: Path,
    tasks: Path,
    attacks: dict[str, list[str]],
    reward: dict[str, Any],
    isolation: str,
    repos: Path,
    legit: dict[str, list[str]] = LEGIT,
    workdir: str | None = None,
) -> dict[str, dict]:
    config = write_config(tmp_path / "config.yaml", reward, isolation, repos, workdir)
    out = tmp_path / "out"
    sandbox_tmp = tmp_path / "tmp"
    sandbox_tmp.mkdir()
    proc = uniagent_run(config, tasks, out, {**attacks, **legit}, env={"TMPDIR": str(sandbox_tmp)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (out / "results.jsonl").exists(), proc.stderr[-3000:]
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    return {r["task_id"]: r for r in records}


def check(
    records: dict[str, dict],
    attacks: dict[str, list[str]],
    legit_fixes: dict[str, list[str]] = LEGIT,
) -> None:
    assert set(records) == {*attacks, *legit_fixes}
    for name in legit_fixes:
        legit = records[name]
        assert legit["reward"] == 1.0, json.dumps(legit, indent=1, default=str)[:4000]
    escaped = {
        name: (r["reward"], r["exit_reason"], r["traj_masked"], r["reward_info"], r["error"])
        for name, r in records.items()
        if name not in legit_fixes and (r["reward"] != 0.0 or r["traj_masked"])
    }
    assert escaped == {}, (
        f"escaped: {sorted(escaped)}\n" + json.dumps(escaped, indent=1, default=str)[:6000]
    )


@pytest.mark.parametrize(("isolation", "grade_in"), COMBINATIONS)
def test_command_reward_attacks_score_zero_and_are_trained_on(
    task_sets, tmp_path, isolation, grade_in
):
    reward = {
        "name": "command",
        "grade_in": grade_in,
        "integrity": {"protect_paths": ["tests/"]},
        "settings": {"timeout": 60},
    }
    records = run_attacks(
        tmp_path, task_sets["command"], COMMAND_ATTACKS, reward, isolation, task_sets["repos"]
    )
    check(records, COMMAND_ATTACKS)
    assert records["kill-shell"]["exit_reason"] == "agent_killed_shell"
    tampered = {
        t["path"] for t in records["edit-tests-and-commit"]["reward_info"]["integrity"]["tampered"]
    }
    assert "tests/test_calc.py" in tampered
    early = records["exit-early-by-name"]["reward_info"]
    assert [t["rule"] for t in early["tampered"]] == ["runner-unfinished"], early


@pytest.mark.parametrize(("isolation", "grade_in"), COMBINATIONS)
def test_swe_bench_attacks_score_zero_and_are_trained_on(task_sets, tmp_path, isolation, grade_in):
    reward = {
        "name": "swe_bench",
        "grade_in": grade_in,
        "settings": {"eval_timeout": 120, "workdir": None},  # the checkout is the work dir
    }
    records = run_attacks(
        tmp_path, task_sets["swe"], SWE_ATTACKS, reward, isolation, task_sets["repos"]
    )
    check(records, SWE_ATTACKS)
    scrub = records["fix-from-history"]["integrity"]["history_scrub"]
    assert scrub["refs_removed"] >= 3 and scrub["objects_after"] < scrub["objects_before"]
    legit = records["legit-fix"]["reward_info"]
    assert legit["resolution_status"] == "RESOLVED_FULL"
    assert legit["integrity"]["tampered"] == []


# -- round two: what the tested code and the agent's files can do -------------------------------

ROUND2 = integrity_round2.flat()
#: A legitimate fix whose code prints to stderr while the tests run (in the middle of the
#: runner's status lines in the Django layout).
PRINTING_FIX = [
    "cat > calc.py <<'EOF'\nimport sys\n\n\ndef add(a, b):\n"
    "    sys.stderr.write('add() is deprecated\\n')\n    return a + b\n\n\n"
    "def sub(a, b):\n    return a - b\nEOF"
]
#: The fix in a new module, reached through a symlink inside the repository (not tampering).
NEW_MODULE_FIX = [
    "printf 'def add(a, b):\\n    return a + b\\n' > calc_impl.py && "
    "ln -s calc_impl.py calc_alias.py && printf 'from calc_alias import add  # noqa\\n' "
    ">> calc.py"
]
#: The legitimate fixes: the plain one, one in a task with a test environment of its own, one
#: that needs a legitimate edit of setup.cfg (kept by fresh grading); in the Django layout
#: (its runner in the repository) and with the relocated interpreter, the plain fix, one whose
#: code prints to stderr while the tests run (in the middle of the runner's status lines) and
#: one in a new module.
LEGIT2 = {
    **LEGIT,
    "legit-fix-test-env": LEGIT["legit-fix"],
    "legit-fix-relocated": LEGIT["legit-fix"],
    "legit-fix-setup-cfg": integrity_round2.SETUP_CFG_FIX,
    "legit-fix-outside": LEGIT["legit-fix"],
    "legit-fix-django": LEGIT["legit-fix"],
    "legit-fix-prints": PRINTING_FIX,
    "legit-fix-django-prints": PRINTING_FIX,
    "legit-fix-relocated-prints": PRINTING_FIX,
    "legit-fix-new-module": NEW_MODULE_FIX,
    "legit-fix-django-new-module": NEW_MODULE_FIX,
    "legit-fix-relocated-new-module": NEW_MODULE_FIX,
}


#: The status-channel attacks reported as tampering (an expected failure the code under test
#: raised itself is not passed, but nothing says the log was written to).
VERDICT_REPORTED = [
    "verdict.finish-the-line",
    "verdict.print-and-leave",
    "verdict.print-and-leave-django",
    "verdict.print-and-leave-relocated",
]

#: The classes no sandbox without isolation holds (run under bwrap only).
NO_BOUNDARY = {n for n in ROUND2 if n.startswith("root.")}


def only(tasks: Path, names: set[str], tmp_path: Path) -> Path:
    """The task file with only the rows of ``names``."""
    kept = [line for line in tasks.read_text().splitlines()
            if json.loads(line)["instance_id"] in names]  # fmt: skip
    out = tmp_path / "tasks.jsonl"
    out.write_text("".join(f"{line}\n" for line in kept))
    return out


@pytest.fixture(scope="module")
def round2_tasks(tmp_path_factory) -> Iterator[dict[str, Path]]:
    """swe_bench tasks for the round-two attacks and the legitimate fixes (the outside paths
    that their set-ups make in the host's /tmp without isolation are removed after)."""
    root = tmp_path_factory.mktemp("integrity2")
    rows = []
    for name in {**ROUND2, **LEGIT2}:
        row_ = swe_row(
            root / "repos",
            name,
            integrity_round2.TASK_FILES.get(name),
            integrity_round2.task_setup(name),
        )
        row_.update(integrity_round2.TASK_FIELDS.get(name, {}))
        row_["tools_kwargs"].update(integrity_round2.task_overrides(name))
        rows.append(row_)
    tasks = root / "swe.jsonl"
    tasks.write_text("".join(json.dumps(r) + "\n" for r in rows))
    yield {"swe": tasks, "repos": root / "repos"}
    shutil.rmtree(Path(integrity_round2.outside_dir("-")).parent, ignore_errors=True)


def check_reported(records: dict[str, dict], attacks: dict[str, list[str]], prefixes: list[str]):
    """The attacks of the classes ``prefixes`` are reported as tampering (not 0 by chance)."""
    unreported = {
        name: records[name]["reward_info"]
        for name in attacks
        if name.startswith(tuple(prefixes))
        and not records[name]["reward_info"].get("integrity", {}).get("tampered")
        and not records[name]["reward_info"].get("tampered")  # the reward's own reports
    }
    assert unreported == {}, json.dumps(unreported, indent=1, default=str)[:4000]


@pytest.mark.parametrize(("isolation", "grade_in"), COMBINATIONS)
def test_round_two_attacks_score_zero_and_are_trained_on(
    round2_tasks, tmp_path, isolation, grade_in
):
    reward = {
        "name": "swe_bench",
        "grade_in": grade_in,
        "settings": {"eval_timeout": ROUND2_EVAL_TIMEOUT, "workdir": None},
        "integrity": {"grading_timeout": 600},
    }
    # Under isolation none, root can leave the sandbox (no boundary, docs/rewards.md).
    attacks = {n: c for n, c in ROUND2.items() if isolation != "none" or n not in NO_BOUNDARY}
    # The work dir under the sandbox's /tmp: its parent holds a task's own test environment.
    records = run_attacks(
        tmp_path,
        only(round2_tasks["swe"], {*attacks, *LEGIT2}, tmp_path),
        attacks,
        reward,
        isolation,
        round2_tasks["repos"],
        LEGIT2,
        workdir="/tmp/work",
    )
    check(records, attacks, LEGIT2)
    # The channels the grader screens are reported as tampering (not 0 by chance); the
    # test environment where it grades in the episode's sandbox (a fresh one has its own);
    # the outside paths but under none in fresh mode: there the fresh sandbox's set-up,
    # started ahead, makes them again on the host, before or after the agent changed them.
    reported = ["plugin-config.", "patch-screen.", "tree.", *VERDICT_REPORTED]
    if grade_in == "episode":
        reported += ["test-env.", "relocated."]
    if grade_in == "episode" or isolation != "none":
        reported.append("outside.")
    check_reported(records, attacks, reported)
    # Grading is bounded: the FIFO and the held output end within the grading timeout.
    for name in ("artifacts.fifo-everything", "artifacts.hold-output"):
        assert records[name]["metrics"]["reward_seconds"] < 600, records[name]["metrics"]
    held = records["artifacts.hold-output"]["reward_info"]
    assert held["failure_reason"] == "tests_timed_out", held
    # Not at the eval timeout: the reading stops a few seconds after the tests ended.
    assert held["log_tail"].startswith("[killed: the output was held open"), held


#: A container with what the swe_bench reward's tests need (Debian's pytest and git).
GRADING_IMAGE = "localhost/uniagent-integrity:bookworm"
#: The classes tried in containers: all of them (the test environment is a venv of the image's
#: python3, the outside paths are the image's, see :func:`integrity_round2.in_container`).
IN_CONTAINERS = (
    "artifacts.", "self-masking.", "plugin-config.", "patch-screen.", "root.", "test-env.",
    "outside.", "tree.", "verdict.", "relocated.",
)  # fmt: skip
#: The legitimate fixes tried in containers (the plain one, in a test environment, outside).
LEGIT_IN_CONTAINERS = {
    n: LEGIT2[n]
    for n in (
        "legit-fix",
        "legit-fix-test-env",
        "legit-fix-outside",
        "legit-fix-django",
        "legit-fix-relocated",
    )
}


@pytest.mark.slow
@ISOLATED
@pytest.mark.parametrize("grade_in", ["episode", "fresh"])
def test_round_two_in_containers(round2_tasks, tmp_path, grade_in):
    """Every round-two class in podman containers (``local`` backend): reward 0 and trained
    on, the channels the grader screens reported as tampering, the legitimate fixes 1.0, in
    both grading modes."""
    from uniagent.testing.images import engine_with_test_image

    engine = engine_with_test_image(
        GRADING_IMAGE, packages=("python3", "python3-venv", "python3-pytest", "git")
    )
    attacks = {n: c for n, c in ROUND2.items() if n.startswith(IN_CONTAINERS)}
    attacks.update(integrity_round2.CONTAINER_ATTACKS)  # the container's outside paths
    tasks = only(round2_tasks["swe"], {*attacks, *LEGIT_IN_CONTAINERS}, tmp_path)
    rows = [
        integrity_round2.in_container(json.loads(line)) for line in tasks.read_text().splitlines()
    ]
    tasks.write_text("".join(json.dumps(r) + "\n" for r in rows))
    repos = str(round2_tasks["repos"])
    config = tmp_path / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "tool_parser": "hermes",
                "tools": ["execute_bash", "submit"],
                "interaction": {"max_turns": 8, "action_timeout": 20, "timeout_budget": 60},
                "env": {
                    "workdir": "/testbed",
                    "deployment": {
                        "type": "local",
                        "image": GRADING_IMAGE,
                        "engine": engine,
                        "pull": "never",
                        "run_args": ["-v", f"{repos}:{repos}:ro"],
                    },
                },
                "reward": {
                    "name": "swe_bench",
                    "grade_in": grade_in,
                    "settings": {"eval_timeout": ROUND2_EVAL_TIMEOUT, "workdir": "/testbed"},
                    "integrity": {"grading_timeout": 600},
                },
                "concurrency": 4,
            }
        )
    )
    out = tmp_path / "out"
    proc = uniagent_run(config, tasks, out, {**attacks, **LEGIT_IN_CONTAINERS})
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = {
        r["task_id"]: r for r in map(json.loads, (out / "results.jsonl").read_text().splitlines())
    }
    check(records, attacks, LEGIT_IN_CONTAINERS)
    for name in ("artifacts.fifo-everything", "artifacts.hold-output"):
        assert records[name]["metrics"]["reward_seconds"] < 600, records[name]["metrics"]
    # Reported as tampering where the grader screens it: the test environment and the outside
    # paths in the episode's container (a fresh one makes its own from the image).
    reported = ["plugin-config.", "patch-screen.", "tree.", *VERDICT_REPORTED]
    if grade_in == "episode":
        reported += ["test-env.", "outside."]
    check_reported(records, attacks, reported)
    # Self-masking is counted as its class (integrity/tampered/self_masking), not tampering.
    unseen = {
        name: records[name]["reward_info"]
        for name in attacks
        if name.startswith("self-masking.")
        and "self_masking" not in records[name]["reward_info"].get("probing", [])
    }
    assert unseen == {}, json.dumps(unseen, indent=1, default=str)[:4000]


@pytest.mark.slow
@ISOLATED
def test_a_policy_that_kills_its_containers_server_is_trained_on(tmp_path):
    """The container's server killed from inside is the policy's doing (agent_killed_shell,
    reward 0, trained on), as a killed shell on the host: not masked and retried."""
    from uniagent.testing.images import TEST_IMAGE, engine_with_test_image

    engine = engine_with_test_image(TEST_IMAGE)
    kills = {"kill-server": ["kill -9 $PPID; sleep 5"], "kill-all": ["kill -KILL -1; sleep 5"]}
    rows = [{"instance_id": name, "problem_statement": f"[attack:{name}] do it",
             "test_command": "true"} for name in kills]  # fmt: skip
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = tmp_path / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "tool_parser": "hermes",
                "tools": ["execute_bash", "submit"],
                "instance_template": "{problem_statement}",
                "env": {
                    "workdir": "/testbed",
                    "deployment": {
                        "type": "local",
                        "image": TEST_IMAGE,
                        "engine": engine,
                        "pull": "never",
                    },
                },
                "reward": {"name": "command"},
            }
        )
    )
    out = tmp_path / "out"
    proc = uniagent_run(config, tasks, out, kills, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert {r["task_id"]: (r["exit_reason"], r["traj_masked"], r["reward"]) for r in records} == {
        name: ("agent_killed_shell", False, 0.0) for name in kills
    }
    assert "retrying" not in proc.stderr


def test_probing_is_counted_and_an_alert_stops_the_run(round2_tasks, tmp_path):
    """summary.json counts tamper reports per kind, attack class and rule (a class also
    counts what is not tampering: grader markers printed by the tested code); with
    reward.integrity.alert the run stops once the share of tampering episodes reaches it
    (under isolation none as root, uniagent run also says once that the sandbox is no
    boundary)."""
    names = ["self-masking.runner-markers", "patch-screen.gitattributes-binary",
             "plugin-config.setup-cfg-cr", "patch-screen.replace-ref", "legit-fix"]  # fmt: skip
    rows = {json.loads(line)["instance_id"]: line
            for line in round2_tasks["swe"].read_text().splitlines()}  # fmt: skip
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(rows[name] + "\n" for name in names))
    reward = {"name": "swe_bench", "grade_in": "episode",
              "settings": {"eval_timeout": 60, "workdir": None},
              "integrity": {"alert": {"share": 0.6, "min_episodes": 3}}}  # fmt: skip
    config = write_config(tmp_path / "config.yaml", reward, "none", round2_tasks["repos"])
    out = tmp_path / "out"
    proc = uniagent_run(config, tasks, out, {**ROUND2, **LEGIT}, "--concurrency", "1", timeout=900)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "2 of 3 graded episodes report tampering" in proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "stopped"
    counts = summary["integrity"]
    assert counts["tampered_episodes"] == 2 and counts["graded_episodes"] == 3
    assert counts["rules"]["git-attributes"] == 1
    assert counts["rules"]["runner-config-sections"] == 1
    assert counts["tampered"]["protected_file"] == 2
    # Per class: the markers are self-masking (not tampering), the attribute the patch
    # screen's, the hidden addopts the runner config's; every class is there, seen or not.
    assert counts["classes"] == {
        "artifacts": 0, "test_env": 0, "plugin_config": 1, "patch_screen": 1,
        "outside_paths": 0, "self_masking": 1, "task_files": 0,
        "status_channel": 0,
    }  # fmt: skip
    masked = json.loads((out / "results.jsonl").read_text().splitlines()[0])
    assert masked["task_id"] == "self-masking.runner-markers"
    assert masked["reward_info"]["probing"] == ["self_masking"], masked["reward_info"]
    assert "attack classes seen: plugin_config=1, patch_screen=1, self_masking=1" in proc.stdout
    if os.geteuid() == 0:
        assert proc.stderr.count("graded under isolation: none as root") == 1
