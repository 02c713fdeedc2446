"""submit and finish end the episode; their command's output is the recorded submission."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from conftest import Sandbox

pytestmark = pytest.mark.asyncio


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True
    ).stdout


def make_repo(path: Path) -> Path:
    path.mkdir()
    git(path, "init", "-q")
    git(path, "config", "user.email", "t@example.com")
    git(path, "config", "user.name", "t")
    (path / "a.py").write_text("a = 1\n")
    (path / "gone.py").write_text("x = 0\n")
    (path / ".gitignore").write_text("*.log\n")
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "base")
    return path


async def test_finish_and_submit_end_the_episode(sandbox: Sandbox) -> None:
    assert sandbox.tools["finish"].ends_episode
    assert sandbox.tools["submit"].ends_episode
    assert not sandbox.tools["execute_bash"].ends_episode
    assert not sandbox.tools["str_replace_editor"].ends_episode


@pytest.mark.parametrize(
    "answer", ["42", 'It\'s "quoted" $HOME `id`\nsecond line', "答案：π ≈ 3.14 🙂", "-n"]
)
async def test_finish_prints_the_answer_verbatim(sandbox: Sandbox, answer: str) -> None:
    obs = await sandbox.call("finish", answer=answer)
    assert obs.exit_code == 0
    assert obs.output == answer + "\n"


async def test_submit_prints_the_diff_of_the_repository(sandbox: Sandbox) -> None:
    repo = make_repo(sandbox.workdir / "repo")
    (repo / "a.py").write_text("a = 2\n")
    (repo / "gone.py").unlink()
    (repo / "new.py").write_text("n = 1\n")
    (repo / "debug.log").write_text("ignored\n")
    status_before = git(repo, "status", "--porcelain")
    await sandbox.call("execute_bash", command=f"cd {repo}")
    obs = await sandbox.call("submit")
    assert obs.exit_code == 0, obs.output
    assert "diff --git a/a.py b/a.py" in obs.output
    assert "-a = 1\n+a = 2" in obs.output
    assert "deleted file mode" in obs.output
    assert "diff --git a/new.py b/new.py" in obs.output
    assert "debug.log" not in obs.output
    assert git(repo, "status", "--porcelain") == status_before  # the real index is untouched
    # The submission is a patch that applies to the base commit.
    clone = sandbox.workdir / "clone"
    git(sandbox.workdir, "clone", "-q", str(repo), str(clone))
    (sandbox.workdir / "sub.patch").write_text(obs.output)
    applied = await sandbox.run(f"git -C {clone} apply {sandbox.workdir / 'sub.patch'}")
    assert applied.exit_code == 0, applied.output
    assert (clone / "a.py").read_text() == "a = 2\n"
    assert (clone / "new.py").exists()
    assert not (clone / "gone.py").exists()


async def test_submit_from_a_subdirectory_uses_the_repository_root(sandbox: Sandbox) -> None:
    repo = make_repo(sandbox.workdir / "repo")
    (repo / "pkg").mkdir()
    (repo / "a.py").write_text("a = 3\n")
    await sandbox.call("execute_bash", command=f"cd {repo / 'pkg'}")
    obs = await sandbox.call("submit")
    assert "+a = 3" in obs.output


async def test_submit_sees_a_same_size_edit_made_right_after_the_commit(
    sandbox: Sandbox,
) -> None:
    # Same size and (likely) the same second as the index: git must not trust the stat data.
    repo = make_repo(sandbox.workdir / "repo")
    (repo / "a.py").write_text("a = 9\n")
    await sandbox.call("execute_bash", command=f"cd {repo}")
    obs = await sandbox.call("submit")
    assert "-a = 1\n+a = 9" in obs.output


async def test_submit_of_an_unchanged_repository_is_empty(sandbox: Sandbox) -> None:
    repo = make_repo(sandbox.workdir / "repo")
    await sandbox.call("execute_bash", command=f"cd {repo}")
    obs = await sandbox.call("submit")
    assert (obs.exit_code, obs.output.strip()) == (0, "")


async def test_submit_uses_the_configured_repository(sandbox: Sandbox) -> None:
    repo = make_repo(sandbox.workdir / "repo")
    (repo / "a.py").write_text("a = 4\n")
    await sandbox.export(UNIAGENT_SUBMIT_REPO=str(repo))
    await sandbox.call("execute_bash", command="cd /")
    obs = await sandbox.call("submit")
    assert "+a = 4" in obs.output


async def test_submit_diffs_against_the_configured_base_commit(sandbox: Sandbox) -> None:
    repo = make_repo(sandbox.workdir / "repo")
    base = git(repo, "rev-parse", "HEAD").strip()
    (repo / "a.py").write_text("a = 6\n")
    git(repo, "commit", "-qam", "the agent committed")
    await sandbox.export(UNIAGENT_SUBMIT_BASE=base)
    await sandbox.call("execute_bash", command=f"cd {repo}")
    obs = await sandbox.call("submit")
    assert "-a = 1\n+a = 6" in obs.output


async def test_submit_with_a_bad_base_commit_explains_itself(sandbox: Sandbox) -> None:
    repo = make_repo(sandbox.workdir / "repo")
    await sandbox.export(UNIAGENT_SUBMIT_BASE="no-such-commit")
    await sandbox.call("execute_bash", command=f"cd {repo}")
    obs = await sandbox.call("submit")
    assert obs.exit_code == 1
    assert "UNIAGENT_SUBMIT_BASE=no-such-commit is not a commit" in obs.output


async def test_submit_in_a_repository_without_commits_shows_new_files(sandbox: Sandbox) -> None:
    repo = sandbox.workdir / "fresh"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "n.py").write_text("n = 1\n")
    await sandbox.call("execute_bash", command=f"cd {repo}")
    obs = await sandbox.call("submit")
    assert obs.exit_code == 0, obs.output
    assert "new file mode" in obs.output
    assert "+n = 1" in obs.output


async def test_submit_can_also_write_the_exact_patch_to_a_file(sandbox: Sandbox) -> None:
    repo = make_repo(sandbox.workdir / "repo")
    (repo / "a.py").write_text("a = 5\n")
    (repo / "w.txt").write_bytes(b"crlf\r\nline\r\n")
    patch = sandbox.workdir / "out.patch"
    await sandbox.export(UNIAGENT_SUBMIT_PATCH_FILE=str(patch))
    await sandbox.call("execute_bash", command=f"cd {repo}")
    obs = await sandbox.call("submit")
    assert obs.exit_code == 0, obs.output
    assert patch.read_bytes().decode() == obs.output  # nothing the observation drops
    clone = sandbox.workdir / "clone"
    git(sandbox.workdir, "clone", "-q", str(repo), str(clone))
    git(clone, "apply", str(patch))
    assert (clone / "w.txt").read_bytes() == b"crlf\r\nline\r\n"
    assert (clone / "a.py").read_text() == "a = 5\n"


async def test_submit_outside_a_repository_explains_itself(sandbox: Sandbox) -> None:
    obs = await sandbox.call("submit")
    assert obs.exit_code == 1
    assert "is not inside a git repository" in obs.output
    assert "UNIAGENT_SUBMIT_REPO" in obs.output
