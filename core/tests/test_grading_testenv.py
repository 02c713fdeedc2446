"""The test environment in the baseline: the interpreter the tests really run (after the eval
script's activation), its site-packages, start-up hooks, entry points and bytecode."""

from __future__ import annotations

import asyncio
import os
import shlex
import subprocess
import sys
import types
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from uniagent import RewardSpec, hookimpl, open_env
from uniagent.env import AgentEnv
from uniagent.grading import testenv, walks
from uniagent.grading.testenv import script_test_env
from uniagent.grading.walks import walk
from uniagent.plugins import load_plugins, reset_plugins
from uniagent.protect.settings import IntegrityDefaults, TestEnv
from uniagent.reward import RewardContext, RewardResult
from uniagent.testing import MAKE_PREFIX
from uniagent.testing.grading import grade, prepare_grader

PY = f"python{sys.version_info.major}.{sys.version_info.minor}"
SETUP = (
    "git init -q && git config user.email t@t && git config user.name t && "
    "printf 'x = 1\\n' > calc.py && git add -A && git commit -qm base"
)


@pytest.fixture
def venv(tmp_path: Path) -> Path:
    """A test environment outside the repository (shared by the episode's and a fresh
    sandbox: the host's directories without isolation), with a module of its own."""
    path = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    (path / "lib" / PY / "site-packages" / "helper.py").write_text("VALUE = 1\n")
    return path


@pytest.fixture
def prefix(tmp_path: Path) -> Path:
    """A relocated interpreter: a Python installation with a prefix of its own (as a conda
    env in a SWE-bench image), not a venv (:data:`~uniagent.testing.grading.MAKE_PREFIX`).
    Its standard library is this Python's: its modules copied (an attack writes to them),
    its packages linked; its site-packages is its own, with a module in it."""
    path = tmp_path / "prefix"
    made = subprocess.run(
        [sys.executable, "-c", MAKE_PREFIX, path], capture_output=True, text=True, check=True
    )
    (Path(made.stdout.strip()) / "helper.py").write_text("VALUE = 1\n")
    started = subprocess.run(
        [path / "bin" / "python", "-c", "import helper, sys; print(sys.prefix)"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert started.stdout.strip() == str(path), started
    return path


@pytest.fixture(autouse=True)
def rewards(venv: Path) -> Iterator[None]:
    reset_plugins()

    async def run_python(ctx: RewardContext[Any]) -> RewardResult:
        done = await ctx.require_sandbox().run(
            f"source {shlex.quote(str(venv))}/bin/activate && python -c 'import helper'",
            timeout=60,
        )
        return RewardResult(1.0 if done.exit_code == 0 else 0.0, {"output": done.output})

    def test_env(task: Any, settings: Any) -> TestEnv:
        return TestEnv(
            activate=f"source {shlex.quote(str(venv))}/bin/activate", interpreters=("python",)
        )

    async def run_python3(ctx: RewardContext[Any]) -> RewardResult:
        done = await ctx.require_sandbox().run(
            "python3 -c 'import sys; print(sys.prefix)'", timeout=60
        )
        return RewardResult(1.0 if done.exit_code == 0 else 0.0, {"output": done.output})

    def plain(task: Any, settings: Any) -> TestEnv:
        return TestEnv(activate="", interpreters=("python3",))

    async def run_relative(ctx: RewardContext[Any]) -> RewardResult:
        done = await ctx.require_sandbox().run(
            f"cd {shlex.quote(str(venv.parent))} && ./env/bin/python -c 'import helper'",
            timeout=60,
        )
        return RewardResult(1.0 if done.exit_code == 0 else 0.0, {"output": done.output})

    def relative(task: Any, settings: Any) -> TestEnv:  # as an eval script names it
        return script_test_env(f"cd {shlex.quote(str(venv.parent))}\n", [f"{task['cmd']} -m t"])

    async def run_relocated(ctx: RewardContext[Any]) -> RewardResult:
        done = await ctx.require_sandbox().run(
            f"{relocated(ctx.task, None).activate} && python -c 'import helper'", timeout=60
        )
        return RewardResult(1.0 if done.exit_code == 0 else 0.0, {"output": done.output})

    def relocated(task: Any, settings: Any) -> TestEnv:  # PATH and PYTHONPATH, as eval scripts
        where = shlex.quote(task["prefix"])
        return TestEnv(
            activate=f"export PATH={where}/bin:$PATH PYTHONPATH={where}/extra",
            interpreters=("python",),
        )

    async def run_absolute(ctx: RewardContext[Any]) -> RewardResult:
        done = await ctx.require_sandbox().run(f"{venv}/bin/python -c 'import helper'", timeout=60)
        return RewardResult(1.0 if done.exit_code == 0 else 0.0, {"output": done.output})

    def absolute(task: Any, settings: Any) -> TestEnv:  # no activation: its interpreter's path
        return TestEnv(activate="", interpreters=(f"{venv}/bin/python",))

    @hookimpl
    def uniagent_rewards():
        yield RewardSpec(
            name="absolute", fn=run_absolute, integrity=IntegrityDefaults(test_env=absolute)
        )
        yield RewardSpec(
            name="relocated", fn=run_relocated, integrity=IntegrityDefaults(test_env=relocated)
        )
        yield RewardSpec(name="venv", fn=run_python, integrity=IntegrityDefaults(test_env=test_env))
        yield RewardSpec(
            name="relative", fn=run_relative, integrity=IntegrityDefaults(test_env=relative)
        )
        yield RewardSpec(
            name="python3", fn=run_python3, integrity=IntegrityDefaults(test_env=plain)
        )

    load_plugins().register(types.SimpleNamespace(uniagent_rewards=uniagent_rewards), "t")
    yield
    reset_plugins()


@pytest.fixture
async def env() -> AsyncIterator[AgentEnv]:
    async with open_env({"type": "host", "isolation": "none"}, {"post_setup": [SETUP]}) as sandbox:
        yield sandbox


def fresh_env() -> AgentEnv:
    return open_env({"type": "host", "isolation": "none"}, {"post_setup": [SETUP]})


async def act(env: AgentEnv, command: str) -> None:
    obs = await env.run_action(command, timeout=30)
    assert obs.exit_code == 0, obs.output


def changed(result: Any) -> set[str]:
    return {t["path"] for t in result.info["integrity"]["tampered"]
            if t["rule"] == "test-env"}  # fmt: skip


async def test_the_baseline_resolves_the_interpreter_after_the_activation(env, venv):
    grader = await prepare_grader(env, "venv", {})
    record = grader.baseline.test_env
    assert record["bin:python"] == str(Path(sys.executable).resolve())
    assert f"root:{venv / 'lib' / PY}" in record and f"root:{venv / 'bin'}" in record
    result = await grade(grader, env)
    assert result.score == 1.0 and changed(result) == set()


async def test_without_isolation_the_grader_walks_the_roots_as_the_shell_check_does(
    env, venv, monkeypatch
):
    """Without isolation the roots are walked by the grader itself, one walk shared by the
    episodes that ask at once (:mod:`uniagent.grading.walks`); the baseline it records is the
    one the shell check in the sandbox records for the same tree."""
    assert env.sees_host_files()
    ran = []
    monkeypatch.setattr(
        walks, "walk", lambda root, *args, **kwargs: ran.append(root) or walk(root, *args, **kwargs)
    )
    shared = await prepare_grader(env, "venv", {})
    assert str(venv / "lib" / PY) in ran
    monkeypatch.setattr(env, "sees_host_files", lambda: False)
    ran.clear()
    in_shell = await prepare_grader(env, "venv", {})
    assert ran == []
    assert shared.baseline.test_env == in_shell.baseline.test_env
    assert all(d not in ("shared", "=") for d in shared.baseline.test_env.values())


@pytest.mark.parametrize(
    ("attack", "expected"),
    [
        ("printf 'import helper\\n' > {sp}/zz.pth", "root:{sp}"),
        (
            "mkdir {sp}/evil-1.0.dist-info && printf '[pytest11]\\nx = helper\\n' > "
            "{sp}/evil-1.0.dist-info/entry_points.txt",
            "root:{sp}",
        ),
        ("printf 'VALUE = 2\\n' > {sp}/helper.py", "{sp}/helper.py"),  # same names, new ctime
        ("printf 'export PYTHONPATH=/x\\n' >> {env}/bin/activate", "{env}/bin/activate"),
        # The file itself, always; "bin:python" only when no other python on PATH resolves
        # to the same interpreter (the new file is not executable, so PATH moves on).
        ("rm {env}/bin/python && printf '#!/bin/sh\\n' > {env}/bin/python", "{env}/bin/python"),
    ],
    ids=["pth", "entry-point", "module", "activate", "interpreter"],
)
async def test_a_changed_test_environment_is_toolchain_tampering(env, venv, attack, expected):
    sp = venv / "lib" / PY / "site-packages"
    grader = await prepare_grader(env, "venv", {})
    await act(env, attack.format(sp=sp, env=venv))
    result = await grade(grader, env)
    assert result.score == 0.0 and result.info["score_reason"] == "tampered"
    assert expected.format(sp=sp, env=venv) in changed(result)


@pytest.mark.parametrize(
    ("attack", "expected"),
    [
        ("", ""),
        # a zip archive sys.path names before the standard library; nothing there at first
        (
            "cd {tmp} && printf 'VALUE = 2\\n' > helper.py && "
            "python3 -m zipfile -c {lib}/python{nodot}.zip helper.py",
            "root:{lib}/python{nodot}.zip",
        ),
        ("printf 'import os\\n' > {lib}/{py}/shlex.py", "{lib}/{py}/shlex.py"),  # rewritten
        ("printf 'import os\\n' > {lib}/{py}/vars.py", "root:{lib}/{py}"),  # a new module
        ("mkdir {prefix}/extra && printf 'VALUE = 2\\n' > {prefix}/extra/helper.py",
         "root:{prefix}/extra"),  # a PYTHONPATH directory made after the baseline
        ("printf 'home = /nowhere\\n' > {prefix}/bin/pyvenv.cfg", "root:{prefix}/bin/pyvenv.cfg"),
        ("printf 'import helper\\n' > {lib}/{py}/site-packages/zz.pth",
         "root:{lib}/{py}/site-packages"),
    ],
    ids=["untouched", "zip", "stdlib-module", "stdlib-new", "pythonpath", "pyvenv-cfg", "pth"],
)  # fmt: skip
async def test_a_relocated_interpreter_is_checked_with_paths_it_would_read_first(
    env, prefix, attack, expected
):
    """A full installation with its own prefix: its standard library, its site-packages
    and the entries of its ``sys.path`` that do not exist at the baseline are recorded; any
    of them made or changed is tampering. Untouched, it scores 1."""
    task = {"prefix": str(prefix)}
    nodot = f"{sys.version_info.major}{sys.version_info.minor}"
    where = {"prefix": prefix, "lib": prefix / "lib", "py": PY, "nodot": nodot}
    grader = await prepare_grader(env, "relocated", task)
    record = grader.baseline.test_env
    assert record["bin:python"] == str(prefix / "bin" / PY), record
    assert record[f"root:{prefix / 'lib' / f'python{nodot}.zip'}"] == "missing", record
    assert record[f"root:{prefix / 'extra'}"] == "missing", record
    assert f"root:{prefix / 'lib' / PY}" in record
    if not attack:
        result = await grade(grader, env)
        assert result.score == 1.0 and changed(result) == set(), result.info
        return
    await act(env, attack.format(tmp=prefix.parent, **where))
    result = await grade(grader, env)
    assert result.score == 0.0 and result.info["score_reason"] == "tampered"
    assert expected.format(**where) in changed(result), result.info


@pytest.mark.parametrize(
    ("attack", "expected"),
    [
        ("printf 'VALUE = 2\\n' > {base_sp}/helper.py && printf 'import os\\n' > {base_sp}/zz.pth",
         None),
        ("printf 'import os\\n' > {lib}/vars.py", "root:{lib}"),
    ],
    ids=["base-site-packages", "base-stdlib"],
)  # fmt: skip
async def test_under_a_venv_the_base_site_packages_is_not_walked(
    env, prefix, tmp_path, attack, expected
):
    """A venv of a full installation: the installation's standard library is a root and
    checked, its site-packages (not on the venv's path: nothing in it can be imported) is
    not walked, so a change there is not the test environment's."""
    venv = tmp_path / "prefix-venv"
    subprocess.run([prefix / "bin" / "python", "-m", "venv", "--without-pip", venv], check=True)
    (venv / "lib" / PY / "site-packages" / "helper.py").write_text("VALUE = 1\n")
    lib, base_sp = prefix / "lib" / PY, prefix / "lib" / PY / "site-packages"
    grader = await prepare_grader(env, "relocated", {"prefix": str(venv)})
    record = grader.baseline.test_env
    assert f"root:{lib}" in record and f"root:{base_sp}" not in record, record
    assert f"root:{venv / 'lib' / PY / 'site-packages'}" in record, record
    await act(env, attack.format(lib=lib, base_sp=base_sp))
    result = await grade(grader, env)
    if expected is None:
        assert result.score == 1.0 and changed(result) == set(), result.info
    else:
        assert result.score == 0.0 and expected.format(lib=lib) in changed(result), result.info


async def test_a_relative_interpreter_is_resolved_where_the_tests_run_and_checked(env, venv):
    """``./env/bin/python`` after the eval script's ``cd``: its roots are recorded (they
    were skipped), so a ``.pth`` planted in its site-packages is tampering."""
    grader = await prepare_grader(env, "relative", {"cmd": "./env/bin/python"})
    record = grader.baseline.test_env
    assert record["bin:./env/bin/python"] == str(Path(sys.executable).resolve())
    assert f"root:{venv / 'lib' / PY}" in record
    await act(env, f"printf 'import helper\\n' > {venv / 'lib' / PY / 'site-packages'}/zz.pth")
    result = await grade(grader, env)
    sp = venv / "lib" / PY / "site-packages"
    assert result.score == 0.0 and f"root:{sp}" in changed(result), result.info


async def test_a_test_command_whose_interpreter_cannot_be_resolved_is_a_task_error(env):
    from uniagent.grading.integrity import GradingSetupError

    with pytest.raises(GradingSetupError, match=r"\./nowhere/bin/python cannot be resolved"):
        await prepare_grader(env, "relative", {"cmd": "./nowhere/bin/python"})


@pytest.mark.parametrize("cache_dir", ["new", "existing"])
async def test_bytecode_written_after_the_baseline_is_deleted_not_scored(env, venv, cache_dir):
    # A new __pycache__ changes its package's directory (its names are listed again, and
    # are the same); bytecode in one that was there changes only the __pycache__ directory.
    cache = venv / "lib" / PY / "site-packages" / "__pycache__"
    if cache_dir == "existing":
        cache.mkdir()
        (cache / "old.cpython-3.pyc").write_bytes(b"kept")
    grader = await prepare_grader(env, "venv", {})
    await act(env, f"mkdir -p {cache} && printf 'planted' > {cache}/helper.cpython-3.pyc")
    result = await grade(grader, env)
    assert result.score == 1.0 and changed(result) == set()
    assert result.info["integrity"]["bytecode_purged"] == 1
    assert not (cache / "helper.cpython-3.pyc").exists()
    assert (cache / "old.cpython-3.pyc").exists() == (cache_dir == "existing")


async def test_a_name_added_deep_under_a_root_is_found_by_its_directory(env, venv):
    # Only a changed directory makes the names of a root be listed again: a module added
    # three levels down (with an old mtime) changes its own directory only.
    deep = venv / "lib" / PY / "site-packages" / "pkg" / "sub" / "deeper"
    deep.mkdir(parents=True)
    grader = await prepare_grader(env, "venv", {})
    await act(env, f"printf 'x = 1\\n' > {deep}/mod.py && touch -d @1000000000 {deep}/mod.py")
    result = await grade(grader, env)
    assert result.score == 0.0 and f"root:{venv / 'lib' / PY / 'site-packages'}" in changed(result)


async def test_a_fresh_sandbox_sharing_the_changed_environment_scores_zero(env, venv):
    # Without isolation the fresh sandbox runs the same interpreter the agent could change.
    grader = await prepare_grader(env, "venv", {}, grade_in="fresh", fresh_env=fresh_env)
    await act(env, f"printf 'import helper\\n' > {venv}/lib/{PY}/site-packages/zz.pth")
    result = await grade(grader, env)
    assert result.score == 0.0 and result.info["score_reason"] == "tampered"
    assert f"root:{venv / 'lib' / PY / 'site-packages'}" in changed(result)


PYENV_ROOT = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))


needs_pyenv = pytest.mark.skipif(
    not (PYENV_ROOT / "libexec" / "pyenv").is_file()
    or len([v for v in (PYENV_ROOT / "versions").glob("3.*") if (v / "bin" / "python3").is_file()])
    < 2,
    reason="needs pyenv with two Python 3 versions (the CI machines have them)",
)


@needs_pyenv
@pytest.mark.parametrize("switch", [False, True], ids=["kept", "switched"])
async def test_a_pyenv_shim_is_pinned_to_the_interpreter_pyenv_picks_at_the_baseline(env, switch):
    # `python3` on the grading PATH is pyenv's shim (a bash script that asks pyenv which
    # interpreter to run, a dozen processes each time). The baseline asks pyenv once, in the
    # repository, and puts that version's bin directory before the shims on the grading PATH:
    # the toolchain and test-environment checks and the tests run that interpreter itself. A
    # .python-version the agent writes later no longer picks the interpreter of the tests.
    versions = sorted(v for v in (PYENV_ROOT / "versions").glob("3.*")
                      if (v / "bin" / "python3").is_file())  # fmt: skip
    first, other = versions[0], versions[1]
    shims = PYENV_ROOT / "shims"
    path = f"{shims}:/usr/bin:/bin"
    integrity = {"grading_env": {"PATH": path, "PYENV_VERSION": ""}, "scrub_history": True}
    await act(env, f"echo {first.name} > .python-version")  # the task's own pin
    grader = await prepare_grader(env, "python3", {}, integrity=integrity)
    baseline = grader.baseline
    assert baseline.environment["PATH"] == f"{first / 'bin'}:{path}"
    assert baseline.report()["pyenv"] == {"shims": str(shims), "bins": [str(first / "bin")]}
    assert baseline.scrub is not None  # the same call's report: the pin is not the scrub's
    assert not any(k.startswith("pyenv") for k in baseline.scrub), baseline.scrub
    record = baseline.test_env
    assert record["bin:python3"] == str((first / "bin" / "python3").resolve()), record
    assert any(k.startswith(f"root:{first}/lib/python") for k in record), record
    assert not any(k.startswith(f"root:{PYENV_ROOT}/libexec") for k in record), record
    if switch:
        await act(env, f"echo {other.name} > .python-version")
    result = await grade(grader, env)
    assert result.score == 1.0 and changed(result) == set(), result.info
    assert result.info["output"].strip() == str(first), result.info
    assert result.info["integrity"]["pyenv"]["bins"] == [str(first / "bin")]


@needs_pyenv
@pytest.mark.parametrize("version", ["3.0.404", "system"], ids=["not-installed", "system"])
async def test_a_pyenv_shim_is_left_where_no_installed_version_can_be_pinned(env, version):
    # A version that is not installed (pyenv would fail) or the system's interpreter (pyenv
    # would search PATH without its shims): nothing is pinned, the shim is followed as before.
    path = f"{PYENV_ROOT / 'shims'}:/usr/bin:/bin"
    integrity = {"grading_env": {"PATH": path, "PYENV_VERSION": version}}
    grader = await prepare_grader(env, "python3", {}, integrity=integrity)
    assert grader.baseline.environment["PATH"] == path
    assert grader.baseline.pyenv is None and "pyenv" not in grader.baseline.report()


@needs_pyenv
async def test_an_unpinned_shim_switched_by_the_agent_is_toolchain_tampering(env):
    # The system's interpreter first: nothing to pin, the shim stays on the grading PATH and
    # is followed to what pyenv picks; a .python-version the agent writes switches it.
    other = sorted(v for v in (PYENV_ROOT / "versions").glob("3.*")
                   if (v / "bin" / "python3").is_file())[0]  # fmt: skip
    integrity = {"grading_env": {"PATH": f"{PYENV_ROOT / 'shims'}:/usr/bin:/bin"}}
    await act(env, f"echo system:{other.name} > .python-version")
    grader = await prepare_grader(env, "python3", {}, integrity=integrity)
    assert grader.baseline.pyenv is None
    record = grader.baseline.test_env
    assert f"root:{PYENV_ROOT / 'libexec'}" in record, record
    await act(env, f"echo {other.name} > .python-version")
    result = await grade(grader, env)
    assert result.score == 0.0 and "bin:python3" in changed(result), result.info


def test_the_test_environment_of_an_eval_script():
    script = (
        "#!/bin/bash\nset -uxo pipefail\nsource /opt/miniconda3/bin/activate\n"
        "conda activate testbed\ncd /testbed\ngit status\nexport PATH=/opt/x:$PATH\n"
        "export PYTHONPATH=/opt/y\n"
    )
    spec = script_test_env(script, ["PYTEST_ADDOPTS=-x pytest -rA tests/", "python -m t"])
    assert spec.activate.splitlines() == [
        "source /opt/miniconda3/bin/activate", "conda activate testbed", "cd /testbed",
        "export PATH=/opt/x:$PATH", "export PYTHONPATH=/opt/y"]  # fmt: skip
    assert spec.interpreters == ("pytest", "python", "python3")
    assert spec.required == ("pytest", "python")  # the test commands' own


async def counted_sandbox(env: AgentEnv, commands: list[str]) -> Any:
    """A grading sandbox of ``env`` whose commands go into ``commands``."""
    from uniagent.grading import integrity
    from uniagent.grading.sandbox import GradingSandbox
    from uniagent.protect.settings import IntegritySettings

    environment = await integrity.environment_of(env, IntegritySettings(), {})
    sandbox = await GradingSandbox.open(env, environment, workdir=None)
    run = sandbox.run

    async def counted(command: str, **kwargs: Any) -> Any:
        commands.append(command)
        return await run(command, **kwargs)

    sandbox.run = counted
    return sandbox


async def stat_keys_of(sandbox: Any, path: Path) -> dict[str, str]:
    """The grader's key of ``path`` (device, inode, size, mtime, ctime), read in ``sandbox``."""
    from uniagent.grading import integrity

    listed = f'printf "%s\\0" {path} > $TMPDIR/l; stat_files $TMPDIR/l'
    output = await integrity.run_script(
        sandbox, integrity.scripts.STAT_FILES + listed, {}, what="stat"
    )
    return integrity.stat_keys(output)


async def test_a_file_is_read_again_only_when_its_key_changed(env, tmp_path):
    """The grader hashes a file once per process while its (device, inode, size, mtime,
    ctime) stays: new content with the old size and mtime still gets a new ctime."""
    from uniagent.grading import integrity

    tool = tmp_path / "tool"
    tool.write_text("aaaa\n")
    commands: list[str] = []
    sandbox = await counted_sandbox(env, commands)

    async def digest() -> str:
        keys = await stat_keys_of(sandbox, tool)
        return (await integrity.file_digests(sandbox, keys))[str(tool)]

    try:
        first = await digest()
        read = len(commands)
        assert await digest() == first and len(commands) == read + 1  # the stat only
        before = tool.stat()
        tool.write_text("bbbb\n")
        os.utime(tool, ns=(before.st_atime_ns, before.st_mtime_ns))
        assert await digest() != first
    finally:
        await sandbox.close()


async def test_sandboxes_that_ask_for_the_same_unseen_files_at_once_read_them_once(tmp_path):
    """A run's first wave asks for the same toolchain's digests in every sandbox at once:
    one sandbox reads the files, the others take its digests."""
    from uniagent.grading import integrity

    tool = tmp_path / "tool"
    tool.write_text("content\n")
    commands: list[str] = []
    asked = asyncio.Barrier(3)

    async def digest() -> str:
        async with fresh_env() as env:
            sandbox = await counted_sandbox(env, commands)
            try:
                keys = await stat_keys_of(sandbox, tool)
                await asked.wait()  # none has read it yet
                return (await integrity.file_digests(sandbox, keys))[str(tool)]
            finally:
                await sandbox.close()

    digests = await asyncio.gather(*(digest() for _ in range(3)))
    hashed = [c for c in commands if "sha256sum" in c]
    assert len(set(digests)) == 1 and len(digests[0]) == 64 and len(hashed) == 1


@pytest.fixture
def kept(monkeypatch: pytest.MonkeyPatch) -> testenv._KeptAnswers:
    """The kept interpreters' answers, none yet; a path changed before an answer does not
    make it doubtful (the venv was made just now)."""
    monkeypatch.setattr(testenv, "KEPT_SLACK_NS", 0)
    answers = testenv._KeptAnswers()
    monkeypatch.setattr(testenv, "_KEPT", answers)
    return answers


async def baseline_of(reward: str) -> dict[str, str]:
    """The test environment's record of a baseline in a new sandbox, graded unchanged."""
    async with fresh_env() as sandbox:
        grader = await prepare_grader(sandbox, reward, {})
        record = dict(grader.baseline.test_env)
        result = await grade(grader, sandbox)
        assert result.score == 1.0 and changed(result) == set(), result.info
    return record


async def test_a_later_baseline_takes_the_interpreters_answer_while_it_holds(kept, venv):
    # Without isolation the discovery's interpreter (with its site: every .pth and what it
    # imports) starts once; later sandboxes take its answer while none of its paths changed.
    first = await baseline_of("absolute")
    assert kept.given == 0 and f"root:{venv / 'lib' / PY / 'site-packages'}" in first
    assert await baseline_of("absolute") == first
    assert await baseline_of("absolute") == first
    assert kept.given == 2


async def test_a_first_wave_of_baselines_starts_the_interpreter_once(kept, venv, monkeypatch):
    # A run's episodes start together: one baseline's interpreter answers, the others wait
    # for its answer instead of each starting it.
    discover, together = testenv._discover, asyncio.Barrier(4)

    async def at_once(*args: Any) -> None:
        await together.wait()  # every baseline has come this far: none has an answer yet
        await discover(*args)

    monkeypatch.setattr(testenv, "_discover", at_once)
    first, *others = await asyncio.gather(*(baseline_of("absolute") for _ in range(4)))
    assert all(other == first for other in others) and kept.given == 3


@pytest.mark.parametrize("change", ["a new .pth", "a .pth rewritten", "a start-up module changed"])
async def test_an_answer_is_not_taken_again_once_its_start_up_changed(kept, venv, tmp_path, change):
    # Each change puts a directory on sys.path without a name added to any directory the
    # answer listed but the first's: the later baseline must see it as a root.
    site = venv / "lib" / PY / "site-packages"
    extra = tmp_path / "extra"
    extra.mkdir()
    (site / "old.pth").write_text("# nothing\n")
    (site / "sitecustomize.py").write_text("X = 1\n")
    first = await baseline_of("absolute")
    assert f"root:{extra}" not in first
    if change == "a new .pth":
        (site / "new.pth").write_text(f"{extra}\n")
    elif change == "a .pth rewritten":
        (site / "old.pth").write_text(f"{extra}\n")
    else:
        (site / "sitecustomize.py").write_text(f"import sys\nsys.path.append({str(extra)!r})\n")
    again = await baseline_of("absolute")
    assert kept.given == 0 and f"root:{extra}" in again
    assert await baseline_of("absolute") == again and kept.given == 1


FORGE = r"""
import atexit, os


def forge():
    # As another episode's agent could (no isolation: the scratch dirs are the host's): the
    # discovery's files in this sandbox's scratch dir rewritten once the interpreter ran,
    # an answer that leaves the test environment's site-packages out.
    record = os.path.join(os.environ.get("TMPDIR", "/nonexistent"), "env.out")
    try:
        with open(record, encoding="utf-8") as f:
            head = f.read().split("\n")
    except OSError:
        return
    asked = [i for i, line in enumerate(head) if line.startswith("asked\t")]
    if asked:
        with open(record + ".new", "w", encoding="utf-8") as f:
            f.write("\n".join(head[: asked[-1] + 1]) + "\nroot /forged\nanswered 0\n")
        os.replace(record + ".new", record)


atexit.register(forge)
# And on the discovery's own output channel (its fd 4), an answer for another interpreter.
try:
    os.write(4, b"answer\t/usr/bin/env\t/usr/bin/env\t0\n\troot /forged\n")
except OSError:
    pass
"""


async def test_an_answer_rewritten_in_the_scratch_dir_is_not_the_one_kept(kept, venv):
    site = venv / "lib" / PY / "site-packages"
    (site / "sitecustomize.py").write_text(FORGE)
    first = await baseline_of("absolute")
    assert f"root:{site}" in first and "root:/forged" not in first
    again = await baseline_of("absolute")
    assert kept.given == 1 and again == first
    answers = [a.text for held in kept._answers.values() for a in held.values()]
    assert answers and not any("/forged" in text for text in answers)
