"""Third-party MCP servers from the registries as ``tools: [{mcp: ...}]``, through ``uniagent run``.

Nothing here is written for uniagent: ``mcp-server-git`` is pip-installed into a fresh
venv and ``@modelcontextprotocol/server-filesystem`` npm-installed into a fresh prefix, at
test time, at pinned versions. Each runs inside the episode's bubblewrap sandbox, on the
task's repository (the swe_tiny ``mean-empty`` task, cloned into the sandbox's work dir),
driven by a scripted chat server through ``uniagent run``; the ``command`` reward grades
what the server did to the repository.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import venv
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from test_run import env_for, results, run_command

from uniagent.testing.chat_server import Reply, ScriptedChatServer, tool_call

pytest.importorskip("mcp", reason="the integration suite installs uniagent[mcp]")
pytestmark = pytest.mark.skipif(
    shutil.which("bwrap") is None, reason="needs bubblewrap (apt-get install bubblewrap)"
)

GIT_SERVER = "mcp-server-git==2026.10.19"
FS_SERVER = "@modelcontextprotocol/server-filesystem@2026.8.31"
FIXED = "return sum(values) / len(values) if values else 0.0"
BUGGY = "return sum(values) / len(values)"


@pytest.fixture(scope="module")
def git_server(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with ``mcp-server-git`` (and so the ``mcp`` SDK the helper needs)."""
    path = tmp_path_factory.mktemp("git-server") / "venv"
    venv.EnvBuilder(with_pip=True).create(path)
    subprocess.run(
        [str(path / "bin" / "python"), "-m", "pip", "install", "-q", GIT_SERVER],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return path


@pytest.fixture(scope="module")
def fs_server(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh npm prefix with the reference filesystem server."""
    npm = shutil.which("npm")
    if npm is None:
        pytest.skip("needs npm (apt-get install npm)")
    prefix = tmp_path_factory.mktemp("fs-server") / "npm"  # mktemp's own dir is 0700
    subprocess.run(
        [npm, "install", "--prefix", str(prefix), "--no-audit", "--no-fund", FS_SERVER],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return prefix


def mean_empty(tasks: Path, out: Path, ro_binds: list[str]) -> Path:
    """The one swe_tiny task these runs use (its repository has a bug in ``stats.py``).

    Its sandbox also sees ``ro_binds`` (the server's install): the row's own ``ro_binds``
    (its repository) replace the config's, as every list in ``config_overrides`` does.
    """
    rows = [json.loads(line) for line in tasks.read_text().splitlines()]
    (row,) = [r for r in rows if r["instance_id"] == "mean-empty"]
    row["config_overrides"]["env"]["deployment"]["ro_binds"] += ro_binds
    out.write_text(json.dumps(row) + "\n")
    return out


def write_config(path: Path, tools: list[Any]) -> Path:
    """The swe_tiny example config with these tools, in a bubblewrap sandbox."""
    config = {
        "tool_parser": "hermes",
        "tools": tools,
        "instance_template": "{problem_statement}",
        "interaction": {"max_turns": 12, "action_timeout": 60, "timeout_budget": 300},
        "env": {"deployment": {"type": "host", "isolation": "bwrap"}},
        "reward": {
            "name": "command",
            "settings": {"timeout": 60},
            "integrity": {"protect_paths": ["tests/"]},
        },
        "sampling": {"temperature": 0.0, "max_tokens": 512},
    }
    path.write_text(json.dumps(config))  # JSON is YAML
    return path


def scripted(calls: list[tuple[str, dict[str, Any]]]) -> Callable[[dict[str, Any]], Reply]:
    """Each request makes the next call: the number of tool results so far picks it."""

    def reply(body: dict[str, Any]) -> Reply:
        done = sum(1 for m in body["messages"] if m["role"] == "tool")
        name, arguments = calls[min(done, len(calls) - 1)]
        return Reply("", tool_calls=[tool_call(name, arguments, f"call_{done}")])

    return reply


def run_episode(
    config: Path, tasks: Path, out: Path, sandbox_tmp: Path, calls: list[tuple[str, dict]]
) -> tuple[dict[str, Any], list[str], dict[str, Any]]:
    """One ``uniagent run``: its result, the tool observations in order, the tools offered."""
    with ScriptedChatServer(default=scripted(calls)) as server:
        proc = subprocess.run(
            run_command(config, tasks, f"openai:{server.base_url}#scripted", out),
            capture_output=True,
            text=True,
            env=env_for(sandbox_tmp),
            timeout=600,
        )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (record,) = results(out)
    episode = Path(record["episode_dir"])
    messages = json.loads((episode / "messages.json").read_text())
    observations = [str(m["content"]) for m in messages if m["role"] == "tool"]
    tools = {
        t["function"]["name"]: t["function"]
        for t in json.loads((episode / "rollout.json").read_text())["tools"]
    }
    return record, observations, tools


def test_mcp_server_git_from_pip_acts_on_the_tasks_repository(
    git_server: Path, tasks: Path, tmp_path: Path, sandbox_tmp: Path
) -> None:
    server = {
        "name": "git",
        # Confined to the task's repository: the sandbox's work dir, where the agent's shell is.
        "command": [str(git_server / "bin" / "mcp-server-git"), "--repository", "."],
        "python": str(git_server / "bin" / "python"),
        "include": ["git_status", "git_diff_unstaged", "git_add", "git_commit", "git_log"],
    }
    config = write_config(tmp_path / "config.yaml", ["execute_bash", "submit", {"mcp": server}])
    task = mean_empty(tasks, tmp_path / "tasks.jsonl", [str(git_server), sys.base_prefix])
    fix = f"sed -i 's|{BUGGY}|{FIXED}|' stats.py"
    calls = [
        ("execute_bash", {"command": fix}),
        ("git_status", {"repo_path": "."}),
        ("git_diff_unstaged", {"repo_path": "."}),
        ("git_add", {"repo_path": ".", "files": []}),  # minItems 1: refused, never sent
        ("git_add", {"repo_path": ".", "files": ["stats.py"]}),
        ("git_commit", {"repo_path": ".", "message": "mean of nothing is 0.0"}),
        ("git_log", {"repo_path": ".", "max_count": 1}),
        ("git_status", {"repo_path": "/"}),  # outside its repository: the server refuses
        ("execute_bash", {"command": "git log --format=%s -1 && git status --porcelain"}),
        ("submit", {}),
    ]
    record, seen, tools = run_episode(config, task, tmp_path / "out", sandbox_tmp, calls)
    assert record["exit_reason"] == "finished" and record["reward"] == 1.0, record
    _, status, diff, empty_add, added, committed, log, outside, bash = seen  # submit: none
    assert "modified:" in status and "stats.py" in status, status
    assert f"+    {FIXED}" in diff and f"-    {BUGGY}" in diff, diff
    assert 'parameter "files"' in empty_add and "non-empty" in empty_add, empty_add
    assert "[exit code" not in added and "[exit code" not in committed, (added, committed)
    assert "mean of nothing is 0.0" in log, log
    assert "[exit code 1]" in outside and "outside the allowed repository" in outside, outside
    # The commit is the repository's own: bash in the same sandbox sees it, nothing left over.
    assert bash.strip() == "mean of nothing is 0.0", bash  # and `git status` is clean
    # The model saw the server's own tools and JSON schemas, filtered by `include`.
    assert set(tools) == {"execute_bash", "submit", *server["include"]}
    assert tools["git_add"]["parameters"]["properties"]["files"]["minItems"] == 1
    assert tools["git_commit"]["parameters"]["required"] == ["repo_path", "message"]
    assert record["metrics"]["tool_calls"]["git_status"] == 2
    assert record["tool_servers"] == {name: "mcp:git" for name in server["include"]}


def test_server_filesystem_from_npm_fixes_the_tasks_repository(
    fs_server: Path, tasks: Path, tmp_path: Path, sandbox_tmp: Path
) -> None:
    binary = fs_server / "node_modules" / ".bin" / "mcp-server-filesystem"
    server = {
        "name": "fs",
        "command": [str(binary), "."],  # the one directory it may touch: the task's repository
        "python": sys.executable,  # the helper, with this interpreter's `mcp`
        "exclude": ["read_media_file"],
    }
    config = write_config(tmp_path / "config.yaml", ["submit", {"mcp": server}])
    task = mean_empty(
        tasks, tmp_path / "tasks.jsonl", [str(fs_server), sys.prefix, sys.base_prefix]
    )
    calls = [
        ("list_allowed_directories", {}),
        ("read_text_file", {"path": "stats.py"}),
        ("read_text_file", {"path": "/etc/hostname"}),  # outside: the server refuses
        ("edit_file", {"path": "stats.py", "edits": "not a list"}),  # schema violation
        ("edit_file", {"path": "stats.py", "edits": [{"oldText": BUGGY, "newText": FIXED}]}),
        ("read_text_file", {"path": "stats.py"}),
        ("submit", {}),
    ]
    record, seen, tools = run_episode(config, task, tmp_path / "out", sandbox_tmp, calls)
    assert record["exit_reason"] == "finished" and record["reward"] == 1.0, record
    allowed, before, outside, invalid, edited, after = seen
    # The sandbox's work dir, where the task was cloned (bwrap: /uniagent/work).
    assert allowed.splitlines()[-1].rstrip().endswith("/work"), allowed
    assert BUGGY in before and FIXED not in before, before
    assert "[exit code 1]" in outside and "outside allowed directories" in outside, outside
    assert 'parameter "edits"' in invalid and "[exit code" not in invalid, invalid
    assert f"+    {FIXED}" in edited, edited
    assert FIXED in after, after
    assert "read_media_file" not in tools and "submit" in tools
    assert (
        record["tool_servers"]["edit_file"] == "mcp:fs" and "submit" not in record["tool_servers"]
    )
    assert tools["edit_file"]["parameters"]["properties"]["edits"]["type"] == "array"
