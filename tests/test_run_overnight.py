"""``uniagent run`` left running overnight: keys, retries, the breaker, the manifest, the lock,
exit statuses, progress, one log per attempt, prepared files.

Every test drives the ``uniagent`` command line against a real HTTP chat server on
127.0.0.1 (:class:`ScriptedChatServer`) and real host sandboxes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_run import CONFIG, UNREACHABLE, env_for, policy, results, run_command, uniagent_run

from uniagent.testing.chat_server import Fail, Gate, ScriptedChatServer

KEY = "sk-test-3f9a1c7e5b2d"


def run_cli(*argv: str, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "uniagent.cli", *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )


def run(command: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)


def no_key(tmp: Path) -> dict[str, str]:
    env = env_for(tmp)
    env.pop("OPENAI_API_KEY", None)
    return env


def grep_tree(root: Path, needle: str) -> list[str]:
    """Files under ``root`` whose bytes contain ``needle``."""
    found = []
    for path in root.rglob("*"):
        if path.is_file() and needle.encode() in path.read_bytes():
            found.append(str(path))
    return found


def failing_for(task_hint: str, times: int, then=None):
    """A policy whose first ``times`` requests of the task containing ``task_hint`` fail."""
    seen = {"n": 0}
    inner = then or policy()

    def reply(body: dict):
        if task_hint in body["messages"][1]["content"]:
            seen["n"] += 1
            if seen["n"] <= times:
                return Fail(400, "scripted: the model backend is broken")
        return inner(body)

    return reply


# -- 1. API keys ------------------------------------------------------------------------------


def test_openai_api_key_is_sent_and_never_written(tasks, tmp_path, sandbox_tmp):
    out = tmp_path / "out"
    env = {**no_key(sandbox_tmp), "OPENAI_API_KEY": KEY}
    with ScriptedChatServer(default=policy(), api_key=KEY) as server:
        proc = run(uniagent_run(server, tasks, out, "--limit", "2", "-v"), env)
        headers = list(server.headers)
    assert proc.returncode == 0, proc.stderr
    assert headers and all(h["authorization"] == f"Bearer {KEY}" for h in headers)
    assert grep_tree(out, KEY) == [] and grep_tree(sandbox_tmp, KEY) == []
    assert KEY not in proc.stdout + proc.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["model"]["api_key_env"] == "OPENAI_API_KEY"


def test_api_key_env_names_another_variable(tasks, tmp_path, sandbox_tmp):
    out = tmp_path / "out"
    env = {**no_key(sandbox_tmp), "MY_ENDPOINT_KEY": KEY}
    with ScriptedChatServer(default=policy(), api_key=KEY) as server:
        proc = run(
            uniagent_run(server, tasks, out, "--limit", "1", "--api-key-env", "MY_ENDPOINT_KEY"),
            env,
        )
    assert proc.returncode == 0, proc.stderr
    assert grep_tree(out, KEY) == [] and KEY not in proc.stdout + proc.stderr
    assert json.loads((out / "manifest.json").read_text())["model"]["api_key_env"] == (
        "MY_ENDPOINT_KEY"
    )


@pytest.mark.parametrize(
    ("env_key", "extra", "message"),
    [
        ("wrong-key", (), "refused the API key (401"),
        (None, ("--api-key-env", "NOT_SET_ANYWHERE"), "NOT_SET_ANYWHERE is not set"),
    ],
    ids=["wrong-key", "unset-variable"],
)
def test_bad_credentials_stop_before_any_sandbox(
    tasks, tmp_path, sandbox_tmp, env_key, extra, message
):
    out = tmp_path / "out"
    env = no_key(sandbox_tmp)
    if env_key:
        env["OPENAI_API_KEY"] = env_key
    with ScriptedChatServer(default=policy(), api_key=KEY) as server:
        proc = run(uniagent_run(server, tasks, out, *extra), env)
        chat_requests = len(server.requests)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], proc.stderr
    assert chat_requests == 0 and not (out / "episodes").exists()
    assert not (out / "manifest.json").exists(), "a failed start records no run"


def test_endpoint_down_stops_before_any_sandbox(tasks, tmp_path, sandbox_tmp):
    out = tmp_path / "out"
    proc = run(run_command(CONFIG, tasks, UNREACHABLE, out), env_for(sandbox_tmp))
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot reach the model endpoint" in lines[0]
    assert not (out / "episodes").exists() and list(sandbox_tmp.iterdir()) == []


# -- 2. retries, resume of infrastructure failures, the circuit breaker ----------------------


def test_an_infrastructure_failure_is_retried_with_one_log_per_attempt(
    tasks, tmp_path, sandbox_tmp
):
    out = tmp_path / "out"
    with ScriptedChatServer(default=failing_for("celsius_to_fahrenheit", 1)) as server:
        proc = run(uniagent_run(server, tasks, out, "--retry-delay", "0"), env_for(sandbox_tmp))
    assert proc.returncode == 0, proc.stderr
    assert "fahrenheit#0: attempt 1 failed, model_error" in proc.stderr
    assert "retrying in 0 s (2 retries left)" in proc.stderr
    records = {r["task_id"]: r for r in results(out)}
    assert len(results(out)) == 6, "one line per pair: the failed attempt is not a result"
    fixed = records["fahrenheit"]
    assert (fixed["exit_reason"], fixed["reward"], fixed["attempt"]) == ("finished", 1.0, 2)
    assert fixed["previous_attempts"][0]["exit_reason"] == "model_error"
    directory = Path(fixed["episode_dir"])
    first, last = (directory / "attempt-1.log").read_text(), (directory / "log.txt").read_text()
    assert "model failed" in first and "finished: model_error" in first
    assert "finished: finished" in last and "model_error" not in last
    assert json.loads((out / "summary.json").read_text())["status"] == "complete"


def test_remaining_infrastructure_failures_exit_1_and_rerun_on_resume(tasks, tmp_path, sandbox_tmp):
    out = tmp_path / "out"
    command_args = ("--retries", "1", "--retry-delay", "0")
    behaviour = {"now": failing_for("celsius_to_fahrenheit", 99)}
    server = ScriptedChatServer(default=lambda body: behaviour["now"](body)).start()
    first = run(uniagent_run(server, tasks, out, *command_args), env_for(sandbox_tmp))
    assert first.returncode == 1, first.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "infrastructure_failures"
    assert summary["infrastructure_failures"] == 1
    assert "infrastructure failures: 1" in first.stdout
    failed = {r["task_id"]: r for r in results(out)}["fahrenheit"]
    assert (failed["exit_reason"], failed["outcome"], failed["attempt"]) == (
        "model_error", "infrastructure", 2,
    )  # fmt: skip

    behaviour["now"], before = policy(), len(server.requests)  # the endpoint is fixed
    try:
        kept = run(
            uniagent_run(server, tasks, out, "--keep-failures", *command_args),
            env_for(sandbox_tmp),
        )
        assert kept.returncode == 1, kept.stderr
        assert len(server.requests) == before, "kept failures are not run again"
        again = run(uniagent_run(server, tasks, out, *command_args), env_for(sandbox_tmp))
    finally:
        server.stop()
    assert again.returncode == 0, again.stderr
    assert "resuming: 5 of 6 episodes already finished; 1 infrastructure failures run again" in (
        again.stderr
    )
    latest = {r["task_id"]: r for r in results(out)}
    assert latest["fahrenheit"]["exit_reason"] == "finished"
    assert latest["fahrenheit"]["attempt"] == 3
    assert json.loads((out / "summary.json").read_text())["episodes"] == 6


def test_the_circuit_breaker_stops_a_run_whose_first_episodes_all_fail_alike(tmp_path, tasks):
    config = tmp_path / "broken.yaml"
    # A sandbox that cannot start, the same way every time (as a missing image would).
    config.write_text(
        CONFIG.read_text().replace("    type: host\n", "    type: host\n    bash: no-such-shell\n")
    )
    out = tmp_path / "out"
    sandboxes = tmp_path / "sandboxes"
    sandboxes.mkdir()
    with ScriptedChatServer(default=policy()) as server:
        proc = run(
            run_command(config, tasks, f"openai:{server.base_url}#m", out,
                        "--concurrency", "1", "--retries", "0"),
            env_for(sandboxes),
        )  # fmt: skip
        assert server.requests == [], "no episode reached the model"
    assert proc.returncode == 1, proc.stderr
    stop = proc.stderr.strip().splitlines()[-1]
    assert stop.startswith("uniagent: stopped: the first 3 episodes all failed with env_error")
    assert "'no-such-shell' is not on PATH" in stop
    started = sorted(p.name for p in (out / "episodes").iterdir())
    assert started == ["fahrenheit", "mean-empty", "palindrome-case"], "nothing more started"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "stopped" and summary["pending"] == 3
    assert list(sandboxes.glob("uniagent-*")) == []


# -- 3. the manifest and the lock ------------------------------------------------------------


def test_the_manifest_records_the_run_and_a_different_resume_is_refused(
    tasks, tmp_path, sandbox_tmp
):
    out = tmp_path / "out"
    with ScriptedChatServer(default=policy()) as server:
        first = run(uniagent_run(server, tasks, out, "--limit", "1"), env_for(sandbox_tmp))
        assert first.returncode == 0, first.stderr
        manifest = json.loads((out / "manifest.json").read_text())
        assert manifest["config"]["interaction"]["max_turns"] == 15
        assert manifest["model"]["spec"] == f"openai:{server.base_url}#scripted"
        assert manifest["versions"]["plugins"]["uniagent-tools-swe"]
        assert manifest["versions"]["uniagent"]
        assert len(manifest["tasks"]["sha256"]) == 64 and len(manifest["jobs"]) == 1

        changed = tmp_path / "changed.yaml"
        changed.write_text(CONFIG.read_text().replace("max_turns: 15", "max_turns: 3"))
        model = f"openai:{server.base_url}#scripted"
        refused = run(run_command(changed, tasks, model, out), env_for(sandbox_tmp))
        assert refused.returncode == 2
        assert "config.interaction.max_turns: 15 -> 3" in refused.stderr
        assert "--force-resume" in refused.stderr

        other_tasks = tmp_path / "tasks.jsonl"
        other_tasks.write_text("\n".join(tasks.read_text().splitlines()[:2]) + "\n")
        refused = run(run_command(CONFIG, other_tasks, model, out), env_for(sandbox_tmp))
        assert refused.returncode == 2 and "tasks.sha256" in refused.stderr

        other = f"openai:{server.base_url}#another-model"
        refused = run(run_command(CONFIG, tasks, other, out), env_for(sandbox_tmp))
        assert refused.returncode == 2 and "model.spec" in refused.stderr

        forced = run(
            run_command(changed, tasks, model, out, "--force-resume"), env_for(sandbox_tmp)
        )
    assert forced.returncode == 0, forced.stderr
    again = json.loads((out / "manifest.json").read_text())
    assert again["run_id"] == manifest["run_id"]
    assert again["config"]["interaction"]["max_turns"] == 3
    assert "config.interaction.max_turns: 15 -> 3" in again["changes"][0]["differences"]


def test_a_second_run_on_the_same_folder_is_refused(tasks, tmp_path, sandbox_tmp):
    out = tmp_path / "out"
    gate = Gate()
    with ScriptedChatServer(default=policy(gate)) as server:
        command = uniagent_run(server, tasks, out, "--concurrency", "2")
        first = subprocess.Popen(
            command, env=env_for(sandbox_tmp), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        try:
            assert gate.wait_for(1), "the first run reaches the model"
            second = run(command, env_for(sandbox_tmp))
        finally:
            gate.release()
            first.communicate(timeout=300)
    assert second.returncode == 2
    lines = second.stderr.strip().splitlines()
    assert len(lines) == 1 and "is in use by another `uniagent run` (pid " in lines[0]
    assert f"(pid {first.pid})" in lines[0]
    assert first.returncode == 0
    assert len(results(out)) == 6, "only the first run wrote results"


# -- 5. exit statuses, bad values, directory names --------------------------------------------


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (("--concurrency", "-1"), "argument --concurrency: must be at least 1, got -1"),
        (("--concurrency", "0"), "argument --concurrency: must be at least 1, got 0"),
        (("--concurrency", "many"), "argument --concurrency: 'many' is not a number"),
        (("--n", "0"), "argument --n: must be at least 1, got 0"),
        (("--retries", "-2"), "argument --retries: must be 0 or more, got -2"),
    ],
)
def test_bad_option_values_are_one_line(tasks, tmp_path, extra, message):
    command = run_command(CONFIG, tasks, UNREACHABLE, tmp_path / "out", *extra)
    proc = run(command, os.environ.copy())
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"uniagent run: error: {message} (see uniagent run --help)"
    ]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ("hf:/nonexistent", "model spec 'hf:/nonexistent': /nonexistent does not exist"),
        ("openai:127.0.0.1:8000#m", "the base URL must start with http(s)://"),
        ("llama:x", "unknown model kind 'llama'"),
    ],
)
def test_a_bad_model_is_one_line(tasks, tmp_path, model, message):
    proc = run(run_command(CONFIG, tasks, model, tmp_path / "out"), os.environ.copy())
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], proc.stderr


def test_task_ids_that_sanitise_alike_get_their_own_directories(tmp_path, tasks, sandbox_tmp):
    row = json.loads(tasks.read_text().splitlines()[0])
    data = tmp_path / "tasks.jsonl"
    ids = ["proj/issue-1", "proj_issue-1", "proj issue-1"]
    data.write_text("".join(json.dumps({**row, "instance_id": i}) + "\n" for i in ids))
    out = tmp_path / "out"
    with ScriptedChatServer(default=policy()) as server:
        proc = run(uniagent_run(server, data, out), env_for(sandbox_tmp))
    assert proc.returncode == 0, proc.stderr
    directories = {r["task_id"]: r["episode_dir"] for r in results(out)}
    assert len(set(directories.values())) == 3
    assert directories["proj_issue-1"].endswith("episodes/proj_issue-1/0")
    for task_id, directory in directories.items():
        assert json.loads((Path(directory) / "result.json").read_text())["task_id"] == task_id


# -- 6. progress ------------------------------------------------------------------------------


def test_plain_progress_names_failures_and_verbose_streams_episode_logs(
    tasks, tmp_path, sandbox_tmp
):
    out = tmp_path / "out"
    with ScriptedChatServer(default=failing_for("celsius_to_fahrenheit", 99)) as server:
        proc = run(
            uniagent_run(server, tasks, out, "--limit", "2", "--retries", "0", "-v"),
            env_for(sandbox_tmp),
        )
    assert proc.returncode == 1
    err = proc.stderr
    assert "mean-empty#0: finished, reward 1 (2 turns)" in err
    assert "fahrenheit#0: model_error: " in err and "scripted: the model backend is broken" in err
    assert "(infrastructure; attempt 1; run again to retry)" in err
    assert "mean-empty#0 | INFO task mean-empty sample 0: start" in err
    assert "fahrenheit#0 | ERROR model failed:" in err
    assert err.strip().splitlines()[-1].startswith("done 2/2  running 0  infra failures 1")


# -- 7. prepared files ------------------------------------------------------------------------


def test_data_prepare_output_runs_with_uniagent_run(tasks, tmp_path, sandbox_tmp):
    prepared = tmp_path / "train.parquet"
    made = run_cli("data", "prepare", str(tasks), "--out", str(prepared), "--config", str(CONFIG),
                   env=env_for(sandbox_tmp))  # fmt: skip
    assert made.returncode == 0, made.stderr
    out = tmp_path / "out"
    with ScriptedChatServer(default=policy()) as server:
        proc = run(uniagent_run(server, prepared, out, "--concurrency", "3"), env_for(sandbox_tmp))
        first_request = server.requests[0]["messages"]
    assert proc.returncode == 0, proc.stderr
    assert "no id" not in proc.stderr
    rewards = {r["task_id"]: r["reward"] for r in results(out)}
    assert rewards == {
        "mean-empty": 1.0, "fahrenheit": 1.0, "palindrome-case": 0.0, "factorial-zero": 0.0,
        "clamp-order": 0.0, "count-vowels": 0.0,
    }  # fmt: skip
    import pyarrow.parquet as pq

    prompts = {
        row["extra_info"]["task_id"]: row["prompt"] for row in pq.read_table(prepared).to_pylist()
    }
    sent = [{"role": m["role"], "content": m["content"]} for m in first_request[:2]]
    assert sent in prompts.values(), "the prepared prompt is what the model is shown"
