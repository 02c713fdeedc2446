"""Harbor task folders: the task.toml model, the loader, the ``harbor`` reward end to end
through ``uniagent run`` on the host backend (bubblewrap), and ``uniagent verify``.

The task sets under ``data/harbor/`` were written for these tests; each folder is also
loaded by Harbor's own code (``test_harbor_loads_every_test_task``). The scripted chat
server plays the model: it runs one shell command, then calls ``done``.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from uniagent import ToolSpec, hookimpl
from uniagent.errors import ConfigError
from uniagent.harbor.folders import load_harbor_tasks, read_exclude
from uniagent.harbor.images import image_tag
from uniagent.harbor.reward import HarborRewardConfig, choose, parse_rewards
from uniagent.harbor.schema import load_task_toml
from uniagent.plugins import load_plugins, reset_plugins
from uniagent.reward import RewardInfraError
from uniagent.testing import Reply, ScriptedChatServer, cli, tool_call

DATA = Path(__file__).parent / "data" / "harbor"
GOOD = DATA / "good"
BWRAP = {"type": "host", "isolation": "bwrap"}

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")


class Command(BaseModel):
    command: str


class NoArgs(BaseModel):
    pass


SHELL = ToolSpec(
    name="shell", description="Run a command.", arguments=Command, render=lambda a: a["command"]
)
DONE = ToolSpec(
    name="done", description="Finish.", arguments=NoArgs, render=lambda a: "echo ok",
    ends_episode=True,
)  # fmt: skip


@pytest.fixture
def tools() -> Iterator[None]:
    reset_plugins()

    @hookimpl
    def uniagent_tools() -> list[ToolSpec]:
        return [SHELL, DONE]

    load_plugins().register(types.SimpleNamespace(uniagent_tools=uniagent_tools), "test-tools")
    yield
    reset_plugins()


@pytest.fixture
def state(tmp_path: Path) -> Path:
    """A host folder the sandboxes see as /state (the counters of the crash and flaky tasks)."""
    path = tmp_path / "state"
    path.mkdir()
    path.chmod(0o777)
    return path


def write_config(tmp_path: Path, state: Path, reward: dict[str, Any] | None = None) -> Path:
    config = tmp_path / "agent.yaml"
    deployment = {**BWRAP, "binds": [f"{state}:/state"]}
    config.write_text(json.dumps({
        "tools": ["shell", "done"],
        "env": {"deployment": deployment},
        "reward": reward or {"name": "harbor"},
        "interaction": {"max_turns": 4},
    }))  # fmt: skip
    return config


def agent_running(command: str):
    """The model: ``command`` on the first turn, then ``done``."""

    def reply(body: dict[str, Any]) -> Reply:
        if not any(m["role"] == "assistant" for m in body["messages"]):
            return Reply("On it.", tool_calls=[tool_call("shell", {"command": command}, "c1")])
        return Reply("Done.", tool_calls=[tool_call("done", {}, "c2")])

    return reply


def run(
    tmp_path: Path, state: Path, data: Path, command: str, *args: str, **config: Any
) -> tuple[int, list[dict[str, Any]]]:
    """``uniagent run`` over ``data`` with the scripted agent; the exit status and results."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    out = tmp_path / "out"
    with ScriptedChatServer(default=agent_running(command)) as server:
        status = cli([
            "run", str(write_config(tmp_path, state, **config)), "--data", str(data),
            "--out", str(out), "--model", f"openai:{server.base_url}#scripted",
            "--retry-delay", "0", *args,
        ])  # fmt: skip
    lines = (out / "results.jsonl").read_text().splitlines()
    return status, [json.loads(line) for line in lines]


# -- the format ---------------------------------------------------------------------------


def harbor_python() -> Path | None:
    """A Python 3.12 with harbor 0.25 (made under ~/.cache from pyenv's 3.12 if needed,
    once: concurrent test runs wait for the one that makes it)."""
    import subprocess

    from uniagent.agents.install import uv_installer
    from uniagent.cache import build_once

    venv = Path.home() / ".cache" / "uniagent-tests" / "harbor-0.25"
    found = sorted((Path.home() / ".pyenv" / "versions").glob("3.12*/bin/python3.12"))
    if not found and not (venv / "bin" / "python").exists():
        return None

    def make(staged: Path) -> None:  # never a half-made venv in place
        uv = uv_installer()  # nox's sessions have it: seconds from its cache, not minutes
        # Copied out of uv's cache, not linked: linking changes the ctime of every venv's file
        # that shares the inode (the suite's own), which a grading test running beside it reads
        # as a changed test environment.
        env = {**os.environ, "UV_LINK_MODE": "copy"}
        if uv:
            subprocess.run([uv, "venv", "-q", "-p", str(found[-1]), str(staged)], check=True)
            fill = [uv, "pip", "install", "-q", "-p", str(staged / "bin" / "python")]
        else:
            subprocess.run([str(found[-1]), "-m", "venv", str(staged)], check=True)
            fill = [str(staged / "bin" / "python"), "-m", "pip", "install", "-q"]
        subprocess.run([*fill, "harbor==0.25"], check=True, timeout=900, env=env)

    build_once(venv, make, done=lambda path: (path / "bin" / "python").exists())
    return venv / "bin" / "python"


VALIDATE = """
import sys
from pathlib import Path
from harbor.models.task.config import TaskConfig
from harbor.models.task.task import Task
for d in sorted(p.parent for p in Path(sys.argv[1]).glob("*/*/task.toml")):
    TaskConfig.model_validate_toml((d / "task.toml").read_text())
    assert Task.is_valid_dir(d), d
    print(d.relative_to(sys.argv[1]).as_posix(), Task(d).name)
"""


@pytest.mark.slow
def test_harbor_loads_every_test_task() -> None:
    import subprocess

    python = harbor_python()
    if python is None:
        # CI's machines have pyenv's 3.12: there, a missing one is a failure, not a skip.
        missing = "harbor needs Python 3.12: no ~/.pyenv/versions/3.12* here"
        if os.environ.get("CI"):
            pytest.fail(missing)
        pytest.skip(missing)
    done = subprocess.run(
        [str(python), "-c", VALIDATE, str(DATA)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    loaded = {line.split()[0] for line in done.stdout.splitlines()}
    ours = {p.parent.relative_to(DATA).as_posix() for p in DATA.glob("*/*/task.toml")}
    assert loaded == ours and len(ours) == 16


def test_task_toml_is_read_strictly(tmp_path: Path) -> None:
    path = tmp_path / "task.toml"
    path.write_text('schema_version = "1.4"\n[verifier]\ntimeout = 5\n')
    with pytest.raises(ConfigError, match=r"verifier\.timeout: unknown key"):
        load_task_toml(path)
    path.write_text('[verifier]\ntimeout_sec = "soon"\n')
    with pytest.raises(ConfigError, match=r"verifier\.timeout_sec: "):
        load_task_toml(path)
    path.write_text('schema_version = "9.0"\n')
    with pytest.raises(ConfigError, match="schema version '9.0'"):
        load_task_toml(path)
    path.write_text("[task\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_task_toml(path)
    config = load_task_toml(GOOD / "hello-file" / "task.toml")
    assert config.verifier.timeout_sec == 120 and config.verifier.env == {"EXPECTED": "hello"}
    assert config.environment.workdir == "/app" and config.task is not None


def test_the_loader_makes_one_task_per_folder() -> None:
    tasks, bad = load_harbor_tasks(GOOD, BWRAP)
    # On the host a prebuilt image is an environment it does not have: refused by name.
    [(prebuilt, why)] = [(b.task_id, b.reason) for b in bad]
    assert prebuilt == "prebuilt-image" and "environment.docker_image" in why
    assert "env.deployment.type: local" in why
    assert [t.id for t in tasks] == ["hello-file", "named-rewards", "verifier-timeout"]
    hello = tasks[0].row
    text = (GOOD / "hello-file" / "instruction.md").read_text()
    assert hello["problem_statement"] == text
    assert hello["harbor"]["verifier"] == {
        "timeout_sec": 120.0, "env": {"EXPECTED": "hello"}, "user": None
    }  # fmt: skip
    args = tasks[0].overrides()["env"]["deployment"]["bwrap_args"]
    assert args[:3] == ["--symlink", "/tmp/.harbor/tests", "/tests"]
    # [agent] timeout_sec is the agent's time limit; a task without one has none.
    assert tasks[0].overrides()["interaction"] == {"time_limit": 300.0}
    assert "interaction" not in tasks[1].overrides()
    # The environment's work dir: the sandbox's own directory, seen at /app.
    assert tasks[0].overrides()["env"]["deployment"]["sandbox_workdir"] == "/app"
    # One folder is a task set of one.
    one, _ = load_harbor_tasks(GOOD / "hello-file", BWRAP)
    assert [t.id for t in one] == ["hello-file"]
    # The host backend without bubblewrap cannot give each sandbox its own /tests.
    _, bad = load_harbor_tasks(GOOD, {"type": "host", "isolation": "none"})
    assert len(bad) == 4 and "isolation: bwrap" in bad[0].reason


def host_task(tmp_path: Path, dockerfile: str, name: str = "hello-file") -> Path:
    """A copy of ``hello-file`` whose environment/Dockerfile is ``dockerfile``."""
    task = tmp_path / "tasks" / name
    shutil.copytree(GOOD / "hello-file", task)
    (task / "environment" / "Dockerfile").write_text(dockerfile)
    toml = task / "task.toml"
    toml.write_text(toml.read_text().replace('workdir = "/app"\n', ""))
    return task


def test_the_host_reproduces_workdir_and_env_and_refuses_what_it_would_have_to_build(
    tmp_path,
) -> None:
    from uniagent.harbor.hostenv import host_environment

    def host(dockerfile: str) -> dict[str, Any]:
        task = host_task(tmp_path / str(len(list(tmp_path.iterdir()))), dockerfile)
        return host_environment(load_task_toml(task / "task.toml"), task)

    assert host("FROM debian:bookworm-slim\n") == {}
    assert host(
        "# syntax=docker/dockerfile:1\nARG V=1\nFROM debian\nLABEL a=b\nWORKDIR /srv\n"
        'WORKDIR app\nENV A=1 B="two words" \\\n    C=3\nENV OLD the rest\nCMD ["sh"]\n'
    ) == {"workdir": "/srv/app", "env": {"A": "1", "B": "two words", "C": "3", "OLD": "the rest"}}
    for line, bad in [
        (3, "FROM debian\nWORKDIR /app\nRUN apt-get update && \\\n  apt-get install -y git\n"),
        (2, "FROM debian\nCOPY data /app/data\n"),
        (2, "FROM debian\nUSER nobody\n"),
        (2, 'FROM debian\nENTRYPOINT ["/start.sh"]\n'),
        (3, "FROM debian\nARG WHERE=/app\nWORKDIR $WHERE\n"),
        (2, "FROM debian\nENV PATH=/opt/bin:/usr/bin\n"),
    ]:
        with pytest.raises(ConfigError, match=rf"environment/Dockerfile line {line}: \w+") as e:
            host(bad)
        assert "env.deployment.type: local" in str(e.value)
    with pytest.raises(ConfigError, match="work dir /tmp/app is in /tmp"):
        host("FROM debian\nWORKDIR /tmp/app\n")


def test_a_harbor_task_runs_on_the_host_in_its_work_dir_with_its_variables_or_not_at_all(
    tools, tmp_path, state
) -> None:
    """WORKDIR and ENV are what the agent's commands see; a task whose Dockerfile builds
    something is refused by run and verify before any sandbox starts (status 2), never run
    and graded without its environment."""
    data = tmp_path / "tasks"
    host_task(tmp_path, "FROM debian:bookworm-slim\nWORKDIR /app\nENV GREETING=hello\n")
    status, [result] = run(
        tmp_path / "ok", state, data, 'pwd > /state/where && echo "$GREETING" > hello.txt'
    )
    assert status == 0 and result["reward"] == 1.0
    assert (state / "where").read_text().strip() == "/app"
    host_task(tmp_path, "FROM debian:bookworm-slim\nRUN echo hello > /app/hello.txt\n", "built")
    status, results = run(tmp_path / "refused", state, data, "echo hello > hello.txt")
    assert status == 2 and [r["task_id"] for r in results] == ["hello-file"]
    summary = json.loads((tmp_path / "refused" / "out" / "summary.json").read_text())
    [skipped] = summary["skipped_rows"]
    assert "built: environment/Dockerfile line 2: RUN" in skipped["reason"]
    status, found = verify(tmp_path, state, data)
    assert status == 2 and set(found) == {"hello-file"}


def test_the_local_backend_gets_the_image_and_workdir() -> None:
    built: list[str] = []

    def build(task_dir: Path, config: Any) -> str:
        built.append(task_dir.name)
        return image_tag(task_dir)

    tasks, bad = load_harbor_tasks(GOOD, {"type": "local", "image": "unused"}, build=build)
    assert not bad and built == ["hello-file", "named-rewards", "verifier-timeout"]
    by_id = {t.id: t.overrides()["env"] for t in tasks}
    prebuilt = by_id["prebuilt-image"]["deployment"]["image"]
    assert prebuilt == "localhost/uniagent-swerex:bookworm-node"
    assert by_id["hello-file"]["workdir"] == "/app"
    # The tag is the environment's content: hello-file and named-rewards share one.
    assert (
        by_id["hello-file"]["deployment"]["image"] == by_id["named-rewards"]["deployment"]["image"]
    )
    assert image_tag(GOOD / "hello-file") != image_tag(GOOD / "hello-file", "other-base")


def test_tasks_it_cannot_honour_are_bad_rows_with_the_reason() -> None:
    tasks, bad = load_harbor_tasks(DATA / "unsupported", BWRAP)
    assert not tasks
    assert "environment.mcp_servers: task-declared MCP servers" in bad[0].reason


def test_a_separate_verifier_gets_its_own_environment_and_the_artifacts() -> None:
    built: list[tuple[str, str]] = []

    def build(task_dir: Path, config: Any, folder: str = "environment") -> str:
        built.append((task_dir.name, folder))
        return image_tag(task_dir, None, folder)

    local = {"type": "local", "image": "unused", "run_args": ["--cpus", "1"]}
    tasks, bad = load_harbor_tasks(DATA / "separate", local, build=build)
    assert not bad
    answer, image = (t.row for t in tasks)
    assert answer["harbor"]["verifier_mode"] == "separate"
    assert answer["harbor"]["artifacts"] == ["/logs/artifacts"]
    # No verifier image of its own: a new sandbox of the task's image, the tests copied in.
    agent_image = answer["config_overrides"]["env"]["deployment"]["image"]
    assert answer["verifier_env"]["env"]["deployment"]["image"] == agent_image
    assert not answer["harbor"]["verifier_bundled"]
    # tests/Dockerfile: built with tests/ as its context, the tests bundled in it.
    assert image["harbor"]["artifacts"] == ["/logs/artifacts", "/app/result.txt"]
    verifier = image["verifier_env"]["env"]
    assert verifier["deployment"] == {
        "image": image_tag(DATA / "separate" / "verifier-image", None, "tests"),
        "run_args": ["--cpus", "1"],
    }
    assert verifier["workdir"] == "/app" and image["harbor"]["verifier_bundled"]
    assert ("verifier-image", "tests") in built
    # On the host: the same deployment again (no images there), the tests copied in; a
    # verifier whose tests/Dockerfile builds an environment of its own is refused.
    tasks, bad = load_harbor_tasks(DATA / "separate", BWRAP)
    assert [t.row["verifier_env"] for t in tasks] == [{}]
    assert not any(t.row["harbor"]["verifier_bundled"] for t in tasks)
    [refused] = bad
    assert refused.task_id == "verifier-image" and "tests/Dockerfile line 4: RUN" in refused.reason
    # Without a deployment (data prepare without a config): no verifier sandbox.
    tasks, _ = load_harbor_tasks(DATA / "separate")
    assert all("verifier_env" not in t.row for t in tasks)


def test_reward_files_are_parsed_strictly() -> None:
    assert parse_rewards("reward.txt", "1\n") == {"reward": 1.0}
    assert parse_rewards("reward.json", '{"a": 1, "b": 0.5}') == {"a": 1.0, "b": 0.5}
    for name, text in [("reward.txt", "yes"), ("reward.txt", ""), ("reward.json", '{"a": "1"}'),
                       ("reward.json", '{"a": NaN}'), ("rewards.json", "[1]")]:  # fmt: skip
        with pytest.raises(RewardInfraError):
            parse_rewards(name, text)
    settings = HarborRewardConfig()
    assert choose({"a": 1.0, "b": 0.0}, settings) == ("mean", 0.5)
    assert choose({"a": 1.0, "b": 0.0}, HarborRewardConfig(aggregate="min")) == ("min", 0.0)
    assert choose({"a": 1.0, "b": 0.0}, HarborRewardConfig(reward_key="a")) == ("a", 1.0)
    with pytest.raises(RewardInfraError, match="reward_key"):
        choose({"a": 1.0}, HarborRewardConfig(reward_key="c"))


# -- uniagent run on the host backend --------------------------------------------------------


def test_a_solved_task_scores_1_and_an_unsolved_one_0(tools, tmp_path, state) -> None:
    status, results = run(tmp_path, state, GOOD / "hello-file", "echo hello > hello.txt")
    assert status == 0
    [solved] = results
    assert solved["exit_reason"] == "finished" and solved["reward"] == 1.0
    info = solved["reward_info"]
    assert info["reward_file"] == "reward.txt" and info["rewards"] == {"reward": 1.0}
    status, results = run(tmp_path / "b", state, GOOD / "hello-file", "echo bye > hello.txt")
    assert results[0]["reward"] == 0.0 and not results[0]["traj_masked"]


def secret_task(tmp_path: Path, value: str) -> Path:
    """hello-file whose verifier expects the greeting from this process's environment."""
    task = tmp_path / "tasks" / "secret-hello"
    shutil.copytree(GOOD / "hello-file", task)
    toml = task / "task.toml"
    toml.write_text(toml.read_text().replace('EXPECTED = "hello"', f'EXPECTED = "{value}"'))
    return task


def test_a_variable_the_environment_lacks_is_a_bad_row_with_its_key(tmp_path, monkeypatch):
    monkeypatch.delenv("UNIAGENT_TEST_GREETING", raising=False)
    task = secret_task(tmp_path, "${UNIAGENT_TEST_GREETING}")
    tasks, bad = load_harbor_tasks(task, BWRAP)
    assert not tasks
    assert [b.reason for b in bad] == [
        "secret-hello: verifier.env.EXPECTED: ${UNIAGENT_TEST_GREETING} is not set"
    ]
    with_default = secret_task(tmp_path / "b", "${UNIAGENT_TEST_GREETING:-hello}")
    assert len(load_harbor_tasks(with_default, BWRAP)[0]) == 1


def test_a_variable_reaches_the_verifier_and_no_file_of_the_run(
    tools, tmp_path, state, monkeypatch
) -> None:
    greeting = "hello-from-a-secret-4711"
    monkeypatch.setenv("UNIAGENT_TEST_GREETING", greeting)
    task = secret_task(tmp_path, "${UNIAGENT_TEST_GREETING}")
    status, results = run(tmp_path / "run", state, task, f"echo {greeting} > hello.txt")
    assert status == 0 and results[0]["reward"] == 1.0, results
    written = [p for p in (tmp_path / "run").rglob("*") if p.is_file()]
    assert written and not [
        p
        for p in written
        if greeting.encode() in p.read_bytes()
        and p.name not in ("log.txt", "messages.json", "rollout.json")
    ]


def test_tasks_with_the_same_overrides_resolve_the_config_once(
    tools, tmp_path, state, caplog
) -> None:
    folder = tmp_path / "tasks"
    for n in range(3):  # three tasks, one environment: the same overrides
        shutil.copytree(GOOD / "hello-file", folder / f"hello-{n}")
    caplog.set_level(logging.DEBUG, logger="uniagent.resolver")
    status, results = run(tmp_path / "run", state, folder, "echo hello > hello.txt")
    assert status == 0 and [r["reward"] for r in results] == [1.0] * 3
    resolved = [r.getMessage() for r in caplog.records if r.name == "uniagent.resolver"]
    assert len([m for m in resolved if not m.endswith("(overrides)")]) == 1, resolved
    assert len([m for m in resolved if m.endswith("(overrides)")]) == 1, resolved


def test_a_separate_verifier_sees_the_artifacts_and_nothing_else_of_the_agent(
    tools, tmp_path, state
) -> None:
    task = DATA / "separate" / "artifact-answer"
    write = "mkdir -p /logs/artifacts && echo {} > /logs/artifacts/answer.txt"
    _, [solved] = run(tmp_path / "a", state, task, write.format("hello"))
    assert solved["reward"] == 1.0, json.dumps(solved["reward_info"])
    assert solved["reward_info"]["artifacts"] == ["/logs/artifacts"]
    _, [wrong] = run(tmp_path / "b", state, task, write.format("bye"))
    assert wrong["reward"] == 0.0 and not wrong["traj_masked"]
    # What the agent leaves in its own sandbox (here, its working directory) is not there.
    _, [leaked] = run(tmp_path / "c", state, task, write.format("hello") + " && touch leak.txt")
    assert leaked["reward"] == 1.0, "the verifier saw the agent's working directory"
    # A link to the verifier's own expected answer is left out, not followed.
    link = "ln -s ../../tests/expected.txt /logs/artifacts/answer.txt"
    _, [linked] = run(tmp_path / "d", state, task, link)
    assert linked["reward"] == 0.0 and not linked["traj_masked"]
    # The leak check can fail: the same task with the verifier in the agent's sandbox.
    shared = tmp_path / "data" / "artifact-answer"
    shutil.copytree(task, shared)
    toml = shared / "task.toml"
    toml.write_text(toml.read_text().replace('"separate"', '"shared"'))
    _, [seen] = run(tmp_path / "f", state, shared, write.format("hello") + " && touch leak.txt")
    assert seen["reward"] == 0.0
    # Its oracle scores 1 and its no-op baseline 0.
    (tmp_path / "e").mkdir()
    status, found = verify(tmp_path / "e", state, task)
    assert status == 0 and found["artifact-answer"]["oracle"] == [1.0], found
    assert found["artifact-answer"]["baseline"] == [0.0]


def test_a_separate_verifier_broken_by_an_artifact_is_the_agents_and_broken_for_all_masked(
    tools, tmp_path, state
) -> None:
    task = DATA / "separate-crash" / "crash-on-word"
    _, [crashed] = run(tmp_path / "a", state, task, "echo crash > /logs/artifacts/answer.txt")
    info = crashed["reward_info"]
    assert crashed["reward"] == 0.0 and not crashed["traj_masked"], info
    assert info["score_reason"] == "verifier_failed" and info["control"]["score"] == 0.0
    assert "without them" in info["detail"]
    # The same verifier crashing on everything: the task's fault, masked.
    broken = tmp_path / "data" / "crash-on-word"
    shutil.copytree(task, broken)
    (broken / "tests" / "test.sh").write_text("#!/bin/bash\nexit 3\n")
    _, [masked] = run(tmp_path / "b", state, broken, "echo hello > /logs/artifacts/answer.txt")
    assert masked["traj_masked"] and masked["exit_reason"] == "reward_error", masked
    assert "without them" in masked["error"]


def test_artifacts_are_unpacked_below_their_paths_as_files_and_directories_only(tmp_path):
    import io
    import tarfile

    from uniagent.harbor.reward import ArtifactsError, unpack_artifacts

    def archive(*members: tuple[str, bytes | str | None]) -> bytes:
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w") as tar:
            for name, what in members:
                info = tarfile.TarInfo(name)
                if isinstance(what, bytes):
                    info.size, info.mode = len(what), 0o4755  # set-uid: cleared
                    tar.addfile(info, io.BytesIO(what))
                elif what is None:
                    info.type = tarfile.DIRTYPE
                    tar.addfile(info)
                elif what.startswith("fifo"):
                    info.type = tarfile.FIFOTYPE
                    tar.addfile(info)
                else:
                    info.type = tarfile.LNKTYPE if what.startswith("hard:") else tarfile.SYMTYPE
                    info.linkname = what.removeprefix("hard:")
                    tar.addfile(info)
        return out.getvalue()

    data = archive(
        ("logs/artifacts", None),
        ("logs/artifacts/answer.txt", b"hello\n"),
        ("logs/artifacts/link", "../../tests/expected.txt"),  # a link: never
        ("logs/artifacts/hard", "hard:logs/artifacts/answer.txt"),
        ("logs/artifacts/pipe", "fifo"),
        ("tests/test.sh", b"echo 1 > /logs/verifier/reward.txt"),  # outside the paths
        ("app/result.txt/../../usr/bin/x", b"x"),
        ("app/result.txt", b"hello\n"),
    )
    unpack_artifacts(data, ["logs/artifacts", "app/result.txt"], tmp_path)
    found = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    assert found == ["app", "app/result.txt", "logs", "logs/artifacts",
                     "logs/artifacts/answer.txt"]  # fmt: skip
    assert not (tmp_path / "logs/artifacts/answer.txt").stat().st_mode & 0o4000
    big = archive(("logs/artifacts/a", b"x" * 600), ("logs/artifacts/b", b"x" * 600))
    with pytest.raises(ArtifactsError, match="more than 1000 bytes"):
        unpack_artifacts(big, ["logs/artifacts"], tmp_path / "big", limit=1000)
    with pytest.raises(ArtifactsError, match="do not unpack"):
        unpack_artifacts(b"not a tar" * 100, ["logs/artifacts"], tmp_path / "bad")


def with_agent_timeout(tmp_path: Path, seconds: float) -> Path:
    """hello-file with ``[agent] timeout_sec = seconds``."""
    task = tmp_path / "data" / "hello-file"
    shutil.copytree(GOOD / "hello-file", task)
    toml = task / "task.toml"
    text = toml.read_text()
    assert "[agent]\ntimeout_sec = 300.0" in text
    toml.write_text(
        text.replace("[agent]\ntimeout_sec = 300.0", f"[agent]\ntimeout_sec = {seconds}")
    )
    return task


def test_the_agent_timeout_ends_the_built_in_loop_on_its_commands_time(tools, tmp_path, state):
    """[agent] timeout_sec: a command that outlasts it ends the episode (the policy's
    timeout, trained on and graded), though the command's own time-out is longer."""
    task = with_agent_timeout(tmp_path, 2.0)
    _, [result] = run(tmp_path, state, task, "sleep 60; echo hello > hello.txt")
    assert result["exit_reason"] == "timeout_error" and not result["traj_masked"]
    assert result["reward"] == 0.0
    assert result["metrics"]["env_seconds"] < 60


def test_the_agent_timeout_does_not_count_the_time_waiting_for_the_model(tools, tmp_path, state):
    """A model slower than the task's whole time limit: the agent's commands are quick, so
    it finishes and scores (the model's time is infrastructure's, not the policy's)."""
    import time

    task = with_agent_timeout(tmp_path, 10.0)  # ample for two quick commands, loaded or not
    quick = agent_running("echo hello > hello.txt")

    def slow(body: dict[str, Any]) -> Reply:
        time.sleep(11)  # a loaded model server: longer than the agent's whole limit
        return quick(body)

    out = tmp_path / "out"
    with ScriptedChatServer(default=slow) as server:
        cli([
            "run", str(write_config(tmp_path, state)), "--data", str(task), "--out", str(out),
            "--model", f"openai:{server.base_url}#scripted",
        ])  # fmt: skip
    [result] = map(json.loads, (out / "results.jsonl").read_text().splitlines())
    assert result["exit_reason"] == "finished" and result["reward"] == 1.0, result


def test_named_rewards_are_recorded_and_one_chosen(tools, tmp_path, state) -> None:
    data = GOOD / "named-rewards"
    _, [mean] = run(tmp_path, state, data, "echo hi > greeting.txt")
    assert mean["reward"] == 0.5
    assert mean["reward_info"]["rewards"] == {"greeting": 1.0, "farewell": 0.0}
    assert mean["reward_info"]["reward_file"] == "reward.json"
    reward = {"name": "harbor", "settings": {"reward_key": "farewell"}}
    _, [picked] = run(tmp_path / "b", state, data, "echo hi > greeting.txt", reward=reward)
    assert picked["reward"] == 0.0 and picked["reward_info"]["reward_key"] == "farewell"


def test_a_verifier_timeout_caused_by_the_agent_scores_0(tools, tmp_path, state) -> None:
    never = "printf '#!/bin/sh\\nsleep 100000\\n' > run.sh && chmod +x run.sh"
    _, [result] = run(tmp_path, state, GOOD / "verifier-timeout", never)
    assert result["exit_reason"] == "finished" and not result["traj_masked"]
    assert result["reward"] == 0.0
    assert result["reward_info"]["score_reason"] == "verifier_timed_out"
    assert result["reward_info"]["verifier_timeout"] == 10.0


def test_a_verifier_that_crashes_once_is_run_again_in_the_same_sandbox(tools, tmp_path, state):
    """A transient crash: the second run, in the grading sandbox, scores (the episode is
    not retried; the first failure is recorded)."""
    data = DATA / "crash" / "crash-once"
    status, results = run(tmp_path, state, data, "echo hello > hello.txt", "--retries", "1")
    assert status == 0
    [result] = results
    assert result["attempt"] == 1 and not result.get("previous_attempts")
    assert result["exit_reason"] == "finished" and result["reward"] == 1.0
    info = result["reward_info"]
    assert "the verifier crashed: test.sh exited 3" in info["verifier_retried"]
    assert "control" not in info and (state / "crash-once").read_text().strip() == "2"


def test_an_agent_that_kills_the_verifier_scores_0_and_is_trained_on(tools, tmp_path, state):
    """The tested code kills test.sh before it writes a reward, in both runs; on the task
    untouched by the agent (the control sandbox) the verifier works: the agent's doing."""
    # (SIGTERM: the grading sandbox reads a death by SIGKILL as its timeout, also scored 0)
    kill = "printf '#!/bin/sh\\nkill $PPID\\n' > run.sh && chmod +x run.sh"
    _, [result] = run(tmp_path, state, DATA / "crash" / "runs-program", kill, "--retries", "0")
    assert result["exit_reason"] == "finished" and not result["traj_masked"]
    assert result["reward"] == 0.0
    info = result["reward_info"]
    assert info["score_reason"] == "verifier_failed"
    assert info["error"].count("the verifier crashed: test.sh exited 143") == 2
    assert info["control"] == {
        "exit_code": 0, "timed_out": False, "reward_file": "reward.txt", "score": 0.0
    }  # fmt: skip
    # The same task solved scores 1 (the crash above was the agent's program).
    solve = "printf '#!/bin/sh\\necho ok\\n' > run.sh && chmod +x run.sh"
    _, [solved] = run(tmp_path / "b", state, DATA / "crash" / "runs-program", solve)
    assert solved["reward"] == 1.0 and "verifier_retried" not in solved["reward_info"]


def test_an_agent_that_writes_garbage_as_the_reward_scores_0(tools, tmp_path, state) -> None:
    """The tested code overwrites reward.txt with what is not a number (both runs)."""
    garbage = (
        "printf '#!/bin/sh\\necho garbage > /logs/verifier/reward.txt\\n' > run.sh && "
        "chmod +x run.sh"
    )
    _, [result] = run(tmp_path, state, GOOD / "verifier-timeout", garbage, "--retries", "0")
    assert result["exit_reason"] == "finished" and not result["traj_masked"]
    assert result["reward"] == 0.0
    info = result["reward_info"]
    assert info["score_reason"] == "verifier_failed"
    assert "reward.txt is not a number: 'garbage" in info["error"]
    assert info["control"]["score"] == 0.0


def test_a_verifier_broken_for_everyone_is_masked(tools, tmp_path, state) -> None:
    """It crashes on the agent's work, again, and on the untouched task: infrastructure."""
    data = DATA / "crash" / "broken-verifier"
    _, [result] = run(tmp_path, state, data, "echo hello > hello.txt", "--retries", "0")
    assert result["exit_reason"] == "reward_error" and result["traj_masked"]
    assert "the task's verifier is broken" in result["error"]
    assert result["error"].count("test.sh exited 3") == 3


def test_editing_the_verifiers_inputs_is_tampering(tools, tmp_path, state) -> None:
    plant = (
        # (on the host backend the two are symlinks into the sandbox's /tmp)
        'mkdir -p "$(readlink -m /logs/verifier)" "$(readlink -m /tests)" && '
        "echo 1 > /logs/verifier/reward.txt && "
        "printf 'echo 1 > /logs/verifier/reward.txt' > /tests/test.sh"
    )
    _, [result] = run(tmp_path, state, GOOD / "hello-file", plant)
    assert result["reward"] == 0.0 and not result["traj_masked"]
    info = result["reward_info"]
    assert info["score_reason"] == "tampered"
    assert {t["path"] for t in info["tampered"]} == {
        "/tmp/.harbor/logs/verifier/reward.txt", "/tmp/.harbor/tests/test.sh"
    }  # fmt: skip


def test_a_verifier_user_the_sandbox_cannot_switch_to_is_infrastructure(
    tools, tmp_path, state
) -> None:
    """Under bubblewrap only root is mapped: a task whose verifier runs as `nobody` cannot
    be graded there (reward_error, masked), rather than graded as the wrong user."""
    _, [result] = run(tmp_path, state, DATA / "user", "echo hello > hello.txt", "--retries", "0")
    assert result["exit_reason"] == "reward_error" and result["traj_masked"]
    assert "[verifier] user: cannot run as user nobody here" in result["error"]


def test_a_symlink_loop_where_the_tests_go_is_the_agents_not_infrastructure(
    tools, tmp_path, state
) -> None:
    loop = "mkdir -p /tmp/.harbor && ln -s /tmp/.harbor/tests /tmp/.harbor/tests"
    _, [result] = run(tmp_path, state, GOOD / "hello-file", loop, "--retries", "0")
    assert result["exit_reason"] == "finished" and not result["traj_masked"]
    assert result["reward"] == 0.0
    assert result["reward_info"]["score_reason"] == "tampered"


def host_good(tmp_path: Path) -> Path:
    """The good tasks that run on the host (not the one in a prebuilt image)."""
    data = tmp_path / "good"
    for task in ("hello-file", "named-rewards", "verifier-timeout"):
        shutil.copytree(GOOD / task, data / task)
    return data


def test_data_prepare_reads_harbor_folders(tools, tmp_path, state) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    out = tmp_path / "train.parquet"
    config = write_config(tmp_path, state)
    good = host_good(tmp_path)
    assert cli(["data", "prepare", str(good), "--out", str(out), "--config", str(config)]) == 0
    rows = pq.read_table(out).to_pylist()
    assert [r["extra_info"]["task_id"] for r in rows][:2] == ["hello-file", "named-rewards"]
    assert rows[0]["prompt"][-1]["content"].startswith("Write the word `hello`")
    assert "--symlink" in rows[0]["extra_info"]["tools_kwargs"]


def mixed_folder(tmp_path: Path) -> Path:
    """A task set of one sound task and one that cannot run (task-declared MCP servers)."""
    data = tmp_path / "mixed"
    shutil.copytree(GOOD / "hello-file", data / "hello-file")
    shutil.copytree(DATA / "unsupported" / "mcp-server", data / "mcp-server")
    return data


def test_data_prepare_names_the_task_folders_it_skips_and_exits_2(
    tools, tmp_path, state, capsys
) -> None:
    """As ``uniagent run`` and ``uniagent verify`` do over the same folder: the sound tasks
    are written, the broken ones named, and the status says the set is not whole."""
    pq = pytest.importorskip("pyarrow.parquet")
    out = tmp_path / "train.parquet"
    config = write_config(tmp_path, state)
    data = mixed_folder(tmp_path)
    assert cli(["data", "prepare", str(data), "--out", str(out), "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert "mcp-server: environment.mcp_servers" in err and "hello-file" not in err
    assert [r["extra_info"]["task_id"] for r in pq.read_table(out).to_pylist()] == ["hello-file"]


# -- uniagent verify ------------------------------------------------------------------------


def verify(tmp_path: Path, state: Path, data: Path, *args: str) -> tuple[int, dict[str, Any]]:
    config = write_config(tmp_path, state)
    return verify_with(tmp_path / "verify", config, data, "--concurrency", "4", *args)


def test_every_oracle_scores_1_and_every_baseline_0(tools, tmp_path, state) -> None:
    status, found = verify(tmp_path, state, host_good(tmp_path))
    assert status == 0
    assert {t: (r["status"], r["oracle"], r["baseline"]) for t, r in found.items()} == {
        t: ("ok", [1.0], [0.0]) for t in ("hello-file", "named-rewards", "verifier-timeout")
    }
    assert read_exclude(tmp_path / "verify" / "exclude.txt") == frozenset()


def test_verify_classes_a_verifier_that_always_crashes_as_a_broken_oracle(tools, tmp_path, state):
    status, found = verify(tmp_path, state, DATA / "crash")
    assert status == 1
    assert {t: r["status"] for t, r in found.items()} == {
        "broken-verifier": "broken_oracle", "crash-once": "ok", "runs-program": "ok"
    }  # fmt: skip
    assert "the task's verifier is broken" in found["broken-verifier"]["attempts"][0]["error"]


def test_verify_finds_broken_and_flaky_tasks_and_run_excludes_them(tools, tmp_path, state):
    status, found = verify(tmp_path, state, DATA / "broken", "-k", "2")
    assert status == 1
    assert {t: r["status"] for t, r in found.items()} == {
        "broken-oracle": "broken_oracle",
        "passing-baseline": "passing_baseline",
        "flaky": "flaky",
        "sound": "ok",
    }
    assert found["flaky"]["oracle"] == [1.0, 0.0]
    exclude = tmp_path / "verify" / "exclude.txt"
    assert read_exclude(exclude) == {"broken-oracle", "passing-baseline", "flaky"}
    _, results = run(tmp_path / "run", state, DATA / "broken", "echo hello > hello.txt",
                     "--exclude", str(exclude))  # fmt: skip
    assert [(r["task_id"], r["reward"]) for r in results] == [("sound", 1.0)]


def test_verify_counts_the_task_folders_it_skipped_in_its_summary(
    tools, tmp_path, state, capsys
) -> None:
    status, found = verify(tmp_path, state, mixed_folder(tmp_path))
    out = capsys.readouterr().out
    assert status == 2 and set(found) == {"hello-file"}
    assert "2 tasks: 1 ok, 1 skipped" in out
    assert "skipped: mcp-server: environment.mcp_servers" in out
    summary = json.loads((tmp_path / "verify" / "summary.json").read_text())
    assert summary["statuses"] == {"ok": 1, "skipped": 1}
    assert "mcp-server" in summary["skipped_rows"][0]["reason"]


EXCLUDED = ["named-rewards", "prebuilt-image", "verifier-timeout"]


def exclude_file(tmp_path: Path) -> Path:
    """Three tasks of ``good``, and an id of no task there (a typo)."""
    return write_lines(tmp_path / "skip.txt", [*EXCLUDED, "helo-file  # a typo"])


def test_run_records_what_exclude_skipped_and_warns_of_ids_of_no_task(
    tools, tmp_path, state, capsys
) -> None:
    exclude = exclude_file(tmp_path)
    status, results = run(
        tmp_path, state, GOOD, "echo hello > hello.txt", "--exclude", str(exclude)
    )
    printed = capsys.readouterr()
    assert status == 0 and [r["task_id"] for r in results] == ["hello-file"]
    record = {"file": str(exclude), "tasks": EXCLUDED, "unmatched": ["helo-file"]}
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["exclude"] == record
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["excluded"] == record
    assert f"excluded by {exclude}: 3 tasks" in printed.out
    assert "exclude ids that match no task: helo-file" in printed.out
    assert f"--exclude {exclude}: 1 id matches no task of the task set: helo-file" in printed.err


def test_verify_records_what_exclude_skipped_and_warns_of_ids_of_no_task(
    tools, tmp_path, state, capsys
) -> None:
    exclude = exclude_file(tmp_path)
    status, found = verify(tmp_path, state, GOOD, "--exclude", str(exclude))
    printed = capsys.readouterr()
    assert status == 0 and set(found) == {"hello-file"}
    summary = json.loads((tmp_path / "verify" / "summary.json").read_text())
    assert summary["excluded"] == {
        "file": str(exclude),
        "tasks": EXCLUDED,
        "unmatched": ["helo-file"],
    }
    assert f"excluded by {exclude}: 3 tasks" in printed.out
    assert f"--exclude {exclude}: 1 id matches no task of the task set: helo-file" in printed.err
    assert "exclude ids that match no task: helo-file" in printed.out


def test_an_excluded_task_folder_that_cannot_run_is_excluded_not_skipped(
    tools, tmp_path, state, capsys
) -> None:
    exclude = write_lines(tmp_path / "skip.txt", ["mcp-server"])
    status, found = verify(tmp_path, state, mixed_folder(tmp_path), "--exclude", str(exclude))
    assert status == 0 and set(found) == {"hello-file"}
    summary = json.loads((tmp_path / "verify" / "summary.json").read_text())
    assert summary["excluded"]["tasks"] == ["mcp-server"] and summary["skipped_rows"] == []


# -- the local backend (podman or docker) ------------------------------------------------------


@pytest.fixture(scope="module")
def engine() -> str:
    from uniagent.testing.images import engine_with_test_image

    return engine_with_test_image()


def local_config(tmp_path: Path, engine: str) -> Path:
    from uniagent.testing.images import TEST_IMAGE

    config = tmp_path / "local.yaml"
    deployment = {"type": "local", "image": TEST_IMAGE, "engine": engine, "pull": "never"}
    config.write_text(json.dumps({
        "tools": ["shell", "done"], "env": {"deployment": deployment},
        "reward": {"name": "harbor"}, "interaction": {"max_turns": 4},
    }))  # fmt: skip
    return config


@pytest.mark.slow
def test_tasks_run_in_their_own_images_on_the_local_backend(tools, tmp_path, engine) -> None:
    """The Dockerfile task is built (FROM mapped to the offline test image), once per
    content; the docker_image task runs in its prebuilt image; the workdir is the task's."""
    from uniagent.testing.images import TEST_IMAGE
    from uniagent.testing.images import run as run_command

    config = local_config(tmp_path, engine)
    skip = write_lines(tmp_path / "x.txt", ["named-rewards", "verifier-timeout"])
    tag = image_tag(GOOD / "hello-file", TEST_IMAGE)
    with ScriptedChatServer(default=agent_running("pwd > where && echo hello > hello.txt")) as s:
        status = cli([
            "run", str(config), "--data", str(GOOD), "--out", str(tmp_path / "out"),
            "--model", f"openai:{s.base_url}#scripted", "--from-image", TEST_IMAGE,
            "--exclude", str(skip),
        ])  # fmt: skip
    assert status == 0
    lines = (tmp_path / "out" / "results.jsonl").read_text().splitlines()
    rewards = {r["task_id"]: r["reward"] for r in map(json.loads, lines)}
    assert rewards == {"hello-file": 1.0, "prebuilt-image": 0.0}
    image = run_command([engine, "image", "inspect", "--format", "{{.Id}}", tag])
    assert image.returncode == 0, "the Dockerfile task's image is tagged by its content"
    status, found = verify_with(tmp_path / "v", config, GOOD, "--from-image", TEST_IMAGE)
    assert status == 0 and {r["status"] for r in found.values()} == {"ok"}
    again = run_command([engine, "image", "inspect", "--format", "{{.Id}}", tag])
    assert again.stdout == image.stdout, "the same environment is not built again"
    # In a container the verifier runs as its task's user.
    with ScriptedChatServer(default=agent_running("echo hello > hello.txt")) as s:
        status = cli([
            "run", str(config), "--data", str(DATA / "user"), "--out", str(tmp_path / "user"),
            "--model", f"openai:{s.base_url}#scripted", "--from-image", TEST_IMAGE,
        ])  # fmt: skip
    [user] = map(json.loads, (tmp_path / "user" / "results.jsonl").read_text().splitlines())
    assert user["reward"] == 1.0
    assert "verifier runs as nobody" in user["reward_info"]["output_tail"]


@pytest.mark.slow
def test_a_separate_verifier_runs_in_its_own_image_on_the_local_backend(
    tools, tmp_path, engine
) -> None:
    """tests/Dockerfile is built (the verifier's image: /verifier-image, the tests in it)
    and given the agent's /app/result.txt and /logs/artifacts; the other task's verifier
    runs in a new container of the task's own image."""
    from uniagent.testing.images import TEST_IMAGE

    config = local_config(tmp_path, engine)
    answer = "mkdir -p /logs/artifacts && echo hello > /logs/artifacts/answer.txt"
    both = f"echo hello > /app/result.txt && {answer}"
    with ScriptedChatServer(default=agent_running(f"{both} && touch leak.txt")) as s:
        status = cli([
            "run", str(config), "--data", str(DATA / "separate"), "--out", str(tmp_path / "out"),
            "--model", f"openai:{s.base_url}#scripted", "--from-image", TEST_IMAGE,
        ])  # fmt: skip
    assert status == 0
    lines = (tmp_path / "out" / "results.jsonl").read_text().splitlines()
    results = {r["task_id"]: r for r in map(json.loads, lines)}
    assert {t: r["reward"] for t, r in results.items()} == {
        "artifact-answer": 1.0, "verifier-image": 1.0
    }, {t: r["reward_info"] for t, r in results.items()}  # fmt: skip
    image = results["verifier-image"]["reward_info"]["artifacts"]
    assert image == ["/logs/artifacts", "/app/result.txt"]
    status, found = verify_with(
        tmp_path / "v", config, DATA / "separate", "--from-image", TEST_IMAGE
    )
    assert status == 0 and {r["status"] for r in found.values()} == {"ok"}, found


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(f"{line}\n" for line in lines))
    return path


def verify_with(out: Path, config: Path, data: Path, *args: str) -> tuple[int, dict[str, Any]]:
    status = cli(["verify", str(config), "--data", str(data), "--out", str(out), *args])
    lines = (out / "verify.jsonl").read_text().splitlines()
    return status, {r["task_id"]: r for r in map(json.loads, lines)}


GOLD = """\
diff --git a/fixed.txt b/fixed.txt
new file mode 100644
--- /dev/null
+++ b/fixed.txt
@@ -0,0 +1 @@
+fixed
"""


def test_verify_applies_a_rows_gold_patch_as_its_oracle(tools, tmp_path) -> None:
    """A SWE-bench-style row: its gold ``patch`` is the oracle (applied, submitted)."""
    rows = [
        {"id": "gold", "problem_statement": "fix it", "patch": GOLD,
         "test_command": "grep -qx fixed fixed.txt"},
        {"id": "no-patch", "problem_statement": "fix it", "test_command": "true"},
    ]  # fmt: skip
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = tmp_path / "rows.yaml"
    setup = "git init -q . && git -c user.name=t -c user.email=t@t commit -q --allow-empty -m base"
    config.write_text(json.dumps({
        "tools": ["shell", "done"],
        "env": {"deployment": BWRAP, "post_setup": [setup]},
        "reward": {"name": "command"},
    }))  # fmt: skip
    status, found = verify_with(tmp_path / "v", config, data, "-k", "2")
    assert found["gold"]["status"] == "ok"
    assert found["gold"]["oracle"] == [1.0, 1.0] and found["gold"]["baseline"] == [0.0, 0.0]
    # No oracle, and a test that passes whatever: the baseline passes.
    assert found["no-patch"]["status"] == "passing_baseline"
    assert status == 1


def test_rows_without_the_field_the_reward_needs_stop_run_and_verify_before_any_episode(
    tools, tmp_path, capsys
) -> None:
    """The ``command`` reward reads each row's ``test_command``: rows without one are named
    (ids and field) and nothing starts, instead of episodes whose grading fails as
    infrastructure, retried and left for the next run to fail again."""
    rows = [
        {"id": "has-test", "problem_statement": "fix it", "test_command": "true"},
        {"id": "no-test-1", "problem_statement": "fix it"},
        {"id": "no-test-2", "problem_statement": "fix it", "test_command": ""},
    ]
    data = write_lines(tmp_path / "rows.jsonl", [json.dumps(r) for r in rows])
    config = tmp_path / "rows.yaml"
    config.write_text(json.dumps({
        "tools": ["shell", "done"], "env": {"deployment": BWRAP}, "reward": {"name": "command"},
    }))  # fmt: skip
    with ScriptedChatServer(default=agent_running("true")) as server:
        status = cli([
            "run", str(config), "--data", str(data), "--out", str(tmp_path / "out"),
            "--model", f"openai:{server.base_url}#scripted",
        ])  # fmt: skip
        assert server.requests == [], "no episode started"
    error = capsys.readouterr().err
    assert status == 2, error
    assert "'test_command'" in error and "no-test-1, no-test-2" in error
    assert "has-test" not in error and "reward.settings" in error
    assert not (tmp_path / "out" / "results.jsonl").exists()
    status = cli(["verify", str(config), "--data", str(data), "--out", str(tmp_path / "v")])
    error = capsys.readouterr().err
    assert status == 2 and "'test_command'" in error and "no-test-1, no-test-2" in error
    assert not (tmp_path / "v" / "verify.jsonl").exists()
    # The reward's own command needs no field of the rows.
    config.write_text(json.dumps({
        "tools": ["shell", "done"], "env": {"deployment": BWRAP},
        "reward": {"name": "command", "settings": {"command": "true"}},
    }))  # fmt: skip
    status, found = verify_with(tmp_path / "v2", config, data)
    assert set(found) == {"has-test", "no-test-1", "no-test-2"}


def test_the_example_config_reads() -> None:
    from uniagent.config import AgentConfig

    example = Path(__file__).parents[2] / "examples" / "harbor" / "config.yaml"
    config = AgentConfig.from_yaml(example)
    assert config.reward is not None and config.reward.name == "harbor"
    assert config.env.deployment["type"] == "local"


# -- the grader without a control sandbox ------------------------------------------------------


async def test_without_a_control_sandbox_a_failing_verifier_is_masked_and_says_so(tools) -> None:
    """A grader that cannot start a sandbox (``prepare_grader`` without ``fresh_env``):
    the failure cannot be judged, so it is masked, and the message names the opening."""
    from uniagent import open_env
    from uniagent.testing.grading import grade, prepare_grader

    [task], _ = load_harbor_tasks(DATA / "crash" / "runs-program", BWRAP)
    settings = dict(task.overrides()["env"])
    env = open_env({**BWRAP, **settings.pop("deployment")}, settings)  # as the run merges them
    await env.start()
    try:
        grader = await prepare_grader(env, "harbor", task.row)
        done = await env.run_action(
            "printf '#!/bin/sh\\nkill $PPID\\n' > run.sh && chmod +x run.sh", timeout=30
        )
        assert done.exit_code == 0, done.output
        with pytest.raises(RewardInfraError, match="no control sandbox") as raised:
            await grade(grader, env)
    finally:
        await env.close()
    assert "an opening" in str(raised.value)
    assert str(raised.value).count("test.sh exited 143") == 2


async def test_artifacts_the_verifiers_sandbox_cannot_take_are_judged_as_its_failure(tmp_path):
    """A file of the agent's where the verifier's sandbox has a directory: putting it there
    fails on what the agent made, so it is a failure of the verifier on the artifacts (run
    again in a new sandbox, then without them: a reward there makes it the agent's), never
    infrastructure by itself."""
    from uniagent import open_env
    from uniagent.grading.sandbox import GradingSandbox
    from uniagent.harbor.reward import (
        ArtifactsNotPlaced,
        VerifierFailed,
        place_artifacts,
    )

    staged = tmp_path / "staged"
    (staged / "tmp" / "out").mkdir(parents=True)
    (staged / "tmp" / "out" / "answer.txt").write_text("hello\n")
    setup = "mkdir -p /tmp/out/answer.txt/inner && touch /tmp/out/answer.txt/inner/x"
    for verifier_has, placed in ((setup, False), ("true", True)):
        env = open_env(BWRAP, {"post_setup": [verifier_has]})
        await env.start()
        try:
            sandbox = await GradingSandbox.open(env, {"PATH": "/usr/bin:/bin"}, workdir=None)
            if placed:
                await place_artifacts(sandbox, staged, ["/tmp/out"])
                done = await sandbox.run("cat /tmp/out/answer.txt", timeout=30, cwd="/")
                assert done.output == "hello\n"
            else:
                with pytest.raises(ArtifactsNotPlaced) as failed:
                    await place_artifacts(sandbox, staged, ["/tmp/out"])
                assert isinstance(failed.value, VerifierFailed)
                assert "could not be put in the verifier's sandbox" in str(failed.value)
            await sandbox.close()
        finally:
            await env.close()
