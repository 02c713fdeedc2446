"""``uniagent run`` on the ``local`` backend (podman here): signals close every container,
and the containers of a killed run carry its id and are removed by ``uniagent clean``.

The image is the one the core's local-backend tests build offline
(``localhost/uniagent-swerex:bookworm-node``: debootstrap, swe-rex, Python and node); where
no engine works, the tests are skipped and the reason printed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from uniagent.testing.chat_server import Gate, Reply, ScriptedChatServer, tool_call
from uniagent.testing.images import TEST_IMAGE, engine_with_test_image, run

IMAGE = TEST_IMAGE

#: One pytest-xdist worker runs these with the other machine-wide tests (test_reward_integrity):
#: ``uniagent clean`` and every local-backend run remove the containers of dead runs.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("machine-wide")]


@pytest.fixture(scope="module")
def engine() -> str:
    return engine_with_test_image(IMAGE)


@pytest.fixture
def workspace(tmp_path: Path, engine: str) -> Path:
    config = tmp_path / "config.yaml"
    config.write_text(
        "tools: [execute_bash, submit]\n"
        "instance_template: '{problem_statement}'\n"
        "env:\n"
        f"  deployment: {{type: local, image: '{IMAGE}', engine: {engine}, pull: never}}\n"
    )
    rows = [{"instance_id": f"c{i}", "problem_statement": f"say hello {i}"} for i in range(4)]
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tmp_path


def held_policy(gate: Gate):
    """Run one command in the container, then hold the episode on its next request."""

    def reply(body: dict) -> Reply:
        if not any(m["role"] == "tool" for m in body["messages"]):
            return Reply("", tool_calls=[tool_call("execute_bash", {"command": "echo hi"})])
        gate.hold()
        return Reply("", tool_calls=[tool_call("submit", {}, "call_submit")])

    return reply


def containers(engine: str, run_id: str) -> list[str]:
    listed = run([engine, "ps", "-a", "-q", "--filter", f"label=uniagent.run={run_id}"])
    return listed.stdout.split()


def start_run(workspace: Path, server: ScriptedChatServer) -> subprocess.Popen:
    command = [
        sys.executable, "-m", "uniagent.cli", "run", str(workspace / "config.yaml"),
        "--data", str(workspace / "tasks.jsonl"), "--model", f"openai:{server.base_url}#m",
        "--out", str(workspace / "out"), "--concurrency", "2",
    ]  # fmt: skip
    return subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "OPENAI_API_KEY": "test"},
    )  # fmt: skip


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "ctrl-c"])
def test_a_signal_closes_every_container(engine, workspace, how):
    gate = Gate()
    with ScriptedChatServer(default=held_policy(gate)) as server:
        proc = start_run(workspace, server)
        try:
            assert gate.wait_for(2), "two episodes are mid-turn in their containers"
            run_id = json.loads((workspace / "out" / "manifest.json").read_text())["run_id"]
            running = containers(engine, run_id)
            assert len(running) == 2, "each container carries the run's id"
            proc.send_signal(how)
            _, stderr = proc.communicate(timeout=300)
        finally:
            gate.release()
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 128 + how, stderr
    assert "Traceback" not in stderr
    assert stderr.strip().splitlines()[-1].startswith("uniagent: interrupted by")
    assert containers(engine, run_id) == [], "no container outlives the run"


def test_the_containers_of_a_killed_run_are_removed_by_uniagent_clean(engine, workspace):
    gate = Gate()
    with ScriptedChatServer(default=held_policy(gate)) as server:
        proc = start_run(workspace, server)
        try:
            assert gate.wait_for(2)
            run_id = json.loads((workspace / "out" / "manifest.json").read_text())["run_id"]
            proc.kill()
            proc.communicate(timeout=60)
        finally:
            gate.release()
    left = containers(engine, run_id)
    assert len(left) == 2, "a crash leaves its containers"
    names = run([engine, "ps", "-a", "--filter", f"label=uniagent.run={run_id}",
                 "--format", "{{.Names}}"]).stdout.split()  # fmt: skip
    assert all(name.startswith(f"uniagent-{run_id}-") for name in names)
    clean = subprocess.run(
        [sys.executable, "-m", "uniagent.cli", "clean", "--base-dir", str(workspace / "none")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert clean.returncode == 0, clean.stderr
    for name in names:
        assert f"removed {engine} container {name}" in clean.stdout
    assert containers(engine, run_id) == []


def test_swe_bench_verified_recipe_stops_at_once_when_the_images_are_missing(engine, tmp_path):
    """The recipe on real Verified rows: uniagent loads every task and starts each one's own
    image; none can be pulled here, so the circuit breaker stops the run after the first
    three, naming the cause, and nothing more starts."""
    from uniagent.testing import swe_bench_verified_rows

    rows = tmp_path / "verified.jsonl"
    rows.write_text("".join(json.dumps(r) + "\n" for r in swe_bench_verified_rows(tmp_path)))
    tasks = tmp_path / "tasks.jsonl"
    made = subprocess.run(
        [sys.executable, "-m", "uniagent_reward_swebench.tasks", str(rows), str(tasks),
         "--namespace", "docker.io/swebench"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    root = Path(__file__).resolve().parents[1]
    config = tmp_path / "config.yaml"
    recipe = (root / "examples" / "swe_bench_verified" / "config.yaml").read_text()
    local = f"    type: local\n    engine: {engine}\n"
    config.write_text(recipe.replace("    type: local\n", local))
    with ScriptedChatServer(default=lambda body: Reply("")) as server:
        proc = subprocess.run(
            [sys.executable, "-m", "uniagent.cli", "run", str(config), "--data", str(tasks),
             "--model", f"openai:{server.base_url}#m", "--out", str(tmp_path / "out"),
             "--concurrency", "1", "--retries", "0"],
            capture_output=True, text=True, timeout=600,
            env={**os.environ, "OPENAI_API_KEY": "test"},
        )  # fmt: skip
        assert server.requests == []
    assert proc.returncode == 1, proc.stderr
    assert "skipping" not in proc.stderr, "every row is a task uniagent accepts"
    stop = proc.stderr.strip().splitlines()[-1]
    assert stop.startswith("uniagent: stopped: the first 3 episodes all failed with env_error")
    assert "docker.io/swebench/sweb.eval.x86_64." in stop
    started = [json.loads(line)["task_id"] for line in (tmp_path / "out" / "results.jsonl")
               .read_text().splitlines()]  # fmt: skip
    expected = [json.loads(line)["instance_id"] for line in tasks.read_text().splitlines()][:3]
    assert started == expected
