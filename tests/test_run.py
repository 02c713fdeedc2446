"""``uniagent run`` end to end: the example tasks, a scripted chat server, real host sandboxes.

The model is a real HTTP server speaking chat completions (the OpenAI backend
talks to it); its policy fixes two of the example tasks and submits the rest
unfixed, so the rewards are known in advance.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from uniagent.testing.chat_server import Gate, Reply, ScriptedChatServer, tool_call

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "examples" / "swe_tiny" / "config.yaml"
FIXES = {
    "mean-empty": "sed -i 's|return sum(values) / len(values)|"
    "return sum(values) / len(values) if values else 0.0|' stats.py",
    "fahrenheit": "sed -i 's/- 32/+ 32/' temperature.py",
}
PROBLEMS = {"mean-empty": "stats.mean", "fahrenheit": "celsius_to_fahrenheit(0)"}


def policy(gate: Gate | None = None):
    """Fix the task if it is one we know, then submit; tool calls come back structured.

    With ``gate``, requests of the other tasks are held until the gate is released.
    """

    def reply(body: dict) -> Reply:
        messages = body["messages"]
        task = next((t for t, hint in PROBLEMS.items() if hint in messages[1]["content"]), None)
        if task is None and gate is not None:
            gate.hold()
        if task is not None and not any(m["role"] == "tool" for m in messages):
            call = tool_call("execute_bash", {"command": FIXES[task]}, "call_fix")
            return Reply("Fixing the bug.", tool_calls=[call])
        return Reply("Done.", tool_calls=[tool_call("submit", {}, "call_submit")])

    return reply


def run_command(config: Path, tasks: Path, model: str, out: Path, *extra: str) -> list[str]:
    """The ``uniagent run`` command line, run with this interpreter."""
    cli = [sys.executable, "-m", "uniagent.cli", "run", str(config), "--data", str(tasks)]
    return [*cli, "--model", model, "--out", str(out), *extra]


def uniagent_run(server, tasks: Path, out: Path, *extra: str) -> list[str]:
    """``uniagent run`` of the example config against the scripted chat server."""
    return run_command(CONFIG, tasks, f"openai:{server.base_url}#scripted", out, *extra)


UNREACHABLE = "openai:http://127.0.0.1:9/v1#m"  # never contacted: these runs fail first


def env_for(tmp: Path) -> dict[str, str]:
    return {**os.environ, "TMPDIR": str(tmp), "OPENAI_API_KEY": "test"}


def results(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]


def sandbox_processes(tmp: Path) -> list[int]:
    """PIDs whose working directory lies inside the run's TMPDIR."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cwd = os.readlink(proc / "cwd")
        except OSError:
            continue
        if cwd.startswith(str(tmp)):
            found.append(int(proc.name))
    return found


def test_run_writes_results_episodes_and_a_summary_that_agree(tasks, tmp_path, sandbox_tmp):
    out = tmp_path / "out"
    with ScriptedChatServer(default=policy()) as server:
        proc = subprocess.run(
            uniagent_run(server, tasks, out, "--concurrency", "3"),
            capture_output=True,
            text=True,
            env=env_for(sandbox_tmp),
            timeout=300,
        )
    assert proc.returncode == 0, proc.stderr
    records = results(out)
    assert len(records) == 6
    rewards = {r["task_id"]: r["reward"] for r in records}
    assert rewards == {
        "mean-empty": 1.0,
        "fahrenheit": 1.0,
        "palindrome-case": 0.0,
        "factorial-zero": 0.0,
        "clamp-order": 0.0,
        "count-vowels": 0.0,
    }
    assert {r["exit_reason"] for r in records} == {"finished"}
    for record in records:
        directory = Path(record["episode_dir"])
        messages = json.loads((directory / "messages.json").read_text())
        assert messages[0]["role"] == "system" and messages[-1]["role"] == "assistant"
        assert json.loads((directory / "result.json").read_text()) == record
        assert json.loads((directory / "rollout.json").read_text())["mode"] == "messages"
        assert "finished" in (directory / "log.txt").read_text()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["episodes"] == 6 and summary["mean_reward"] == pytest.approx(2 / 6)
    assert summary["exit_reasons"] == {"finished": 6}
    assert summary["tool_calls"] == {"submit": 6, "execute_bash": 2}
    assert "mean reward: 0.333" in proc.stdout
    assert sandbox_processes(sandbox_tmp) == []


def test_n_samples_give_pass_at_k(tasks, tmp_path, sandbox_tmp):
    out = tmp_path / "out"
    with ScriptedChatServer(default=policy()) as server:
        proc = subprocess.run(
            uniagent_run(server, tasks, out, "--n", "2", "--limit", "3"),
            capture_output=True,
            text=True,
            env=env_for(sandbox_tmp),
            timeout=300,
        )
    assert proc.returncode == 0, proc.stderr
    records = results(out)
    assert sorted((r["task_id"], r["sample"]) for r in records) == sorted(
        (t, s) for t in ("mean-empty", "fahrenheit", "palindrome-case") for s in (0, 1)
    )
    summary = json.loads((out / "summary.json").read_text())
    assert summary["pass_at_k"] == {"pass@1": pytest.approx(2 / 3), "pass@2": pytest.approx(2 / 3)}


@pytest.mark.parametrize(
    "how", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL], ids=["ctrl-c", "sigterm", "crash"]
)
def test_interrupted_run_resumes_and_runs_each_pair_exactly_once(tasks, tmp_path, sandbox_tmp, how):
    # The first two tasks (the ones the policy fixes) run through; the model then holds the
    # next two episodes' first requests, so when the signal comes exactly two results are in
    # and two sandboxes are open.
    out = tmp_path / "out"
    gate = Gate()
    with ScriptedChatServer(default=policy(gate)) as server:
        command = uniagent_run(server, tasks, out, "--concurrency", "2")
        proc = subprocess.Popen(
            command,
            env=env_for(sandbox_tmp),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        if not gate.wait_for(2):
            proc.kill()
            pytest.fail(f"the run never reached its third and fourth episodes: {proc.stderr}")
        assert len(results(out)) == 2
        assert len(list(sandbox_tmp.glob("uniagent-*"))) == 2, "two sandboxes are open"
        proc.send_signal(how)
        _, stderr = proc.communicate(timeout=120)
        gate.release()
        if how != signal.SIGKILL:
            assert proc.returncode == 128 + how, stderr
            assert (
                stderr.strip()
                .splitlines()[-1]
                .startswith(f"uniagent: interrupted by {signal.Signals(how).name}")
            )
            assert "Traceback" not in stderr
            assert sandbox_processes(sandbox_tmp) == [], "every sandbox's processes are gone"
            assert list(sandbox_tmp.glob("uniagent-*")) == [], "every sandbox is removed"
            summary = json.loads((out / "summary.json").read_text())
            assert summary["status"] == "interrupted" and summary["episodes"] == 2
        else:
            assert len(list(sandbox_tmp.glob("uniagent-*"))) == 2, "a crash leaves them"
        assert len(results(out)) == 2

        again = subprocess.run(
            command, capture_output=True, text=True, env=env_for(sandbox_tmp), timeout=300
        )
    assert again.returncode == 0, again.stderr
    assert "resuming: 2 of 6" in again.stderr
    if how == signal.SIGKILL:
        assert "leftovers of killed runs (uniagent clean)" in again.stderr
    pairs = Counter((r["task_id"], r["sample"]) for r in results(out))
    assert len(pairs) == 6 and set(pairs.values()) == {1}
    assert json.loads((out / "summary.json").read_text())["episodes"] == 6
    assert list(sandbox_tmp.glob("uniagent-*")) == []
    assert sandbox_processes(sandbox_tmp) == []
    # The two interrupted episodes kept the log of their first attempt.
    for task in ("palindrome-case", "factorial-zero"):
        directory = out / "episodes" / task / "0"
        assert (directory / "attempt-1.log").exists() and "finished" in (
            directory / "log.txt"
        ).read_text()
        assert json.loads((directory / "result.json").read_text())["attempt"] == 2


def test_bad_rows_are_reported_and_skipped_while_the_others_run(tasks, tmp_path, sandbox_tmp):
    lines = tasks.read_text().splitlines()[:2]
    no_field = json.loads(lines[1])
    del no_field["problem_statement"]
    no_field["instance_id"] = "no-problem"
    data = tmp_path / "tasks.jsonl"
    data.write_text(
        "\n".join([lines[0], "{not json", json.dumps(no_field), json.dumps({"x": 1})]) + "\n"
    )
    out = tmp_path / "out"
    with ScriptedChatServer(default=policy()) as server:
        proc = subprocess.run(
            uniagent_run(server, data, out),
            capture_output=True,
            text=True,
            env=env_for(sandbox_tmp),
            timeout=300,
        )
    assert proc.returncode == 2, "skipped rows are bad input, after the others ran"
    assert "line 2: not valid JSON" in proc.stderr
    assert "line 4: no id" in proc.stderr
    assert "no-problem" in proc.stderr and "problem_statement" in proc.stderr
    assert [r["task_id"] for r in results(out)] == ["mean-empty"]
    summary = json.loads((out / "summary.json").read_text())
    assert [r["line"] for r in summary["skipped_rows"]] == [2, 4]
    assert summary["failed_tasks"][0]["task_id"] == "no-problem"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ("missing.jsonl", "does not exist"),
        ("tasks.csv", "must be .jsonl or .parquet"),
    ],
)
def test_unusable_task_file_is_a_clear_error(tmp_path, data, message):
    (tmp_path / "tasks.csv").write_text("a,b\n")
    proc = subprocess.run(
        run_command(CONFIG, tmp_path / data, UNREACHABLE, tmp_path / "out"),
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2 and message in proc.stderr


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ("tools: [execute_bash, grep_tool]", "unknown tool 'grep_tool'; installed tools:"),
        ("tool_parser: json_mode", "unknown tool parser 'json_mode'; installed tool parsers:"),
        ("env: {deployment: {type: modal}}", "unknown deployment 'modal'; installed deployments:"),
        ("interaction: {max_turn: 3}", "interaction.max_turn: unknown key"),
    ],
)
def test_bad_config_names_what_is_installed(tasks, tmp_path, change, expected):
    config = tmp_path / "config.yaml"
    config.write_text(change + "\n")
    proc = subprocess.run(
        run_command(config, tasks, UNREACHABLE, tmp_path / "out"),
        capture_output=True,
        text=True,
        # The tools only: the modal case must see no Modal plugin, wherever this runs.
        env={**os.environ, "UNIAGENT_LOAD_PLUGINS": "uniagent-tools-swe"},
    )
    assert proc.returncode == 2
    assert expected in proc.stderr


@contextlib.contextmanager
def local_ray_cluster(env: dict[str, str]) -> Iterator[int]:
    """A head node of a real local Ray cluster (2 CPUs) for the block; yields its port.

    Its processes get ``env`` without the API key (as on a cluster started elsewhere):
    the driver hands the key to its actors, and the server refuses requests without it.
    """
    cluster_env = {k: v for k, v in env.items() if k != "OPENAI_API_KEY"}
    ray = str(Path(sys.executable).parent / "ray")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    # Ray's socket paths must stay under 107 bytes: a short temp dir of its own.
    ray_tmp = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    # Its own process group: every daemon `ray start` leaves (GCS, raylet, the agents and
    # workers they spawn) stays in it, so the teardown stops this cluster and no other
    # (`ray stop` would stop every Ray process of the machine: another suite's beside it).
    start = subprocess.Popen(
        [
            ray,
            "start",
            "--head",
            "--num-cpus",
            "2",
            "--include-dashboard=false",
            "--node-ip-address",
            "127.0.0.1",
            "--port",
            str(port),
            "--disable-usage-stats",
            f"--temp-dir={ray_tmp}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cluster_env,
        start_new_session=True,
    )
    _, stderr = start.communicate()
    try:
        assert start.returncode == 0, stderr
        yield port
    finally:
        stop_process_group(start.pid)
        shutil.rmtree(ray_tmp, ignore_errors=True)


def stop_process_group(pgid: int, grace: float = 5.0) -> None:
    """SIGTERM to every process of the group, SIGKILL to what is left after ``grace`` s.

    (A test cluster's group never emptied on SIGTERM alone: every stop waited out the
    whole grace, 30 s when that was the default, twice per integration run.)"""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            os.killpg(pgid, 0)  # ProcessLookupError: none is left
            time.sleep(0.1)
        os.killpg(pgid, signal.SIGKILL)


#: One pytest-xdist worker runs the Ray tests, one after another (a cluster of 2 CPUs each).
RAY_GROUP = pytest.mark.xdist_group("ray")


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[tuple[str, dict[str, str]]]:
    """A local Ray cluster the module's Ray tests share: its address and environment."""
    ray_env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    with local_ray_cluster(ray_env) as port:
        yield f"127.0.0.1:{port}", ray_env


def test_the_resolved_agent_goes_to_a_ray_actor_whole() -> None:
    """A Ray run resolves its config once, in the driver: the actor receives the resolved
    agent as Ray serialises it (cloudpickle), equal to the driver's, without the driver's
    registry, and resolves a task's overrides with its own."""
    from ray import cloudpickle

    from uniagent import AgentConfig, resolve

    agent = resolve(AgentConfig.from_yaml(CONFIG))
    agent.for_task({"interaction": {"max_turns": 3}}, source="task a")
    sent = cloudpickle.loads(cloudpickle.dumps(agent))
    assert sent == agent and sent.registry is None and sent.agent.name == agent.agent.name
    assert [t.name for t in sent.tools] == [t.name for t in agent.tools]
    over = sent.for_task({"interaction": {"max_turns": 3}}, source="task a")
    assert over.config.interaction.max_turns == 3 and over.registry is not None


@RAY_GROUP
def test_ray_run_gives_the_same_results_as_a_local_run(tasks, tmp_path, sandbox_tmp, ray_cluster):
    address, cluster_env = ray_cluster
    ray_env = {**cluster_env, **env_for(sandbox_tmp), "RAY_AUTH_MODE": "disabled"}
    outs = {}
    with ScriptedChatServer(default=policy(), api_key=ray_env["OPENAI_API_KEY"]) as server:
        for mode, extra in (
            ("local", ()),
            ("ray", ("--ray", address, "--workers", "2")),
            # Sandboxes prepared ahead: each actor runs its agents under slots of its own.
            ("ray-warm", ("--ray", address, "--workers", "2", "--warm", "2")),
        ):
            outs[mode] = tmp_path / mode
            proc = subprocess.run(
                uniagent_run(server, tasks, outs[mode], *extra),
                capture_output=True,
                text=True,
                env=ray_env,
                timeout=300,
            )
            assert proc.returncode == 0, proc.stderr

    def comparable(out: Path) -> dict:
        return {
            (r["task_id"], r["sample"]): (r["exit_reason"], r["reward"], r["submission"])
            for r in results(out)
        }

    assert comparable(outs["ray"]) == comparable(outs["local"])
    assert comparable(outs["ray-warm"]) == comparable(outs["local"])
    for record in results(outs["ray"]):
        assert (Path(record["episode_dir"]) / "log.txt").read_text()
    assert all("ready" in r["timings"] for r in results(outs["ray-warm"]))


@RAY_GROUP
def test_a_ray_episode_shows_as_running_also_when_a_resume_runs_it_again(
    tasks, tmp_path, sandbox_tmp, ray_cluster
):
    """A Ray worker's files come back when its episode ends; the viewer still sees it run,
    in a fresh run and in the resume of one interrupted while the episode ran."""
    from uniagent.view.rundir import RunFolder

    address, cluster_env = ray_cluster
    ray_env = {**cluster_env, **env_for(sandbox_tmp), "RAY_AUTH_MODE": "disabled"}
    held = tmp_path / "held.jsonl"  # a task the policy does not know: its requests are held
    held.write_text(
        next(line for line in tasks.read_text().splitlines() if "palindrome-case" in line) + "\n"
    )
    out = tmp_path / "out"
    key = "episodes/palindrome-case/0"
    gates = [Gate(), Gate()]
    current = [0]
    replies = [policy(gates[0]), policy(gates[1])]
    extra = ("--ray", address, "--workers", "1", "--concurrency", "1")
    with ScriptedChatServer(default=lambda body: replies[current[0]](body)) as server:
        command = uniagent_run(server, held, out, *extra)
        try:
            first = subprocess.Popen(
                command, env=ray_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
            assert gates[0].wait_for(1), "the episode never called the model"
            folder = RunFolder(out)
            assert folder.state == "live" and folder.rows[key].status == "running"
            assert "Ray worker" in (out / key / "log.txt").read_text()
            first.send_signal(signal.SIGINT)
            _, stderr = first.communicate(timeout=300)
            assert first.returncode == 128 + signal.SIGINT, stderr
            assert folder.refresh() and folder.rows[key].status == "interrupted"

            current[0] = 1
            again = subprocess.Popen(
                command, env=ray_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
            assert gates[1].wait_for(1), "the resume never called the model"
            folder.refresh()
            assert folder.state == "live" and folder.rows[key].status == "running"
            gates[1].release()
            _, stderr = again.communicate(timeout=300)
            assert again.returncode == 0, stderr
        finally:
            for gate in gates:
                gate.release()
    assert folder.refresh() and folder.rows[key].status == "finished"


@RAY_GROUP
def test_an_episode_whose_ray_actor_dies_is_retried_once_on_a_new_actor(
    tasks, tmp_path, sandbox_tmp
):
    """``ray.kill`` of the actor while its episode waits on the model (held by a gate):
    the episode is retried once, on the actor that replaces it; the others run once."""
    import ray

    ray_env = {**env_for(sandbox_tmp), "RAY_AUTH_MODE": "disabled"}
    gate = Gate()
    firsts: Counter[str] = Counter()  # an attempt's first request, by task
    lock = threading.Lock()
    answer = policy()

    def reply(body: dict) -> Reply:
        messages = body["messages"]
        if len(messages) == 2:  # the system prompt and the task: an attempt's first request
            task = "mean-empty" if PROBLEMS["mean-empty"] in messages[1]["content"] else "other"
            with lock:
                firsts[task] += 1
                hold = task == "mean-empty" and firsts[task] == 1
            if hold:
                gate.hold()  # the first attempt waits here while its actor is killed
        return answer(body)

    out = tmp_path / "out"
    with (
        local_ray_cluster(ray_env) as port,
        ScriptedChatServer(default=reply, api_key=ray_env["OPENAI_API_KEY"]) as server,
    ):
        argv = uniagent_run(
            server, tasks, out, "--ray", f"127.0.0.1:{port}", "--workers", "1",
            "--concurrency", "1", "--retry-delay", "0", "--limit", "3",
        )  # fmt: skip
        proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ray_env
        )
        try:
            assert gate.wait_for(1), "the first episode never reached the model"
            ray.init(address=f"127.0.0.1:{port}", log_to_driver=False)
            try:
                (actor,) = ray.util.list_named_actors(all_namespaces=True)
                killed = actor["name"]
                ray.kill(ray.get_actor(killed, namespace=actor["namespace"]), no_restart=True)
            finally:
                ray.shutdown()
            _, stderr = proc.communicate(timeout=300)
            # Nothing of the killed actor's sandbox goes on (the cluster still runs), and
            # its successor removed the directory it left.
            assert not sandbox_processes(sandbox_tmp)
            assert not [p.name for p in sandbox_tmp.glob("uniagent-[0-9]*")]
        finally:
            gate.release()  # the killed attempt's request is answered to nobody
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == 0, stderr
    records = {r["task_id"]: r for r in results(out)}
    assert len(results(out)) == 3 == len(records)  # one line per episode
    retried = records.pop("mean-empty")
    assert retried["attempt"] == 2 and retried["reward"] == 1.0  # the retry fixed it
    (previous,) = retried["previous_attempts"]  # exactly one retry
    assert previous["exit_reason"] == "unknown_error"
    assert previous["cause"] == (
        f"unknown_error: the Ray worker {killed} failed (ActorDiedError): "
        "The actor is dead because it was killed by `ray.kill`."
    )
    run_id = json.loads((out / "manifest.json").read_text())["run_id"]
    assert killed == f"uniagent-{run_id}-0"
    assert retried["ray_worker"] == f"uniagent-{run_id}-1"  # its successor
    for record in records.values():
        assert record["attempt"] == 1 and record["ray_worker"] == f"uniagent-{run_id}-1"
    assert firsts == {"mean-empty": 2, "other": 2}  # the killed attempt and its one retry
    directory = Path(retried["episode_dir"])
    assert "ActorDiedError" in (directory / "attempt-1.log").read_text()
    assert "finished" in (directory / "log.txt").read_text()
