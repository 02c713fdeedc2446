"""What would fail every bwrap sandbox at start is a config error when the config resolves.

Real bubblewrap, real permissions: when uniagent runs as root the sandbox runs as
uid 65534, which cannot enter a 0700 directory of root (what ``mktemp -d`` makes).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from uniagent import open_env
from uniagent.config import AgentConfig
from uniagent.env import EnvStartError
from uniagent.env.host import BWRAP_WORKDIR
from uniagent.errors import ConfigError
from uniagent.resolver import resolve
from uniagent.testing import Reply, ScriptedChatServer, cli, tool_call


@pytest.fixture
def private_data() -> Path:
    """A readable file in a directory the sandbox's user cannot enter: ``mktemp -d``'s 0700
    as root (the sandbox is uid 65534), no access at all otherwise (the sandbox is us)."""
    folder = Path(tempfile.mkdtemp())
    (folder / "data").mkdir()
    (folder / "data" / "f.txt").write_text("hi\n")
    (folder / "data").chmod(0o755)
    folder.chmod(0o700 if os.geteuid() == 0 else 0o000)
    yield folder / "data"
    folder.chmod(0o700)
    (folder / "data" / "f.txt").unlink()
    (folder / "data").rmdir()
    folder.rmdir()


def agent(deployment: dict, **env: object) -> AgentConfig:
    return AgentConfig.from_dict(
        {"env": {"deployment": {"type": "host", "isolation": "bwrap", **deployment}, **env}}
    )


def test_a_bwrap_args_bind_the_sandbox_user_cannot_reach_is_a_config_error(private_data):
    args = ["--ro-bind", str(private_data), "/data"]
    with pytest.raises(ConfigError) as caught:
        resolve(agent({"bwrap_args": args}), source="agent.yaml")
    message = str(caught.value)
    assert message.startswith("invalid agent.yaml:\n  env.deployment.bwrap_args.1: ")
    assert str(private_data) in message and "Can't find source path" in message
    assert "chmod o+x" in message and "ro_binds" in message and "sandbox_uid: 0" in message
    # open_env (scripts, tests) says it too, before the sandbox starts.
    with pytest.raises(ConfigError, match=r"env\.deployment\.bwrap_args\.1: "):
        open_env({"type": "host", "isolation": "bwrap", "bwrap_args": args})


async def test_the_fixes_it_names_work(private_data):
    # ro_binds: root brings the path in, so the directories above it do not matter.
    resolve(agent({"ro_binds": [f"{private_data}:/data"]}))
    async with open_env(
        {"type": "host", "isolation": "bwrap", "ro_binds": [f"{private_data}:/data"]}
    ) as env:
        assert (await env.run_action("cat /data/f.txt")).output == "hi\n"
    if os.geteuid() == 0:  # bwrap as host root reaches it as it is
        resolve(agent({"sandbox_uid": 0, "bwrap_args": ["--ro-bind", str(private_data), "/d"]}))


def test_reachable_or_missing_bwrap_args_binds_pass():
    data = Path(tempfile.mkdtemp(dir="/tmp"))  # /tmp itself is open to everyone
    try:
        data.chmod(0o755)
        args = ["--ro-bind", str(data), "/data", "--ro-bind-try", "/nope", "/x"]
        resolve(agent({"bwrap_args": [*args, "--bind", "/not/yet", "/y"]}))  # left to start
    finally:
        data.rmdir()


@pytest.mark.parametrize(
    ("settings", "key", "target"),
    [
        ({"post_setup": ["mkdir /opt/cache"]}, "env.post_setup.0", "/opt/cache"),
        ({"post_setup": ["true", "mkdir -p /tmp/x && touch /usr/local/stamp"]},
         "env.post_setup.1", "/usr/local/stamp"),
        ({"post_setup": ["echo ready > /etc/ready"]}, "env.post_setup.0", "/etc/ready"),
        ({"workdir": "/testbed"}, "env.workdir", "/testbed"),
    ],
)  # fmt: skip
def test_a_set_up_that_writes_to_the_read_only_root_is_a_config_error(settings, key, target):
    with pytest.raises(ConfigError) as caught:
        resolve(agent({}, **settings), source="agent.yaml")
    message = str(caught.value)
    assert f"\n  {key}: " in message and f"writes {target}, where the bwrap sandbox is" in message
    assert f"only {BWRAP_WORKDIR}, /tmp, /root, /uniagent/tools are writable" in message


@pytest.mark.parametrize(
    "command",
    [
        f"mkdir -p /tmp/a/b && touch {BWRAP_WORKDIR}/x && echo hi > /root/.note",
        "mkdir -p /usr/bin",  # exists: nothing is written
        "mkdir /opt/x || true",  # may fail: not certain from the text
        "mkdir /opt/x; true",
        'mkdir "$HOME/x"',  # not literal
        "git clone -q /src . && pip install -e .",
    ],
)
def test_a_set_up_that_may_work_resolves(command):
    resolve(agent({}, post_setup=[command]))


def test_a_task_override_is_checked_too():
    base = resolve(AgentConfig.from_dict(
        {"env": {"deployment": {"type": "host", "isolation": "bwrap"}}}
    ))  # fmt: skip
    with pytest.raises(ConfigError, match=r"task t1:\n  env\.post_setup\.0: 'mkdir /opt/x'"):
        base.for_task({"env": {"post_setup": ["mkdir /opt/x"]}}, source="task t1")


async def test_a_set_up_write_found_only_at_start_is_one_line_naming_the_writable_places():
    env = open_env({"type": "host", "isolation": "bwrap"}, {"post_setup": ["d=/opt/x; mkdir $d"]})
    with pytest.raises(EnvStartError) as caught:
        await env.start()
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("setup command 'd=/opt/x; mkdir $d' exited with 1: mkdir: ")
    assert f"only {BWRAP_WORKDIR}, /tmp, /root, /uniagent/tools are writable" in message


def test_without_isolation_nothing_is_refused():
    resolve(AgentConfig.from_dict(
        {"env": {"deployment": {"type": "host", "isolation": "none"},
                 "post_setup": ["mkdir -p /tmp/x"], "workdir": "/tmp/w"}}
    ))  # fmt: skip


# -- grade_in: fresh without isolation ------------------------------------------------------


def run_fixed_workdir(
    tmp_path: Path, deployment: dict | None = None, **reward: object
) -> tuple[int, Path]:
    """``uniagent run`` of one task whose set-up clones a repository into a fixed
    work dir (``env.workdir`` of a host sandbox without isolation, or ``deployment``'s);
    the agent calls ``done``."""
    source = tmp_path / "source"
    source.mkdir()
    git = ["git", "-C", str(source), "-c", "user.name=t", "-c", "user.email=t@t"]
    (source / "a.txt").write_text("1\n")
    for args in (["init", "-q"], ["add", "a.txt"], ["commit", "-q", "-m", "base"]):
        subprocess.run([*git, *args], check=True)
    config = tmp_path / "agent.yaml"
    env = {"deployment": {"type": "host", "isolation": "none"}, "workdir": str(tmp_path / "w")}
    if deployment is not None:
        env = {"deployment": {"type": "host", **deployment}}
    config.write_text(json.dumps({
        "tools": ["done"], "instance_template": "{q}",
        "env": {**env, "post_setup": [f"git clone -q {source} ."]},
        "reward": {"name": "command", "settings": {"command": "test -f a.txt"}, **reward},
    }))  # fmt: skip
    data = tmp_path / "tasks.jsonl"
    data.write_text(json.dumps({"id": "t1", "q": "go"}) + "\n")
    reply = Reply("Done.", tool_calls=[tool_call("done", {}, "c1")])
    out = tmp_path / "out"
    with ScriptedChatServer(default=lambda body: reply) as server:
        status = cli([
            "run", str(config), "--data", str(data), "--out", str(out),
            "--model", f"openai:{server.base_url}#scripted", "--retry-delay", "0",
        ])  # fmt: skip
    return status, out


def test_a_fixed_workdir_without_isolation_and_a_fresh_grading_sandbox_is_refused(
    done_tool, tmp_path, capsys, monkeypatch
):
    """Without isolation ``env.workdir`` is one host directory: a fresh grading sandbox
    would start in the episode's own (``git clone ... .``: "already exists"), so every
    episode would be masked. ``uniagent run`` refuses it before any sandbox starts."""
    monkeypatch.setenv("OPENAI_API_KEY", "test")
    status, out = run_fixed_workdir(tmp_path, grade_in="fresh")
    err = capsys.readouterr().err
    assert status == 2, err
    assert "env.workdir" in err and "reward.grade_in: fresh" in err, err
    assert "grade_in: episode" in err and "sandbox_workdir" in err, err
    assert not (tmp_path / "w").exists(), "no sandbox started"
    assert not (out / "results.jsonl").exists()


def test_a_fixed_workdir_without_isolation_grades_in_the_episode(
    done_tool, tmp_path, capsys, monkeypatch
):
    monkeypatch.setenv("OPENAI_API_KEY", "test")
    status, out = run_fixed_workdir(tmp_path, grade_in="episode")
    assert status == 0, capsys.readouterr().err
    (result,) = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert result["exit_reason"] == "finished" and result["reward"] == 1.0, result


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
def test_the_bwrap_fix_it_names_grades_in_a_fresh_sandbox(done_tool, tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "test")
    deployment = {
        "isolation": "bwrap", "sandbox_workdir": "/testbed", "ro_binds": [str(tmp_path / "source")],
    }  # fmt: skip
    status, out = run_fixed_workdir(tmp_path, deployment, grade_in="fresh")
    (result,) = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert status == 0 and result["reward"] == 1.0, result
    assert result["reward_info"]["integrity"]["grade_in"] == "fresh", result


def test_a_fixed_workdir_where_auto_falls_back_to_no_isolation_is_refused_per_task_too():
    fresh = {"name": "command", "grade_in": "fresh", "settings": {"command": "true"}}
    no_bwrap = {"type": "host", "isolation": "auto", "bwrap": "no-such-bwrap"}
    with pytest.raises(ConfigError, match=r"env\.workdir: /testbed .*isolation: auto, and bwrap"):
        resolve(AgentConfig.from_dict({"env": {"deployment": no_bwrap, "workdir": "/testbed"},
                                       "reward": fresh}))  # fmt: skip
    base = resolve(AgentConfig.from_dict({"env": {"deployment": no_bwrap}, "reward": fresh}))
    with pytest.raises(ConfigError, match=r"task t1:\n  env\.workdir: /testbed is one directory"):
        base.for_task({"env": {"workdir": "/testbed"}}, source="task t1")
    base.for_task({"env": {"workdir": "repo"}}, source="task t2")  # under each sandbox's own
