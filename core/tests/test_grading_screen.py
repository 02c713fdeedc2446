"""The patch screen: the runner's own parsers, symlinked configs, package metadata, attributes,
binary sources, ignored files, code under .git and replace refs, in real host sandboxes."""

from __future__ import annotations

import itertools
import re
import shlex
import types
from collections.abc import AsyncIterator
from typing import Any

import pathspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from uniagent import RewardSpec, hookimpl, open_env
from uniagent.env import AgentEnv
from uniagent.grading.integrity import ADDED_CONFIG_MAX
from uniagent.grading.sandbox import GradingSandbox
from uniagent.plugins import load_plugins, reset_plugins
from uniagent.protect.rules import PYTHON_CONTENT, PathRules, RuleSet, runner_section
from uniagent.protect.settings import IntegrityDefaults, IntegritySettings, Workspace
from uniagent.reward import RewardContext, RewardResult
from uniagent.testing.grading import grade, prepare_grader

BUGGY = "def add(a, b):\n    return a - b\n"
FIXED = "def add(a, b):\n    return a + b\n"
TESTS = "from calc import add\nassert add(2, 3) == 5, 'add is broken'\nprint('ok')\n"
SETUP_CFG = "[metadata]\nname = calc\n\n[tool:pytest]\nminversion = 6\n"
SETUP = (
    "git init -q && git config user.email t@t && git config user.name t && "
    f"printf %s {shlex.quote(BUGGY)} > calc.py && mkdir tests && "
    f"printf %s {shlex.quote(TESTS)} > tests/check.py && "
    f"printf %s {shlex.quote(SETUP_CFG)} > setup.cfg && printf 'build/\\n' > .gitignore && "
    "mkdir build && printf 'x = 1\\n' > build/gen.py && git add -A && git commit -qm base"
)
SEEN: list[RewardContext[Any]] = []


async def command(ctx: RewardContext[Any]) -> RewardResult:
    SEEN.append(ctx)
    done = await ctx.require_sandbox().run(
        "PYTHONPATH=. python3 tests/check.py; env; cat setup.cfg", timeout=60
    )
    return RewardResult(1.0 if "ok\n" in done.output else 0.0, {"output": done.output})


@pytest.fixture(autouse=True)
def rewards():
    reset_plugins()

    @hookimpl
    def uniagent_rewards():
        yield RewardSpec(name="check", fn=command, integrity=IntegrityDefaults())

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
    for command_ in commands:
        obs = await env.run_action(command_, timeout=30)
        assert obs.exit_code == 0, obs.output


def tampered(result: Any) -> set[tuple[str, str, str]]:
    return {(t["path"], t["change"], t["rule"]) for t in result.info["integrity"]["tampered"]}


# -- runner configuration, read as the runner reads it ---------------------------------------


@pytest.mark.parametrize("hidden", ["\r", "\x0b", "\x0c", "\x1c", "\u2028"])
def test_a_runner_option_hidden_behind_a_line_break_pytest_sees_is_a_change(hidden):
    base = "[tool:pytest]\nminversion = 6\n"
    edited = base + f"# just a note{hidden}addopts = -p evil\n"
    assert runner_section("setup.cfg", edited) != runner_section("setup.cfg", base)
    assert runner_section("setup.cfg", edited)["tool:pytest"]["addopts"] == "-p evil"


def test_edits_outside_the_runner_section_are_not_a_change():
    base = "[metadata]\nname = calc\n\n[tool:pytest]\nminversion = 6\n"
    assert runner_section("setup.cfg", base.replace("calc", "calc2")) == runner_section(
        "setup.cfg", base
    )


async def test_a_hidden_runner_option_in_setup_cfg_is_tampering_and_restored(env):
    grader = await prepare_grader(env, "check", {})
    await act(
        env,
        "printf '# note\\raddopts = -p evil\\n' >> setup.cfg",
        f"printf %s {shlex.quote(FIXED)} > calc.py",
    )
    result = await grade(grader, env)
    assert result.score == 0.0
    assert ("setup.cfg", "modified", "runner-config-sections") in tampered(result)
    assert await env.read_file("setup.cfg") == SETUP_CFG


@pytest.mark.parametrize("grade_in", ["episode", "fresh"])
async def test_a_shared_config_file_made_a_symlink_is_tampering(env, grade_in):
    grader = await prepare_grader(env, "check", {}, grade_in=grade_in, fresh_env=fresh_env)
    await act(
        env,
        "sed 's/calc/calc/' setup.cfg > other.cfg && ln -sf other.cfg setup.cfg",
        f"printf %s {shlex.quote(FIXED)} > calc.py",
    )
    result = await grade(grader, env)
    assert result.score == 0.0
    assert ("setup.cfg", "modified", "runner-config-sections") in tampered(result)


async def test_a_new_config_file_is_tampering_only_with_a_runner_section(env):
    """A shared config file the agent adds is read (its bytes decide): one with only
    package metadata stays, one that configures the runner is tampering and removed."""
    grader = await prepare_grader(env, "check", {}, integrity={"on_tamper": "report"})
    await act(
        env,
        "mkdir -p a b && printf '[metadata]\\nname = a\\n' > a/setup.cfg",
        "printf '[tool.pytest.ini_options]\\naddopts = \"-p evil\"\\n' > b/pyproject.toml",
        f"printf %s {shlex.quote(FIXED)} > calc.py",
    )
    result = await grade(grader, env)
    assert tampered(result) == {("b/pyproject.toml", "added", "runner-config-sections")}
    for path, kept in (("a/setup.cfg", True), ("b/pyproject.toml", False)):
        there = await env.execute(["test", "-e", path], env=None, cwd=env.workdir, timeout=30)
        assert (there.exit_code == 0) == kept, path


async def test_a_new_symlinked_config_file_is_tampering(env):
    grader = await prepare_grader(env, "check", {})
    await act(env, "printf '[metadata]\\n' > a.cfg && mkdir -p sub && ln -s ../a.cfg sub/setup.cfg")
    result = await grade(grader, env)
    assert ("sub/setup.cfg", "added", "runner-config-sections") in tampered(result)


# -- package metadata, attributes, binary sources -----------------------------------------------


@pytest.mark.parametrize(
    ("path", "rule"),
    [
        ("evil-1.0.dist-info/entry_points.txt", "package-metadata"),
        ("src/evil.egg-info/entry_points.txt", "package-metadata"),
        ("evil.egg-link", "package-metadata"),
        ("__editable___evil_finder.py", "package-metadata"),
        (".gitattributes", "git-attributes"),
        ("sub/.gitattributes", "git-attributes"),
    ],
)
async def test_plugin_metadata_and_attributes_in_the_patch_are_tampering(env, path, rule):
    grader = await prepare_grader(env, "check", {})
    await act(
        env,
        f"mkdir -p $(dirname {path}) && printf '[pytest11]\\nx = y\\n' > {path}",
        f"printf %s {shlex.quote(FIXED)} > calc.py",
    )
    result = await grade(grader, env)
    assert result.score == 0.0
    assert (path, "added", rule) in tampered(result)


async def test_a_binary_change_to_a_source_file_is_tampering_and_its_text_is_screened(env):
    grader = await prepare_grader(env, "check", {}, integrity={"on_tamper": "report"})
    await act(
        env,
        "printf 'import os\\n# \\000\\nos._exit(0)\\n' > calc.py",
        "printf 'data \\000 atexit.register(f)\\n' > blob.bin",
    )
    result = await grade(grader, env)
    found = tampered(result)
    assert ("calc.py", "binary", "binary-source") in found
    assert ("calc.py", "hit", "exit-hijack") in found, "read through the --text diff"
    assert ("blob.bin", "hit", "exit-hijack") in found
    assert not any(path == "blob.bin" and rule == "binary-source" for path, _, rule in found)


def test_content_rules_catch_import_hooks_and_entry_points():
    rules = RuleSet([], PYTHON_CONTENT)
    for line, rule in (
        ("sys.path.insert(0, '.git/x')", "import-path"),
        ("sys.path += ['/tmp/x']", "import-path"),
        ("site.addsitedir(d)", "import-path"),
        ("sys.path_hooks.append(f)", "runner-modules"),
        ("class F(importlib.abc.MetaPathFinder):", "runner-modules"),
        ("entry_points={'pytest11': ['x = y']}", "entry-points"),
    ):
        assert [h["rule"] for h in rules.content_hits("x.py", [line])] == [rule], line
    assert rules.content_hits("x.py", ["if sys.path == other:", "paths = sys.path[:]"]) == []


#: The two content rules as they were before they were made linear (the reference here).
OLD_FAKE_RESULTS = r"['\"][^'\"]*\b(PASSED|XPASS|FAILED|ERROR)\b[^'\"]*::"
OLD_IMPORT_PATH = (
    r"\bsys\.path\s*(\.\s*(insert|append|extend)\b|\[[^\]]*\]\s*=|\+?=[^=])"
    r"|\bsite\.addsitedir\b|\bzipimport\b"
)


def rule_named(name: str) -> re.Pattern[str]:
    return re.compile(next(r.pattern for r in PYTHON_CONTENT if r.name == name))


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(["'", '"', "PASSED", "XPASS", " ", "x", "::", ":", "_"])))
def test_the_fake_results_rule_finds_what_it_found_before(tokens: list[str]) -> None:
    line = "".join(tokens)
    assert bool(rule_named("fake-results").search(line)) == bool(re.search(OLD_FAKE_RESULTS, line))


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(["sys.path", "[", "]", " ", "=", "==", "0", ":", "x"])))
def test_the_import_path_rule_finds_what_it_found_before(tokens: list[str]) -> None:
    line = "".join(tokens)
    new, old = rule_named("import-path").search(line), re.search(OLD_IMPORT_PATH, line)
    assert old or not new, line  # nothing new is found
    # Missed now: only an index with a bracket before its first "]" (``sys.path["["] = p``);
    # the rule is a heuristic that ``getattr(sys, "path")`` passes anyway.
    if old and not new:
        assert old.group().count("[") > 1, line


def test_long_added_lines_are_screened_in_linear_time() -> None:
    # Lines the agent writes to be slow to screen: 300k characters each. With the old
    # rules the first two took minutes (every word of a literal tried against its rest;
    # every ``sys.path[`` scanned to the end of the line); a hang here is the failure.
    rules = RuleSet([], PYTHON_CONTENT)
    n = 300_000
    lines = {
        "'" + "PASSED " * (n // 7): [],
        "sys.path[" * (n // 9): [],
        "'" + "Ran 1 tests " * (n // 12): ["fake-results"],
        "'" + "ERROR x" * (n // 7) + "::": ["fake-results"],
        "sys.path[" * (n // 9) + "0] = p": ["import-path"],
        "'" * n + "\\b" * n: [],
    }
    for line, rules_hit in lines.items():
        assert [h["rule"] for h in rules.content_hits("x.py", [line])] == rules_hit, line[:40]


# -- what the patch does not show -----------------------------------------------------------------


@pytest.mark.parametrize("grade_in", ["episode", "fresh"])
async def test_new_ignored_files_are_in_the_patch_and_screened(env, grade_in):
    grader = await prepare_grader(
        env, "check", {}, grade_in=grade_in, fresh_env=fresh_env, integrity={"on_tamper": "report"}
    )
    await act(
        env,
        "printf 'import atexit\\n' > build/hook.py",
        f"printf %s {shlex.quote(FIXED)} > calc.py && printf 'import os\\n' >> build/gen.py",
    )
    result = await grade(grader, env)
    integrity = result.info["integrity"]
    assert "build/hook.py" in integrity["patch_files"]
    assert integrity["ignored_files"] == {"new": ["build/hook.py"], "changed": ["build/gen.py"]}
    assert result.score == 1.0, "reported only (on_tamper: report): the fix still counts"


async def test_changed_ignored_sources_are_screened_whole(env):
    grader = await prepare_grader(env, "check", {})
    await act(env, "printf 'import os\\nos._exit(0)\\n' >> build/gen.py")
    result = await grade(grader, env)
    assert ("build/gen.py", "hit", "exit-hijack") in tampered(result)


@pytest.fixture
def read_sizes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The length of every grading command's output from now on."""
    sizes: list[int] = []
    real = GradingSandbox.run

    async def run(self: GradingSandbox, command: str, **kwargs: Any) -> Any:
        done = await real(self, command, **kwargs)
        sizes.append(len(done.output))
        return done

    monkeypatch.setattr(GradingSandbox, "run", run)
    return sizes


#: Bytes the agent adds to a file below: far more than the files the grader reads took.
GROWN = 20_000_000


@pytest.mark.parametrize("form", ["gnu", "oldgnu", "posix"])
def test_a_tar_of_unchanged_files_is_never_longer_than_its_bound(tmp_path, form):
    """What the grader allows a pack of the snapshot's files at grading: never less than a
    tar of them as they were takes, in any format a sandbox's tar may default to (a
    bound too tight would call unchanged files grown)."""
    import subprocess

    from uniagent.grading.integrity import _unpack, tar_bound

    names = ["a", "é" * 60, "d/" + "n" * 150 + ".py", "e" * 99, "f" * 100, "g" * 255]
    for number, name in enumerate(names):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"x" * (number * 700 + 511 * (number % 2)))
    (tmp_path / "link").symlink_to("l" * 200)
    names.append("link")
    (tmp_path / "many").mkdir()
    for number in range(300):  # (small files: a header or two each, most of what tar writes)
        (tmp_path / "many" / f"{number}").write_bytes(b"y")
        names.append(f"many/{number}")
    listed = tmp_path / "names.txt"
    listed.write_bytes(b"".join(n.encode() + b"\0" for n in names))
    done = subprocess.run(
        ["tar", f"--format={form}", "--null", "--no-recursion", "-T", str(listed), "-cf", "-"],
        cwd=tmp_path, capture_output=True, check=True,
    )  # fmt: skip
    members = _unpack(done.stdout)
    assert sorted(members) == sorted(names) and not members.cut
    assert len(done.stdout) <= tar_bound(members)
    assert not _unpack(done.stdout, tar_bound(members)).cut


async def test_a_protected_file_grown_huge_is_read_bounded_changed_and_put_back(env, read_sizes):
    """The grader reads the protected files at grading only up to what they took at the
    baseline (the runner's memory is not the agent's to fill): one grown past that is
    changed, whatever its bytes, and put back."""
    grader = await prepare_grader(env, "check", {}, integrity={"protect_paths": ["tests/"]})
    await act(
        env,
        f"head -c {GROWN} /dev/zero | tr '\\0' '#' >> tests/check.py",
        f"printf %s {shlex.quote(FIXED)} > calc.py",
    )
    read_sizes.clear()
    result = await grade(grader, env)
    assert result.score == 0.0
    assert {(p, c) for p, c, _ in tampered(result)} == {("tests/check.py", "modified")}
    assert await env.read_file("tests/check.py") == TESTS
    # (the bound: the snapshot's bytes, and room for setup.cfg, a shared config file, to grow)
    assert read_sizes and max(read_sizes) < 2 * ADDED_CONFIG_MAX, read_sizes


async def test_a_shared_config_file_grown_outside_its_runner_section_is_still_read(env):
    """The bound on what is read at grading leaves a shared config file room to grow: the
    agent may edit it but for its runner section, and it is read whole to compare that."""
    grader = await prepare_grader(env, "check", {})
    await act(
        env,
        "{ printf '\\n[notes]\\n'; for i in $(seq 30000); do echo \"x$i = $i\"; done; }"
        " >> setup.cfg",
        f"printf %s {shlex.quote(FIXED)} > calc.py",
    )
    result = await grade(grader, env)
    assert tampered(result) == set()
    assert result.score == 1.0


async def test_protected_files_grown_and_changed_are_each_reported_as_they_are(env):
    """Where the pack is cut, the files after the cut are read again: each file the agent
    grew is named, one it changed within its size is compared, the others are unchanged."""
    grow = f"head -c {GROWN} /dev/zero | tr '\\0' '#'"
    await act(env, "printf 'a\\n' > tests/a.py && printf 'b\\n' > tests/b.py")
    grader = await prepare_grader(
        env, "check", {}, integrity={"protect_paths": ["tests/", "calc.py"]}
    )
    await act(
        env,
        f"{grow} >> tests/a.py",
        "printf 'c\\n' > tests/b.py",
        f"{grow} >> calc.py",
    )
    result = await grade(grader, env)
    assert {(p, c) for p, c, _ in tampered(result)} == {
        ("tests/a.py", "modified"),
        ("tests/b.py", "modified"),
        ("calc.py", "modified"),
    }
    assert await env.read_file("tests/b.py") == "b\n"


async def test_a_new_config_file_too_large_to_read_is_judged_a_runner_config(env, read_sizes):
    """A shared config file added since the baseline is read up to ADDED_CONFIG_MAX: one
    larger is judged as one with a test-runner section (removed, tampering), unread."""
    grader = await prepare_grader(env, "check", {}, integrity={"on_tamper": "report"})
    await act(
        env,
        f"mkdir -p a && {{ printf '[metadata]\\nname = a\\n'; head -c {GROWN} /dev/zero "
        "| tr '\\0' '\\n'; } > a/setup.cfg",
        f"printf %s {shlex.quote(FIXED)} > calc.py",
    )
    read_sizes.clear()
    result = await grade(grader, env)
    assert tampered(result) == {("a/setup.cfg", "added", "runner-config-sections")}
    there = await env.execute(["test", "-e", "a/setup.cfg"], env=None, cwd=env.workdir, timeout=30)
    assert there.exit_code != 0
    assert max(read_sizes) < 2 * ADDED_CONFIG_MAX, read_sizes


async def test_changed_ignored_sources_larger_than_a_patch_may_be_score_zero_as_such(env):
    """An ignored source file the agent grew past max_patch_bytes is the agent's doing:
    ``patch_too_large``, as a patch that large is (not a failure of the grader)."""
    grader = await prepare_grader(env, "check", {}, integrity={"max_patch_bytes": 100_000})
    await act(
        env,
        "head -c 200000 /dev/zero | tr '\\0' '#' >> build/gen.py",
        f"printf %s {shlex.quote(FIXED)} > calc.py",
    )
    result = await grade(grader, env)
    assert result.score == 0.0
    assert result.info["score_reason"] == "patch_too_large", result.info


async def test_an_outside_path_grown_huge_is_read_bounded_changed_and_put_back(
    env, read_sizes, tmp_path
):
    """The benchmark's paths outside the repository are read at grading only up to what
    they took at the baseline, as the protected files are."""
    outside = tmp_path / "run_tests.sh"
    outside.write_text("#!/bin/sh\nexec python3 tests/check.py\n")
    workspace = Workspace(outside_paths=(str(outside),))

    @hookimpl
    def uniagent_rewards():
        defaults = IntegrityDefaults(workspace=lambda task, settings: workspace)
        yield RewardSpec(name="check-outside", fn=command, integrity=defaults)

    load_plugins().register(types.SimpleNamespace(uniagent_rewards=uniagent_rewards), "o")
    grader = await prepare_grader(env, "check-outside", {})
    await act(env, f"head -c {GROWN} /dev/zero | tr '\\0' '#' >> {outside}")
    read_sizes.clear()
    result = await grade(grader, env)
    assert result.score == 0.0
    assert tampered(result) == {(str(outside), "modified", "outside-paths")}
    assert outside.read_text() == "#!/bin/sh\nexec python3 tests/check.py\n"
    assert max(read_sizes) < 1 << 20, read_sizes


async def test_code_hidden_under_git_is_removed_before_grading(env):
    grader = await prepare_grader(env, "check", {})
    await act(
        env,
        "mkdir -p .git/x .git/refs/heads/lib && printf 'x = 1\\n' > .git/x/evil.py && "
        "printf 'x = 1\\n' > .git/refs/heads/lib/evil.py && "
        "printf 'x = 1\\n' > .git/objects/evil.py && git branch -q side",
        f"printf %s {shlex.quote(FIXED)} > calc.py",
    )
    result = await grade(grader, env)
    found = {(p, rule) for p, _, rule in tampered(result)}
    assert {
        (".git/x/evil.py", "git-foreign"),
        (".git/refs/heads/lib/evil.py", "git-foreign"),
        (".git/objects/evil.py", "git-foreign"),
    } <= found
    assert result.score == 1.0, "removed, reported, not scored: git's own files stay"
    listing = await env.execute(
        ["sh", "-c", "ls .git/x .git/refs/heads; find .git/objects -name '*.py'"], env=None
    )
    assert "evil.py" not in listing.stdout and "side" in listing.stdout


async def test_replace_refs_do_not_change_what_git_shows_the_grader(env):
    grader = await prepare_grader(env, "check", {}, integrity={"on_tamper": "report"})
    await act(
        env,
        "printf 'import os\\nos._exit(0)\\n' >> calc.py && "
        'git replace -f "$(git rev-parse HEAD:calc.py)" "$(git hash-object -w calc.py)"',
    )
    result = await grade(grader, env)
    assert ("calc.py", "hit", "exit-hijack") in tampered(result)
    assert "GIT_NO_REPLACE_OBJECTS=1" in result.info["output"]


def test_plugin_autoload_is_off_where_the_task_set_declares_it():
    assert IntegritySettings(disable_plugin_autoload=True).disable_plugin_autoload is True


@pytest.mark.parametrize(("declared", "expected"), [(True, True), (None, False)])
async def test_plugin_autoload_declared_per_task_set(env, declared, expected):
    SEEN.clear()
    grader = await prepare_grader(env, "check", {}, integrity={"disable_plugin_autoload": declared})
    result = await grade(grader, env)
    assert ("PYTEST_DISABLE_PLUGIN_AUTOLOAD=1" in result.info["output"]) is expected


# -- fresh sandboxes ---------------------------------------------------------------------------


async def test_a_fresh_sandbox_keeps_legitimate_edits_of_a_shared_config_file(env):
    grader = await prepare_grader(env, "check", {}, grade_in="fresh", fresh_env=fresh_env)
    await act(
        env,
        "sed -i 's/name = calc/name = calc2/' setup.cfg",
        f"printf %s {shlex.quote(FIXED)} > calc.py",
    )
    result = await grade(grader, env)
    assert result.score == 1.0 and tampered(result) == set()
    assert "name = calc2" in result.info["output"], "only the runner's section is the grader's"


async def test_the_fresh_sandbox_is_started_while_the_agent_works(env):
    started: list[AgentEnv] = []

    def tracked() -> AgentEnv:
        fresh = fresh_env()
        started.append(fresh)
        return fresh

    grader = await prepare_grader(env, "check", {}, grade_in="fresh", fresh_env=tracked)
    assert len(started) == 1, "asked for at the baseline, before the agent's first turn"
    await act(env, f"printf %s {shlex.quote(FIXED)} > calc.py")
    assert (await grade(grader, env)).score == 1.0
    assert len(started) == 1, "grading used the one started ahead"
    unused = await prepare_grader(env, "check", {}, grade_in="fresh", fresh_env=tracked)
    await unused.close()  # an episode that is not graded closes it
    assert len(started) == 2 and not await started[1].is_alive()


async def test_a_fresh_sandbox_still_starting_is_stopped_when_the_episode_ends(env, tmp_path):
    """An episode that ends before grading (failed, masked, interrupted) while the fresh
    sandbox is still in its set-up stops it there: close() does not wait for the set-up."""
    import asyncio
    import os

    from uniagent.env.open_envs import env_scope

    gate, began = tmp_path / "gate", tmp_path / "began"
    os.mkfifo(gate)
    slow = f"{SETUP} && touch {began} && cat {gate}"  # blocks until the gate is opened

    def blocked() -> AgentEnv:
        return open_env({"type": "host", "isolation": "none"}, {"post_setup": [slow]})

    with env_scope() as scope:
        grader = await prepare_grader(env, "check", {}, grade_in="fresh", fresh_env=blocked)
        async with asyncio.timeout(120):
            while not began.exists():  # its set-up has begun (a file it writes, not a delay)
                await asyncio.sleep(0.05)
        assert len(scope) == 1
        async with asyncio.timeout(120):  # not the set-up's time: it never ends by itself
            await grader.close()
        assert len(scope) == 0
        await grader.close()  # idempotent


async def test_a_fresh_sandbox_started_ahead_is_stopped_when_grading_times_out(env):
    """A grading timeout while waiting for the fresh sandbox leaves nothing running (30 s: the
    checks before that wait must not use it up on a loaded machine)."""
    from uniagent.env.open_envs import env_scope

    def never() -> AgentEnv:
        return open_env(
            {"type": "host", "isolation": "none"}, {"post_setup": [f"{SETUP} && sleep 600"]}
        )

    with env_scope() as scope:
        grader = await prepare_grader(
            env, "check", {}, grade_in="fresh", fresh_env=never, integrity={"grading_timeout": 30}
        )
        await act(env, f"printf %s {shlex.quote(FIXED)} > calc.py")
        with pytest.raises(Exception, match="fresh sandbox did not start in time"):
            await grade(grader, env)
        assert len(scope) == 0
        await grader.close()


TWICE = {
    "hidden-option": (
        "printf '# note\\raddopts = -p evil\\n' >> setup.cfg",
        0.0,
        {("setup.cfg", "modified", "runner-config-sections")},
    ),
    "legit-setup-cfg-edit": ("sed -i 's/name = calc/name = calc2/' setup.cfg", 1.0, set()),
}


@pytest.mark.parametrize("case", sorted(TWICE))
@pytest.mark.parametrize("grade_in", ["episode", "fresh"])
async def test_grading_the_same_sandbox_twice_gives_the_same_result(env, grade_in, case):
    """The second grading (fresh: a sandbox started then, the first one used the one started
    ahead) sees what the first saw: the same scores, reasons and tamper reports."""
    command_, score, reports = TWICE[case]
    grader = await prepare_grader(env, "check", {}, grade_in=grade_in, fresh_env=fresh_env)
    await act(env, command_, f"printf %s {shlex.quote(FIXED)} > calc.py")
    first, second = await grade(grader, env), await grade(grader, env)
    assert first.score == second.score == score
    assert first.info.get("score_reason") == second.info.get("score_reason")
    assert tampered(first) == tampered(second) == reports


def test_is_protected_answers_as_each_rule_asked_in_turn():
    # The shortcut (one search for a path no file or section pattern can match) must give the
    # answer of the purge, file and section rules asked one by one, for every reward's
    # defaults, a protect_paths setting and paths in and below every kind of pattern.
    settings = IntegritySettings.model_validate({"protect_paths": ["tests/", "/setup.cfg"]})
    rules = settings.rules(IntegrityDefaults(), ())
    parts = ["", "a", "tests", "build", ".git", "pytest", "sub", "_pytest", "__pycache__"]
    names = ["conftest.py", "setup.cfg", "pyproject.toml", "tox.ini", "mod.py", "x.pth",
             "pytest.ini", "x.pyc", "HEAD", "sitecustomize.py", "tests", "calc.py"]  # fmt: skip
    paths = {
        "/".join(p for p in (a, b, name) if p)
        for a, b, name in itertools.product(parts, parts, names)
    }

    def slow(path: str) -> bool:
        return not rules.purges(path) and (rules.protects(path) or rules.protects_section(path))

    answers = {p: slow(p) for p in paths}
    assert 50 < sum(answers.values()) < len(paths) - 50  # both answers, many times
    assert rules._maybe is not None  # the shortcut is taken
    assert [p for p in sorted(paths) if rules.is_protected(p) != answers[p]] == []


def test_path_rules_answer_as_the_gitignore_spec_does():
    # The one-regex shortcut must give the spec's answer for every path: negations,
    # directory patterns, anchored and unanchored ones, the defaults of every reward.
    settings = IntegritySettings.model_validate({"protect_paths": ["tests/", "/setup.cfg"]})
    lines = [p for r in settings.rules(IntegrityDefaults(), ()).protect for p in r.patterns]
    lines += ["build/", "!build/keep.py", "*.log", "!important.log", "docs/**/conf.py"]
    parts = ["", "a", "tests", "build", "docs", "x", ".git", "pytest", "sub", "_pytest"]
    names = ["conftest.py", "keep.py", "important.log", "run.log", "conf.py", "HEAD",
             "config", "hooks", "setup.cfg", "mod.py", "x.pth", "pytest", "tests"]  # fmt: skip
    paths = {
        "/".join(p for p in (a, b, name) if p)
        for a, b, name in itertools.product(parts, parts, names)
    }
    paths |= {f"{p}/_" for p in paths}
    spec = pathspec.GitIgnoreSpec.from_lines(lines)
    fast = PathRules(lines)
    assert sum(spec.match_file(p) for p in paths) > 100  # the paths do test both answers
    assert [p for p in sorted(paths) if fast.match_file(p) != spec.match_file(p)] == []
    assert not PathRules([]).match_file("conftest.py")
    assert fast._filtered  # the shortcut was taken (it is off where a pattern is not a regex)
