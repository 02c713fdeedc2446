"""What a bubblewrap sandbox cannot write is checked once per process, not per episode: the
names under a test-environment root bound read-only are listed at the first baseline only,
and not walked again at grading; a root under a writable bind is checked as ever. A
toolchain wholly on read-only binds is checked at the first baseline only."""

from __future__ import annotations

import asyncio
import shlex
import subprocess
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from uniagent import RewardSpec, hookimpl, open_env
from uniagent.env import AgentEnv, host
from uniagent.grading.sandbox import GradingSandbox
from uniagent.plugins import load_plugins, reset_plugins
from uniagent.protect.settings import IntegrityDefaults, TestEnv
from uniagent.reward import RewardContext, RewardResult
from uniagent.testing.grading import grade, prepare_grader

#: The system's interpreter: what a bwrap sandbox sees of the host (``/usr``, read-only).
SYSTEM_PYTHON = "/usr/bin/python3"
SETUP = (
    "git init -q && git config user.email t@t && git config user.name t && "
    "printf 'x = 1\\n' > calc.py && git add -A && git commit -qm base"
)


def _version() -> str:
    done = subprocess.run(
        [SYSTEM_PYTHON, "-c", "import sys; print('python%d.%d' % sys.version_info[:2])"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return done.stdout.strip()


@pytest.fixture
def venv(tmp_path: Path) -> Path:
    """A venv of the system interpreter, bound writable into the sandbox at the same path."""
    path = tmp_path / "env"
    subprocess.run([SYSTEM_PYTHON, "-m", "venv", "--without-pip", str(path)], check=True)
    (path / "lib" / _version() / "site-packages" / "helper.py").write_text("VALUE = 1\n")
    # The sandbox's root is another host user when this runs as root: it may write here.
    subprocess.run(["chmod", "-R", "a+rwX", str(path)], check=True)
    return path


pytestmark = pytest.mark.usefixtures("new_process")


@pytest.fixture(autouse=True)
def rewards(venv: Path) -> Iterator[None]:
    reset_plugins()
    activate = f"source {shlex.quote(str(venv))}/bin/activate"

    async def run_python(ctx: RewardContext[Any]) -> RewardResult:
        done = await ctx.require_sandbox().run(
            f"{activate} && python -c 'import helper'", timeout=60
        )
        return RewardResult(1.0 if done.exit_code == 0 else 0.0, {"output": done.output})

    def test_env(task: Any, settings: Any) -> TestEnv:
        return TestEnv(activate=activate, interpreters=("python", "python3"))

    async def run_system_python(ctx: RewardContext[Any]) -> RewardResult:
        done = await ctx.require_sandbox().run(f"{ctx.task['python']} -c 'import json'", timeout=60)
        return RewardResult(1.0 if done.exit_code == 0 else 0.0, {"output": done.output})

    def system_env(task: Any, settings: Any) -> TestEnv:
        return TestEnv(interpreters=(task["python"], "python3"))

    @hookimpl
    def uniagent_rewards():
        yield RewardSpec(name="venv", fn=run_python, integrity=IntegrityDefaults(test_env=test_env))
        yield RewardSpec(
            name="system", fn=run_system_python, integrity=IntegrityDefaults(test_env=system_env)
        )

    load_plugins().register(types.SimpleNamespace(uniagent_rewards=uniagent_rewards), "t")
    yield
    reset_plugins()


def bwrap_env(venv: Path) -> AgentEnv:
    deployment = {"type": "host", "isolation": "bwrap", "binds": [str(venv)]}
    return open_env(deployment, {"post_setup": [SETUP]})


def walked(outputs: list[str]) -> dict[str, str]:
    """root -> what the test-environment script printed for it (``digest ROOT SHA``)."""
    found = {}
    for output in outputs:
        for line in output.splitlines():
            if line.startswith("digest "):
                root, _, digest = line.removeprefix("digest ").rpartition(" ")
                found[root] = digest
    return found


@pytest.fixture
def outputs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The output of every grading command, in order."""
    seen: list[str] = []
    run = GradingSandbox.run

    async def recorded(self: GradingSandbox, command: str, **kwargs: Any) -> Any:
        done = await run(self, command, **kwargs)
        seen.append(done.output)
        return done

    monkeypatch.setattr(GradingSandbox, "run", recorded)
    return seen


@pytest.fixture
def commands(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every grading command, in order."""
    seen: list[str] = []
    run = GradingSandbox.run

    async def recorded(self: GradingSandbox, command: str, **kwargs: Any) -> Any:
        seen.append(command)
        return await run(self, command, **kwargs)

    monkeypatch.setattr(GradingSandbox, "run", recorded)
    return seen


def toolchain_checks(commands: list[str]) -> int:
    return sum(1 for c in commands if c.startswith("TOOLS="))


def env_checks(commands: list[str]) -> int:
    return sum(1 for c in commands if c.startswith("ACTIVATE="))


@pytest.mark.parametrize("python", ["python3", SYSTEM_PYTHON, "./python3"])
async def test_a_read_only_test_environment_is_not_checked_again_at_grading(venv, commands, python):
    env = bwrap_env(venv)
    await env.start()
    try:
        if python.startswith("./"):  # a relative interpreter: the repository's, writable
            act = f"ln -s {SYSTEM_PYTHON} python3 && git add python3 && git commit -qm py"
            assert (await env.run_action(act, timeout=30)).exit_code == 0
        grader = await prepare_grader(env, "system", {"python": python})
        record = grader.baseline.test_env
        assert record[f"bin:{python}"] and any(k.startswith("root:/usr/lib/") for k in record)
        commands.clear()
        result = await grade(grader, env)
        assert result.score == 1.0
        # Nothing of it can have changed: no activation, every path of it read-only. A
        # relative interpreter resolves in the writable repository: checked again.
        assert env_checks(commands) == (1 if python.startswith("./") else 0)
    finally:
        await env.close()


async def test_a_read_only_toolchain_is_checked_at_the_first_baseline_only(venv, commands):
    for link in ("/bin", "/sbin"):  # merged /usr: the sandbox's link is on its read-only root
        if Path(link).is_symlink():
            env = bwrap_env(venv)
            target = str(Path(link).resolve())
            assert env.read_only_source(f"{link}/sh") is None  # not started: no mounts
            await env.start()
            try:
                assert env.read_only_source(f"{link}/sh") == f"{target}/sh"
            finally:
                await env.close()
    found = []
    for episode in range(2):
        env = bwrap_env(venv)
        await env.start()
        try:
            commands.clear()
            grader = await prepare_grader(env, "venv", {})
            assert toolchain_checks(commands) == (0 if episode else 1)
            found.append(grader.baseline.toolchain)
            commands.clear()
            result = await grade(grader, env)
            assert toolchain_checks(commands) == 0 and result.score == 1.0
        finally:
            await env.close()
    assert found[0] == found[1] and "bin:git" in found[0]


async def test_a_toolchain_that_may_change_is_checked_every_time(venv, commands, monkeypatch):
    monkeypatch.setattr(host, "_unisolated", True)  # a sandbox without isolation ran here
    for _ in range(2):
        env = bwrap_env(venv)
        await env.start()
        try:
            commands.clear()
            grader = await prepare_grader(env, "venv", {})
            result = await grade(grader, env)
            assert toolchain_checks(commands) == 2 and result.score == 1.0
        finally:
            await env.close()


async def test_read_only_roots_are_listed_once_and_writable_ones_every_time(venv, outputs):
    stdlib = f"/usr/lib/{_version()}"
    site = str(venv / "lib" / _version())
    digests = []
    for episode in range(2):
        env = bwrap_env(venv)
        await env.start()
        try:
            assert env.read_only_source(stdlib) == stdlib
            assert env.read_only_source(site) is None  # a writable bind
            outputs.clear()
            grader = await prepare_grader(env, "venv", {})
            at_start = walked(outputs)
            record = grader.baseline.test_env
            assert f"root:{stdlib}" in record and f"root:{site}" in record
            digests.append(record[f"root:{stdlib}"])
            # The first baseline lists the read-only root's names, the second knows them.
            assert at_start[stdlib] == ("known" if episode else digests[0])
            assert at_start[site] == record[f"root:{site}"]  # listed each time
            if episode:
                pth = f"printf 'import helper\\n' > {site}/site-packages/zz.pth"
                assert (await env.run_action(pth, timeout=30)).exit_code == 0
            outputs.clear()
            result = await grade(grader, env)
            at_end = walked(outputs)
            assert stdlib not in at_end and site in at_end  # only the writable root walked
            tampered = {t["path"] for t in result.info["integrity"]["tampered"]}
            if episode:
                assert result.score == 0.0 and f"root:{site}/site-packages" in tampered
            else:
                assert result.score == 1.0 and not tampered
        finally:
            await env.close()
    assert digests[0] == digests[1]


async def test_nothing_is_read_only_once_a_sandbox_ran_without_isolation(venv):
    env = bwrap_env(venv)
    await env.start()
    try:
        assert env.read_only_source("/usr/lib") == "/usr/lib"
        assert env.read_only_source("/usr") == "/usr"
        assert env.read_only_source("/tmp") is None and env.read_only_source("/") is None
        none = open_env({"type": "host", "isolation": "none"}, {})
        await none.start()
        await none.close()
        assert env.read_only_source("/usr/lib") is None  # it could have written there
        assert none.read_only_source("/usr/lib") is None
    finally:
        await env.close()


@pytest.mark.parametrize(
    ("python", "repo_file", "again"),
    [
        ("python3", None, False),
        (SYSTEM_PYTHON, None, False),
        ("./python3", None, True),  # a relative interpreter: the repository's, writable
        ("python3", "pytest.py", True),  # found first: the interpreter starts in the repo
        ("python3", "pluggy/__init__.py", True),
        ("python3", "src/_pytest/__init__.py", True),  # a directory of it may be on sys.path
        ("python3", "lib/extra.pth", True),
        ("python3", "pkg.egg-info/entry_points.txt", True),
    ],
)
async def test_a_read_only_test_environment_is_discovered_at_the_first_baseline_only(
    venv, commands, python, repo_file, again
):
    records = []
    for episode in range(2):
        env = bwrap_env(venv)
        await env.start()
        try:
            if python.startswith("./"):
                act = f"ln -s {SYSTEM_PYTHON} python3 && git add python3 && git commit -qm py"
                assert (await env.run_action(act, timeout=30)).exit_code == 0
            if repo_file is not None and episode:  # the second repository has one
                make = f"mkdir -p $(dirname {repo_file}) && touch {repo_file}"
                assert (await env.run_action(make, timeout=30)).exit_code == 0
            commands.clear()
            grader = await prepare_grader(env, "system", {"python": python})
            assert env_checks(commands) == (1 if again or not episode else 0)
            records.append(grader.baseline.test_env)
            assert records[-1][f"bin:{python}"]
            result = await grade(grader, env)
            assert result.score == 1.0
        finally:
            await env.close()
    if repo_file is None:
        assert records[0] == records[1]


async def test_a_test_environment_with_an_activation_is_discovered_every_time(venv, commands):
    for _ in range(2):
        env = bwrap_env(venv)
        await env.start()
        try:
            commands.clear()
            await prepare_grader(env, "venv", {})
            assert env_checks(commands) == 1  # its activation may read what the sandbox wrote
        finally:
            await env.close()


async def test_a_known_record_is_not_taken_once_a_sandbox_ran_without_isolation(
    venv, commands, monkeypatch
):
    for episode in range(2):
        if episode:
            monkeypatch.setattr(host, "_unisolated", True)  # it could have written anywhere
        env = bwrap_env(venv)
        await env.start()
        try:
            commands.clear()
            grader = await prepare_grader(env, "system", {"python": SYSTEM_PYTHON})
            assert env_checks(commands) == 1
            assert (await grade(grader, env)).score == 1.0
        finally:
            await env.close()


async def test_a_first_wave_checks_a_read_only_environment_once(venv, commands):
    # A run's episodes start together: the first to ask checks, the others take its answer.
    envs = [bwrap_env(venv) for _ in range(3)]
    await asyncio.gather(*(env.start() for env in envs))
    try:
        graders = await asyncio.gather(
            *(prepare_grader(env, "system", {"python": SYSTEM_PYTHON}) for env in envs)
        )
        assert env_checks(commands) == 1 and toolchain_checks(commands) == 1, commands
        records = [grader.baseline.test_env for grader in graders]
        toolchains = [grader.baseline.toolchain for grader in graders]
        assert records[0] == records[1] == records[2] and records[0]
        assert toolchains[0] == toolchains[1] == toolchains[2] and toolchains[0]
        results = await asyncio.gather(*(grade(g, e) for g, e in zip(graders, envs, strict=True)))
        assert [result.score for result in results] == [1.0, 1.0, 1.0]
    finally:
        await asyncio.gather(*(env.close() for env in envs))


async def test_a_wave_whose_environment_may_change_checks_it_in_every_sandbox(
    venv, commands, monkeypatch
):
    monkeypatch.setattr(host, "_unisolated", True)  # nothing is read-only: no key, no wait
    envs = [bwrap_env(venv) for _ in range(2)]
    await asyncio.gather(*(env.start() for env in envs))
    try:
        await asyncio.gather(
            *(prepare_grader(env, "system", {"python": SYSTEM_PYTHON}) for env in envs)
        )
        assert env_checks(commands) == 2 and toolchain_checks(commands) == 2
    finally:
        await asyncio.gather(*(env.close() for env in envs))
