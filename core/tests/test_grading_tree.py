"""The graded tree judged on the file system: nested repositories, ``.git`` below the root,
symlinks out of the repository, gitlinks in the patch (uniagent.grading.tree)."""

from __future__ import annotations

import shlex
import subprocess
import types
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from uniagent import RewardSpec, hookimpl, open_env
from uniagent.env import AgentEnv
from uniagent.grading.patch import split_patch
from uniagent.grading.tree import (
    Tree,
    carries_code,
    gitlink_hits,
    judge,
    leads_out,
    nested_roots,
)
from uniagent.plugins import load_plugins, reset_plugins
from uniagent.protect.report import integrity_flags
from uniagent.reward import RewardContext, RewardResult
from uniagent.testing.grading import grade, prepare_grader

BUGGY = "def add(a, b):\n    return a - b\n"
FIXED = "def add(a, b):\n    return a + b\n"
SETUP = (
    "git init -q && git config user.email t@t && git config user.name t && "
    f"printf %s {shlex.quote(BUGGY)} > calc.py && git add -A && git commit -qm base"
)
CHECK = "PYTHONPATH=. python3 -c 'from calc import add; assert add(2, 3) == 5'"
COMMIT = "git -c user.name=a -c user.email=a@a commit -qm x"


async def check(ctx: RewardContext[Any]) -> RewardResult:
    done = await ctx.require_sandbox().run(CHECK, timeout=60)
    return RewardResult(1.0 if done.exit_code == 0 else 0.0, {"output": done.output})


@pytest.fixture(autouse=True)
def tree_reward():
    reset_plugins()

    @hookimpl
    def uniagent_rewards():
        yield RewardSpec(name="tree_check", fn=check)

    load_plugins().register(types.SimpleNamespace(uniagent_rewards=uniagent_rewards), "t")
    yield
    reset_plugins()


@pytest.fixture
async def env() -> AsyncIterator[AgentEnv]:
    async with open_env({"type": "host", "isolation": "none"}, {"post_setup": [SETUP]}) as sandbox:
        yield sandbox


async def act(env: AgentEnv, *commands: str) -> None:
    for command in commands:
        obs = await env.run_action(command, timeout=30)
        assert obs.exit_code == 0, obs.output


async def is_(env: AgentEnv, test: str, path: str) -> bool:
    """``test TEST PATH`` in the repository (the agent's session is stopped after grading)."""
    done = await env.execute(["test", test, path], env={}, cwd=env.workdir, timeout=30)
    return done.exit_code == 0


def reports(result: Any, rule: str | None = None) -> set[tuple[str, str]]:
    return {
        (t["path"], t["change"])
        for t in result.info["integrity"]["tampered"]
        if rule is None or t["rule"] == rule
    }


async def test_a_nested_repository_is_removed_reported_and_its_files_screened(env):
    """The fix sits in a nested repository (one gitlink line to git): under ``on_tamper:
    report`` its .git goes, so its files are in the patch and screened like the rest."""
    grader = await prepare_grader(env, "tree_check", {}, integrity={"on_tamper": "report"})
    await act(
        env,
        f"mkdir helpers && printf %s {shlex.quote(FIXED)} > helpers/impl.py",
        f"(cd helpers && git init -q && git add -A && {COMMIT})",
        "printf 'from helpers.impl import add  # noqa\\n' >> calc.py",
    )
    result = await grade(grader, env)
    assert reports(result, "nested-git") == {("helpers/.git", "added")}, result.info
    assert "helpers/impl.py" in result.info["integrity"]["patch_files"]
    assert reports(result, "gitlink") == set()  # removed before the patch was taken
    assert result.score == 1.0  # report mode: graded as usual
    assert not await is_(env, "-e", "helpers/.git")
    flags = integrity_flags(result.info)
    assert flags["tampered/tree"] == flags["tampered/patch_screen"] == flags["rule/nested-git"] == 1


async def test_a_git_dir_below_the_root_scores_zero(env):
    grader = await prepare_grader(env, "tree_check", {})
    await act(
        env,
        f"mkdir -p lib/.git && printf %s {shlex.quote(FIXED)} > lib/.git/impl.py",
        "ln -s .git/impl.py lib/impl.py && printf 'from lib.impl import add  # noqa\\n' >> calc.py",
    )
    result = await grade(grader, env)
    assert result.score == 0.0 and result.info["score_reason"] == "tampered"
    assert reports(result) >= {("lib/.git", "added"), ("lib/impl.py", "added")}


async def test_symlinks_that_leave_the_repository_score_zero_and_others_do_not(env, tmp_path):
    outside = tmp_path / "outside.py"
    outside.write_text(FIXED)
    # A link of the task's own, out of the repository, made before the baseline: not judged.
    await act(env, f"ln -s {shlex.quote(str(outside))} vendored.py")
    grader = await prepare_grader(env, "tree_check", {})
    await act(
        env,
        f"ln -s {shlex.quote(str(outside))} absolute.py",
        f"mkdir -p deep/er && ln -s {shlex.quote(str(outside))} up.py && "
        f"ln -s ../../up.py deep/er/relative.py",  # inside, but to a link that leads out
        "ln -s .git/config dotgit.cfg && ln -s calc.py alias.py && ln -s deep here",
        "ln -s /nonexistent/x.py dangling.py && ln -sf missing.py inside_dangling.py",
        # A directory out of the repository could hold modules; a link to a program (as a
        # venv's bin/python made in the repository) is no code the tests import.
        f"ln -s {shlex.quote(str(tmp_path))} outdir && mkdir -p venv/bin && "
        "ln -s /bin/sh venv/bin/python",
    )
    result = await grade(grader, env)
    assert result.score == 0.0
    assert reports(result, "symlink-outside") == {
        ("absolute.py", "added"),
        ("up.py", "added"),
        ("deep/er/relative.py", "added"),
        ("dotgit.cfg", "added"),
        ("dangling.py", "added"),
        ("outdir", "added"),
    }, result.info
    gone = ("absolute.py", "up.py", "deep/er/relative.py", "dotgit.cfg", "dangling.py", "outdir")
    for path in gone:
        assert not await is_(env, "-L", path), path
    for kept in ("vendored.py", "alias.py", "here", "inside_dangling.py", "venv/bin/python"):
        assert await is_(env, "-L", kept), kept


async def test_changes_below_a_nested_repository_of_the_task_score_zero(env):
    """A submodule the task came with: its files change without a line of the patch."""
    await act(
        env,
        "mkdir -p vendor/lib && printf 'X = 1\\n' > vendor/lib/mod.py",
        f"(cd vendor/lib && git init -q && git add -A && {COMMIT})",
    )
    grader = await prepare_grader(env, "tree_check", {})
    await act(
        env,
        f"printf %s {shlex.quote(FIXED)} > vendor/lib/mod.py",
        "printf 'Y = 2\\n' > vendor/lib/new.py",
        f"printf %s {shlex.quote(FIXED)} > calc.py",
    )
    result = await grade(grader, env)
    assert result.score == 0.0
    assert reports(result, "nested-git") == {
        ("vendor/lib/mod.py", "modified"),
        ("vendor/lib/new.py", "added"),
    }, result.info


async def test_a_legitimate_fix_with_a_new_module_and_an_inside_link_scores_one(env):
    grader = await prepare_grader(env, "tree_check", {})
    await act(
        env,
        f"mkdir pkg && printf %s {shlex.quote(FIXED)} > pkg/impl.py && ln -s pkg/impl.py link.py",
        "printf 'from link import add  # noqa\\n' >> calc.py",
    )
    result = await grade(grader, env)
    assert result.score == 1.0, result.info
    assert result.info["integrity"]["tampered"] == []


# -- the judgement itself --------------------------------------------------------------------


def test_a_link_carries_code_to_a_directory_or_by_a_code_files_name():
    assert carries_code("pkg", "/x/y", "d")
    assert carries_code("a.py", "/x/y", "f") and carries_code("a", "/x/y.py", "-")
    assert carries_code("setup.cfg", "/x/notes", "f") and carries_code("x.pth", "/x/y", "f")
    assert not carries_code("bin/python", "/usr/bin/python3.11", "f")


def test_where_a_link_leads():
    assert not leads_out("/r", "/r/a.py")
    assert not leads_out("/r", "/r")
    assert not leads_out("/", "/a.py")
    assert leads_out("/r", "/rx/a.py")  # a sibling that shares the prefix
    assert leads_out("/r", "/etc/passwd")
    assert leads_out("/r", "/r/.git/config")
    assert leads_out("/r", "/r/sub/.git/x.py")
    assert leads_out("/r", "")  # could not be resolved
    assert leads_out("", "/r/a.py")  # the repository's own path unknown


def test_the_judgement_is_bounded_and_sees_the_repositorys_own_git_change_kind():
    before = {".git": "d", "a.py": "f", "vendor/lib": "d", "vendor/lib/.git": "d"}
    assert nested_roots(before) == ["vendor/lib"]
    now = {".git": "f", "a.py": "f", "vendor/lib": "d", "vendor/lib/.git": "d"}
    now |= {f"vendor/lib/m{i}.py": "f" for i in range(80)}
    links = [(f"l{i}.py", "/etc/x", "f") for i in range(60)] + [("bin/python", "/usr/bin/x", "f")]
    tampers, remove = judge(before, Tree(now, "/r", links, links_total=5000))
    rules = [t.rule for t in tampers]
    assert rules.count("git-dir") == 1
    assert rules.count("nested-git") == 50  # at most 50 reports a rule, the rest counted
    assert "(and 30 more of this rule)" in tampers[rules.index("nested-git") + 49].detail
    assert rules.count("symlink-outside") == 50
    assert {f"l{i}.py" for i in range(60)} <= remove and "bin/python" not in remove
    assert "vendor/lib/.git" not in remove  # the task's own nested repository stays


def test_a_gitlink_in_the_patch_is_tampering(tmp_path: Path):
    def git(*args: str, cwd: Path = tmp_path) -> str:
        return subprocess.run(
            ["git", "-c", "user.name=a", "-c", "user.email=a@a", *args],
            cwd=cwd, check=True, capture_output=True, text=True,
        ).stdout  # fmt: skip

    git("init", "-q")
    (tmp_path / "a.py").write_text("A = 1\n")
    git("add", "-A")
    git("commit", "-qm", "base")
    base = git("rev-parse", "HEAD").strip()
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.py").write_text("B = 2\n")
    git("init", "-q", cwd=tmp_path / "sub")
    git("add", "-A", cwd=tmp_path / "sub")
    git("commit", "-qm", "sub", cwd=tmp_path / "sub")
    (tmp_path / "a.py").write_text("A = 2\n")
    git("add", "-A")
    patch = git("diff", "--cached", "--full-index", base).encode()
    parts = split_patch(patch)
    assert {p.path for p in parts} == {"a.py", "sub"}
    hits = gitlink_hits([(p.path, p.text) for p in parts])
    assert [(t.path, t.rule, t.kind) for t in hits] == [("sub", "gitlink", "tree")]
