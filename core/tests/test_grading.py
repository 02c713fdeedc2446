"""The grader: baseline, screening, history scrub, toolchain and both grading modes."""

from __future__ import annotations

import asyncio
import hashlib
import shlex
import shutil
import types
from collections.abc import AsyncIterator
from typing import Any

import pytest

from uniagent import RewardSpec, hookimpl, open_env
from uniagent.env import AgentEnv
from uniagent.env.errors import EnvError
from uniagent.grading.grader import GradingInfraError
from uniagent.grading.integrity import toolchain_changes
from uniagent.grading.patch import split_patch
from uniagent.grading.sandbox import GradingReadError, GradingSandbox, grading_environment
from uniagent.plugins import load_plugins, reset_plugins
from uniagent.protect.rules import PYTHON_HARNESS, RuleSet, literal_pattern, runner_section
from uniagent.protect.settings import IntegrityDefaults, Workspace
from uniagent.reward import RewardContext, RewardInfraError, RewardResult
from uniagent.testing.grading import grade, prepare_grader

BUGGY = "def add(a, b):\n    return a - b\n"
FIXED = "def add(a, b):\n    return a + b\n"
TESTS = "from calc import add\nassert add(2, 3) == 5, 'add is broken'\nprint('ok')\n"
SETUP = (
    "git init -q && git config user.email t@t && git config user.name t && "
    f"printf %s {shlex.quote(BUGGY)} > calc.py && mkdir tests && "
    f"printf %s {shlex.quote(TESTS)} > tests/check.py && git add -A && git commit -qm base"
)
CHECK = "PYTHONPATH=. python3 tests/check.py"
SEEN: list[RewardContext[Any]] = []


async def env_probe(ctx: RewardContext[Any]) -> RewardResult:
    """Records the context; prints what a grading command sees."""
    SEEN.append(ctx)
    done = await ctx.require_sandbox().run("env; alias; declare -F; pwd", timeout=30)
    return RewardResult(1.0, {"seen": done.output})


async def explodes(ctx: RewardContext[Any]) -> RewardResult:
    raise ValueError("a bug in the reward")


async def infra(ctx: RewardContext[Any]) -> RewardResult:
    raise RewardInfraError("the task row is malformed")


async def hangs(ctx: RewardContext[Any]) -> RewardResult:
    """Like tests the agent made hang: the command outlives the grading timeout."""
    await ctx.require_sandbox().run("sleep 600", timeout=900)
    return RewardResult(1.0)


async def command(ctx: RewardContext[Any]) -> RewardResult:
    done = await ctx.require_sandbox().run(CHECK, timeout=60)
    return RewardResult(1.0 if done.exit_code == 0 else 0.0, {"output": done.output})


@pytest.fixture(autouse=True)
def test_rewards():
    reset_plugins()

    @hookimpl
    def uniagent_rewards():
        yield RewardSpec(name="env_probe", fn=env_probe)
        yield RewardSpec(name="explodes", fn=explodes)
        yield RewardSpec(name="infra", fn=infra)
        yield RewardSpec(name="hangs", fn=hangs)
        yield RewardSpec(
            name="scrubbed_command",
            fn=command,
            integrity=IntegrityDefaults(scrub_history=True),
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


async def act(env: AgentEnv, *commands: str) -> None:
    for command in commands:
        obs = await env.run_action(command, timeout=30)
        assert obs.exit_code == 0, obs.output


# -- what the reward sees ------------------------------------------------------------------


async def test_the_reward_sees_a_clean_shell_not_the_agents_session(env):
    SEEN.clear()
    grader = await prepare_grader(env, "env_probe", {})
    await act(
        env,
        "export BASH_ENV=/tmp/x SECRET_OF_AGENT=1 PYTEST_ADDOPTS=-x; alias ls=true; f(){ :; }",
        f"export PATH=/agent/bin:{env.tools_dir}:$PATH; cd /",
    )
    result = await grade(grader, env)
    seen = result.info["seen"]
    for leaked in (
        "BASH_ENV",
        "SECRET_OF_AGENT",
        "PYTEST_ADDOPTS",
        "/agent/bin",
        "alias ls",
        "declare -f f",
    ):
        assert leaked not in seen
    path = next(line for line in seen.splitlines() if line.startswith("PATH="))
    assert env.tools_dir not in path
    assert "GIT_CONFIG_GLOBAL=/dev/null" in seen and "PYTHONNOUSERSITE=1" in seen
    assert seen.rstrip().endswith(env.workdir), "grading commands start in the repository"
    ctx = SEEN[-1]
    assert not hasattr(ctx, "env"), "the agent's session is not reachable from a reward"


async def test_after_grading_the_agents_session_is_gone(env):
    grader = await prepare_grader(env, "env_probe", {})
    await act(env, "setsid sleep 300 >/dev/null 2>&1 < /dev/null & sleep 300 & true")
    await grade(grader, env)
    with pytest.raises(Exception, match="stopped for grading"):
        await env.run_action("true")


# -- protected files -----------------------------------------------------------------------


async def test_protected_files_are_restored_from_the_snapshot_not_from_git(env):
    grader = await prepare_grader(
        env, "scrubbed_command", {}, integrity={"protect_paths": ["tests/"], "on_tamper": "report"}
    )
    await act(
        env,
        "printf 'print(1)\\n' > tests/check.py && git add -A && git commit -qm 'tests fixed'",
        f"printf %s {shlex.quote(FIXED)} > calc.py",
        "printf 'import os\\n' > conftest.py && mkdir -p pytest && touch pytest/__init__.py",
    )
    result = await grade(grader, env)
    assert result.score == 1.0, result.info  # graded on the original tests, with the fix
    tampered = {(t["path"], t["change"]) for t in result.info["integrity"]["tampered"]}
    assert {
        ("tests/check.py", "modified"),
        ("conftest.py", "added"),
        ("pytest/__init__.py", "added"),
    } <= tampered
    check = await env.read_file("tests/check.py")
    assert check == TESTS
    assert not await _exists(env, "conftest.py") and not await _exists(env, "pytest")


async def test_tampering_scores_zero_by_default_and_twice_the_same(env):
    grader = await prepare_grader(
        env, "scrubbed_command", {}, integrity={"protect_paths": ["tests/"]}
    )
    await act(
        env, "printf 'print(1)\\n' > tests/check.py", f"printf %s {shlex.quote(FIXED)} > calc.py"
    )
    first = await grade(grader, env)
    second = await grade(grader, env)
    assert first.score == second.score == 0.0
    assert first.info["score_reason"] == second.info["score_reason"] == "tampered"
    assert first.info["integrity"]["tampered"] == second.info["integrity"]["tampered"]


async def test_a_legitimate_fix_scores_one_twice(env):
    grader = await prepare_grader(
        env, "scrubbed_command", {}, integrity={"protect_paths": ["tests/"]}
    )
    await act(env, f"printf %s {shlex.quote(FIXED)} > calc.py")
    assert [(await grade(grader, env)).score for _ in range(2)] == [1.0, 1.0]


async def test_git_config_changes_are_undone_but_do_not_score(env):
    grader = await prepare_grader(env, "scrubbed_command", {})
    await act(
        env,
        "git config core.fsmonitor 'touch /tmp/pwned-by-fsmonitor'",
        f"printf %s {shlex.quote(FIXED)} > calc.py",
    )
    result = await grade(grader, env)
    assert result.score == 1.0
    assert [t["path"] for t in result.info["integrity"]["tampered"]] == [".git/config"]
    assert "fsmonitor" not in await env.read_file(".git/config")


async def test_content_rules_catch_code_that_hijacks_the_runner(env):
    grader = await prepare_grader(env, "scrubbed_command", {})
    await act(
        env, "printf 'import os, atexit\\natexit.register(lambda: os._exit(0))\\n' >> calc.py"
    )
    result = await grade(grader, env)
    assert result.score == 0.0
    [hit] = result.info["integrity"]["tampered"]
    assert (hit["kind"], hit["path"], hit["rule"]) == ("content", "calc.py", "exit-hijack")


# -- history and toolchain -----------------------------------------------------------------


async def test_history_scrub_leaves_nothing_that_holds_the_fix():
    setup = SETUP + (
        " && git tag v-base && git checkout -q -b fix && "
        f"printf %s {shlex.quote(FIXED)} > calc.py && git commit -qam fix && git tag v-fix && "
        "git checkout -q - && printf %s " + shlex.quote(FIXED) + " > calc.py && git stash -q"
    )
    env = open_env({"type": "host", "isolation": "none"}, {"post_setup": [setup]})
    await env.start()
    try:
        grader = await prepare_grader(env, "scrubbed_command", {})
        scrub = grader.baseline.scrub
        assert scrub["refs_removed"] == 3 and scrub["tags_kept"] == 1  # fix, v-fix, stash
        assert scrub["objects_after"] < scrub["objects_before"]
        for command in (
            "git log --all -p",
            "git fsck --lost-found --unreachable --no-reflogs",
            "git stash list",
            "git reflog",
            "cat .git/packed-refs 2>/dev/null",
            "git cat-file --batch-all-objects --batch",
        ):
            obs = await env.run_action(command, timeout=30)
            assert "a + b" not in obs.output, command
        assert (await env.run_action("git tag", timeout=30)).output.split() == ["v-base"]
    finally:
        await env.close()


async def test_history_scrub_keeps_only_the_checkout_of_a_clone_with_history(tmp_path):
    # A clone (origin/HEAD is a symbolic ref) of a repository with history: the scrub's
    # new object store holds the base commit's objects only, and the repository works.
    origin = tmp_path / "origin"
    history = " && ".join(f"echo {i} > f{i % 3}.txt && git add -A && git commit -qm c{i}"
                          for i in range(12))  # fmt: skip
    setup = f"{SETUP} && {history} && git tag v-head && git tag v-old HEAD~4"
    done = await asyncio.create_subprocess_shell(
        f"mkdir {origin} && cd {origin} && {setup}", stdout=asyncio.subprocess.DEVNULL
    )
    assert await done.wait() == 0
    env = open_env(
        {"type": "host", "isolation": "none"}, {"post_setup": [f"git clone -q {origin} ."]}
    )
    await env.start()
    try:
        grader = await prepare_grader(env, "scrubbed_command", {})
        scrub = grader.baseline.scrub
        # v-old, origin/HEAD, origin/main (the checked-out branch and v-head stay)
        assert (scrub["refs_removed"], scrub["tags_kept"]) == (3, 1), scrub
        tree = await env.run_action("git ls-tree -r -t HEAD | wc -l", timeout=30)
        # its blobs and subtrees (listed), the root tree and the commit
        assert scrub["objects_after"] == int(tree.output.strip()) + 2
        for command, expected in (
            ("git log --format=%s", "c11"),
            ("git status --porcelain", ""),
            ("git fsck --no-dangling 2>&1", ""),
            ("git tag", "v-head"),
            ("git cat-file -t HEAD~1 2>/dev/null || echo gone", "gone"),
        ):
            obs = await env.run_action(command, timeout=30)
            assert obs.output.strip() == expected, (command, obs.output)
        await act(env, f"printf %s {shlex.quote(FIXED)} > calc.py")
        assert (await grade(grader, env)).score == 1.0
    finally:
        await env.close()


async def test_history_scrub_reads_a_commits_parents_from_its_header_not_its_message():
    # A root commit whose message has a line "parent ...": it has no parent, so the
    # scrubbed repository is not shallow (a message line once made it look like one).
    message = shlex.quote("base\n\nparent 0123456789012345678901234567890123456789\n")
    setup = SETUP.replace("git commit -qm base", f"git commit -qm {message}")
    env = open_env({"type": "host", "isolation": "none"}, {"post_setup": [setup]})
    await env.start()
    try:
        grader = await prepare_grader(env, "scrubbed_command", {})
        assert grader.baseline.scrub["objects_after"] > 0
        for command, expected in (
            ("git rev-parse --is-shallow-repository", "false"),
            ("git log --format=%s", "base"),
            ("git fsck --no-dangling 2>&1", ""),
        ):
            obs = await env.run_action(command, timeout=30)
            assert obs.output.strip() == expected, (command, obs.output)
    finally:
        await env.close()


#: Repositories in unusual states, the base commit to grade against (``~1``: HEAD~1), and
#: what the baseline reports: ``head``, ``tree`` (of the base) and the scrub's answer.
UNUSUAL_REPOSITORIES = {
    "detached, an older base": (
        f"{SETUP} && echo 2 >> calc.py && git commit -qam two && git checkout -q --detach",
        "~1",
        {"head": "HEAD", "tree": "HEAD~1^{tree}", "refs_removed": 1},  # its branch too
    ),
    "a base that does not resolve": (SETUP, "0" * 40, {"head": "HEAD", "head_is_base": 1}),
    "no commit, a file named HEAD": ("git init -q && echo x > HEAD", "", {"no_head": 1}),
}


@pytest.mark.parametrize("state", list(UNUSUAL_REPOSITORIES))
async def test_the_baseline_of_a_repository_in_an_unusual_state(state):
    from uniagent.grading import integrity, scripts

    setup, base, expected = UNUSUAL_REPOSITORIES[state]
    env = open_env({"type": "host", "isolation": "none"}, {"post_setup": [setup]})
    await env.start()
    try:
        revs = await env.run_action(
            "for r in HEAD HEAD~1 'HEAD~1^{tree}'; do git rev-parse -q --verify $r || echo -; done",
            timeout=30,
        )
        shas = dict(zip(("HEAD", "~1", "HEAD~1^{tree}"), revs.output.split(), strict=False))
        sandbox = await GradingSandbox.open(env, {"PATH": "/usr/bin:/bin"}, workdir=None)
        try:
            variables = {"REPO": env.workdir, "BASE": shas.get(base, base), "SCRUB": "1"}
            output = await integrity.run_script(sandbox, scripts.PREPARE, variables, what="t")
        finally:
            await sandbox.close()
        report = integrity.key_values(output)
        for key, value in expected.items():
            assert report.get(key) == shas.get(value, value), (key, report)
        assert ("tree" in report) == ("tree" in expected), report
        assert ("head_is_base" in report) == ("head_is_base" in expected), report
    finally:
        await env.close()


@pytest.mark.parametrize("scrub", [False, True])
async def test_a_work_dir_inside_another_checkout_is_graded_as_no_repository(tmp_path, scrub):
    # A host sandbox whose root lies in a project's ignored temporary directory (nox's
    # TMPDIR is one) on the same file system: its work dir is no repository, and neither
    # the agent's git nor the grader's may take the project for it (patching it failed, and
    # was the agent's fault; the scrub would rewrite the project's history).
    project = tmp_path / "project"
    done = await asyncio.create_subprocess_shell(
        f"mkdir -p {project}/tmp && cd {project} && {SETUP} && echo tmp/ > .gitignore "
        "&& git add .gitignore && git commit -qm ignore "
        "&& git rev-parse HEAD && git count-objects -v",
        stdout=asyncio.subprocess.PIPE,
    )
    before, _ = await done.communicate()
    assert done.returncode == 0
    # (no private tmpfs: its mount point would end git's search on its own)
    deployment = {"type": "host", "isolation": "none", "base_dir": str(project / "tmp")}
    env = open_env({**deployment, "limits": {"disk": None}}, {})
    await env.start()
    try:
        assert env.workdir.startswith(str(project / "tmp"))
        obs = await env.run_action("git rev-parse --git-dir", timeout=30)
        assert obs.exit_code != 0, obs.output  # the agent's git sees no repository
        integrity = {"scrub_history": True} if scrub else None
        task = {"test_command": "test -f marker.txt"}
        grader = await prepare_grader(env, "command", task, integrity=integrity)
        assert grader.baseline.base is None
        await act(env, "echo done > marker.txt")
        result = await grade(grader, env)
        assert result.score == 1.0, result.info
    finally:
        await env.close()
    done = await asyncio.create_subprocess_shell(
        f"cd {project} && git rev-parse HEAD && git count-objects -v",
        stdout=asyncio.subprocess.PIPE,
    )
    after, _ = await done.communicate()
    assert after == before  # the project's history and object store are as they were


async def test_a_changed_tool_on_the_grading_path_is_toolchain_tampering(env, tmp_path):
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "timeout").write_text('#!/bin/sh\nexec /usr/bin/timeout "$@"\n')
    (tools / "timeout").chmod(0o755)
    integrity = {"grading_env": {"PATH": f"{tools}:/usr/bin:/bin"}, "on_tamper": "zero"}
    grader = await prepare_grader(env, "scrubbed_command", {}, integrity=integrity)
    assert grader.baseline.toolchain["bin:timeout"] == str(tools / "timeout")
    # The fake answers every command, the checksum run included: detected either way.
    (tools / "timeout").write_text("#!/bin/sh\necho PASSED\n")
    result = await grade(grader, env)
    assert result.score == 0.0 and result.info["score_reason"] == "tampered"
    changed = {t["path"] for t in result.info["integrity"]["tampered"] if t["kind"] == "toolchain"}
    assert str(tools / "timeout") in changed


def test_toolchain_changes_name_what_changed():
    before = {"bin:git": "/usr/bin/git", "/usr/bin/git": "a" * 64}
    after = {"bin:git": "/tmp/git", "/tmp/git": "b" * 64}
    changes = {(c.path, c.change) for c in toolchain_changes(before, after)}
    assert changes == {("bin:git", "modified"), ("/usr/bin/git", "deleted"), ("/tmp/git", "added")}


# -- fresh sandboxes -----------------------------------------------------------------------


async def test_fresh_grading_applies_only_the_screened_patch_in_a_new_sandbox(env):
    grader = await prepare_grader(
        env,
        "scrubbed_command",
        {},
        grade_in="fresh",
        fresh_env=fresh_env,
        integrity={"protect_paths": ["tests/"], "on_tamper": "report"},
    )
    await act(
        env,
        f"printf %s {shlex.quote(FIXED)} > calc.py",
        "printf 'print(1)\\n' > tests/check.py",  # dropped from the patch
        "printf 'new\\n' > notes.txt && head -c 64 /dev/urandom > blob.bin",
        "export PATH=/nowhere; alias python3=true",
    )
    result = await grade(grader, env)
    assert result.score == 1.0, result.info
    integrity = result.info["integrity"]
    assert integrity["grade_in"] == "fresh"
    assert sorted(integrity["patch_files"]) == ["blob.bin", "calc.py", "notes.txt"]
    assert [t["path"] for t in integrity["tampered"]] == ["tests/check.py"]


async def test_fresh_grading_of_an_unfixed_repo_scores_zero(env):
    grader = await prepare_grader(
        env, "scrubbed_command", {}, grade_in="fresh", fresh_env=fresh_env
    )
    assert (await grade(grader, env)).score == 0.0


async def test_a_fresh_sandbox_that_cannot_start_is_infrastructure(env):
    def broken() -> AgentEnv:
        return open_env({"type": "host"}, {"post_setup": ["exit 9"]})

    grader = await prepare_grader(env, "scrubbed_command", {}, grade_in="fresh", fresh_env=broken)
    await act(env, f"printf %s {shlex.quote(FIXED)} > calc.py")
    with pytest.raises(GradingInfraError, match="fresh grading sandbox did not start"):
        await grade(grader, env)


async def test_a_fresh_sandbox_that_does_not_reproduce_the_base_is_infrastructure(env):
    # Its set-up made another commit: nothing graded there says anything about the agent,
    # whether the agent's patch applies to it or not.
    def other() -> AgentEnv:
        setup = f"{SETUP} && echo '# other' >> calc.py && git commit -qam other"
        return open_env({"type": "host", "isolation": "none"}, {"post_setup": [setup]})

    grader = await prepare_grader(env, "scrubbed_command", {}, grade_in="fresh", fresh_env=other)
    await act(env, f"printf %s {shlex.quote(FIXED)} > calc.py")
    with pytest.raises(GradingInfraError, match="not the episode's base tree"):
        await grade(grader, env)


# -- failures ------------------------------------------------------------------------------


@pytest.mark.parametrize("grade_in", ["episode", "fresh"])
async def test_a_reward_exception_in_a_healthy_sandbox_scores_zero_and_is_recorded(env, grade_in):
    # The tested code's output can make a reward fail: the policy must not be able to
    # have its episode masked that way.
    grader = await prepare_grader(env, "explodes", {}, grade_in=grade_in, fresh_env=fresh_env)
    result = await grade(grader, env)
    assert result.score == 0.0
    assert result.info["score_reason"] == "reward_failed"
    assert "ValueError: a bug in the reward" in result.info["error"]


async def test_reward_infra_errors_pass_through(env):
    grader = await prepare_grader(env, "infra", {})
    with pytest.raises(RewardInfraError, match="malformed"):
        await grade(grader, env)


async def test_grading_that_hangs_scores_zero_at_the_grading_timeout_and_is_trained_on(env):
    # Long enough for the checks before the reward on a loaded machine (2 s was not), so
    # the time-out falls in the reward that hangs.
    grader = await prepare_grader(env, "hangs", {}, integrity={"grading_timeout": 30})
    result = await asyncio.wait_for(grade(grader, env), 300)  # no hang: bounded
    assert result.score == 0.0
    assert result.info["score_reason"] == "grading_timed_out"
    assert "while the reward" in result.info["detail"]


# -- what the grader reads -----------------------------------------------------------------


async def test_sandbox_files_are_read_bounded_regular_and_timed(env):
    sandbox = await GradingSandbox.open(env, {"PATH": "/usr/bin:/bin"}, workdir=env.workdir)
    try:
        s = sandbox.scratch
        await act(
            env,
            f"mkfifo {s}/fifo && ln -s /etc/hostname {s}/link && "
            f"head -c 5000 /dev/zero > {s}/big && printf ok > {s}/small",
        )
        assert await sandbox.read_bytes(f"{s}/small") == b"ok"
        for name, problem in (
            ("fifo", "not a regular file"),
            ("link", "not a regular file"),
            ("missing", "not a regular file"),
            ("big", "larger than 4096"),
        ):
            with pytest.raises(GradingReadError, match=problem):
                # A FIFO read on the host side would block forever: bounded here.
                await asyncio.wait_for(sandbox.read_bytes(f"{s}/{name}", max_bytes=4096), 60)
    finally:
        await sandbox.close()


async def test_a_lazy_grading_sandbox_runs_nothing_until_its_first_command(env, monkeypatch):
    calls: list[Any] = []

    def counting(real: Any) -> Any:
        async def counted(*args: Any, **kwargs: Any) -> Any:
            calls.append(args)
            return await real(*args, **kwargs)

        return counted

    # (one-off commands: through the wrapper, or without isolation run bounded from here)
    monkeypatch.setattr(env, "execute", counting(env.execute))
    monkeypatch.setattr(env, "run_bounded", counting(env.run_bounded))
    sandbox = await GradingSandbox.open(
        env, {"PATH": "/usr/bin:/bin"}, workdir=env.workdir, lazy=True
    )
    try:
        assert calls == []
        s = sandbox.scratch
        first = await sandbox.run(
            f"stat -c %a {s} {s}/home {s}/tmp; echo $HOME $TMPDIR", timeout=60
        )
        assert first.output.split() == ["700", "700", "700", f"{s}/home", f"{s}/tmp"]
        assert len(calls) == 1, "the scratch dir is made by the first command itself"
        # Staged files are decoded by the next command: byte for byte, no command of their own;
        # small ones go with its arguments, a large one as a file of base64 beside it.
        data = bytes(range(256)) * 3 + b"\0\xff not UTF-8 \xc3"
        large = bytes(range(256)) * 1024
        await sandbox.stage_bytes(f"{s}/a", data)
        await sandbox.stage_bytes(f"{s}/b", b"")
        await sandbox.stage_bytes(f"{s}/c", large)
        seen = await sandbox.run(
            f"od -An -v -tx1 {s}/a | tr -d ' \\n'; echo; ls {s}; sha256sum < {s}/c", timeout=60
        )
        lines = seen.output.splitlines()
        assert lines[0] == data.hex()
        assert lines[1:6] == ["a", "b", "c", "home", "tmp"]
        assert lines[6].split()[0] == hashlib.sha256(large).hexdigest()
        assert len(calls) == 2
        # A file that cannot be written where it is to go fails the command that decodes it.
        await sandbox.stage_bytes(f"{s}/no-such-dir/x", b"x")
        with pytest.raises(EnvError, match=f"could not write {s}/no-such-dir/x in the sandbox"):
            await sandbox.run("echo never", timeout=60)
        assert (await sandbox.run("echo next", timeout=60)).output == "next\n"
    finally:
        await sandbox.close()
    assert (await env.execute(["test", "-e", s], env=None, timeout=60)).exit_code == 1


async def test_a_sandbox_without_timeout_runs_grading_commands_without_one(env, tmp_path):
    tools = tmp_path / "bin"
    tools.mkdir()
    for name in ("bash", "mkfifo", "head", "wc", "rm", "mkdir", "base64", "cat"):
        (tools / name).symlink_to(shutil.which(name))
    sandbox = await GradingSandbox.open(env, {"PATH": str(tools)}, workdir=env.workdir)
    try:
        done = await sandbox.run("echo hi; kill -KILL $$", timeout=60)
        # Killed by itself, not by a time limit there was none to enforce: not timed out.
        assert (done.output, done.exit_code, done.timed_out) == ("hi\n", 137, False)
        assert (
            await sandbox.run("cat /etc/hostname >/dev/null && echo ok", timeout=60)
        ).output == "ok\n"
    finally:
        await sandbox.close()
    with_timeout = await GradingSandbox.open(env, {"PATH": "/usr/bin:/bin"}, workdir=env.workdir)
    try:
        done = await with_timeout.run("sleep 30", timeout=1)
        assert (done.exit_code, done.timed_out) == (137, True)
    finally:
        await with_timeout.close()


@pytest.mark.parametrize("isolation", ["none", "bwrap"])
async def test_a_host_sandbox_knows_its_start_environment_without_a_command(isolation):
    env = open_env({"type": "host", "isolation": isolation}, {})
    await env.start()
    try:
        ran = await env.execute(["env", "-0"], env=None, timeout=60)
        reported = dict(item.split("=", 1) for item in ran.stdout.split("\0") if "=" in item)
        known = await env.start_environment()
        assert known["PATH"] == reported["PATH"] and known["HOME"] == reported["HOME"]
        # What grading makes of it is the same (the shell between adds only PWD and the like).
        assert grading_environment(known, extra={}) == grading_environment(reported, extra={})
    finally:
        await env.close()


async def test_grading_output_is_cut_at_its_limit_and_says_so(env):
    sandbox = await GradingSandbox.open(env, {"PATH": "/usr/bin:/bin"}, workdir=env.workdir)
    try:
        done = await sandbox.run("yes | head -c 3000000; exit 7", timeout=60, max_bytes=1000)
        assert (len(done.output), done.truncated, done.exit_code) == (1000, True, 7)
        whole = await sandbox.run("printf abc", timeout=60, max_bytes=3)
        assert (whole.output, whole.truncated) == ("abc", False)
    finally:
        await sandbox.close()


async def test_a_process_left_holding_the_output_cannot_hang_a_command(env):
    sandbox = await GradingSandbox.open(env, {"PATH": "/usr/bin:/bin"}, workdir=env.workdir)
    try:
        # Same process group: killed when the command ends; its own session: the limit.
        left = await sandbox.run("sleep 600 & echo started", timeout=60)
        assert (left.output, left.timed_out) == ("started\n", False)
        # In a session of its own, a child holds the command's output open. The command waits
        # until the child has opened it (its marker file), so the shell cannot exit first.
        escaped = sandbox.run(
            "setsid sh -c ': > held.$PPID; exec sleep 600' > /proc/$$/fd/1 & "
            "until [ -e held.$$ ]; do :; done; echo started",
            timeout=1,
        )
        held = await asyncio.wait_for(escaped, 120)
        assert held.timed_out and held.exit_code is None
        assert held.output.startswith("[killed: the output was held open"), held.output
        # Past its own limit (not the command's timeout): the reading stops once it ended.
        late = sandbox.run(
            "setsid sh -c ': > late.$PPID; exec sleep 600' > /proc/$$/fd/1 & "
            "until [ -e late.$$ ]; do :; done; echo started",
            timeout=600,
        )
        assert (await asyncio.wait_for(late, 120)).output.startswith("[killed: the output was")
        assert (await sandbox.run("ls held.*", timeout=30)).output.startswith("held.")
    finally:
        await sandbox.close()


async def test_a_command_runs_when_its_private_tmpdir_was_removed(env):
    """The output's FIFO goes to the grading TMPDIR, or /tmp where the tested code removed
    it; no FIFO is left behind either way."""
    sandbox = await GradingSandbox.open(env, {"PATH": "/usr/bin:/bin"}, workdir=env.workdir)
    try:
        done = await sandbox.run('echo ok; ls -A "$TMPDIR"', timeout=60)
        assert (done.output, done.exit_code) == ("ok\n", 0)
        await act(env, f"rm -rf {sandbox.scratch}/tmp")
        done = await sandbox.run("echo ok; exit 3", timeout=60)
        assert (done.output, done.exit_code, done.timed_out) == ("ok\n", 3, False)
    finally:
        await sandbox.close()


async def _exists(env: AgentEnv, path: str) -> bool:
    try:
        await env.read_file(path)
    except IsADirectoryError:
        return True
    except FileNotFoundError:
        return False
    return True


# -- rules and patches ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "protected"),
    [
        ("conftest.py", True),
        ("deep/dir/conftest.py", True),
        ("pytest.ini", True),
        ("sitecustomize.py", True),
        ("lib/x.pth", True),
        ("pytest/__init__.py", True),
        ("src/pytest/__init__.py", False),  # only the root shadows the installed runner
        ("unittest/__main__.py", True),
        ("calc.py", False),
        ("pyproject.toml", False),  # only its test section
    ],
)
def test_default_rules(path, protected):
    assert RuleSet(PYTHON_HARNESS, []).protects(path) is protected


def test_runner_sections_of_shared_files():
    base = "[project]\nname='x'\n\n[tool.pytest.ini_options]\naddopts='-q'\n"
    assert runner_section("pyproject.toml", base) == {"ini_options": {"addopts": "-q"}}
    edited = base.replace("name='x'", "name='y'")
    assert runner_section("pyproject.toml", edited) == runner_section("pyproject.toml", base)
    assert runner_section("setup.cfg", "[tool:pytest]\naddopts = -p x\n") == {
        "tool:pytest": {"addopts": "-p x"}
    }
    assert runner_section("pyproject.toml", "not = [toml") != runner_section("pyproject.toml", base)


def test_literal_patterns_escape_glob_characters():
    rules = RuleSet(
        [PYTHON_HARNESS[0].model_copy(update={"patterns": (literal_pattern("a[1]*.py"),)})], []
    )
    assert rules.protects("a[1]*.py") and not rules.protects("a1x.py")


def test_patches_split_per_file_with_quoted_paths():
    patch = (
        b"diff --git a/plain.py b/plain.py\n--- a/plain.py\n+++ b/plain.py\n@@ -1 +1 @@\n-a\n+b\n"
        b'diff --git "a/tab\\there.py" "b/tab\\there.py"\nnew file mode 100644\n'
        b'--- /dev/null\n+++ "b/tab\\there.py"\n@@ -0,0 +1 @@\n+x\n'
        b"diff --git a/with space.py b/with space.py\n"
    )
    parts = split_patch(patch)
    assert [p.path for p in parts] == ["plain.py", "tab\there.py", "with space.py"]
    assert parts[0].added_lines() == ["b"] and parts[1].added_lines() == ["x"]


def test_workspace_defaults_to_the_work_dir():
    assert Workspace() == Workspace(repo=None, base_commit=None, protect_paths=())
