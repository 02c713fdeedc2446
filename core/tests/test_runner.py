"""The run machinery in-process: many episodes, no leaked handles, progress, summary figures."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import shutil
import types
from pathlib import Path

import pytest
from pydantic import BaseModel

from uniagent import ToolSpec, hookimpl
from uniagent.config import AgentConfig
from uniagent.env import procfs
from uniagent.env.containers import current_run_id
from uniagent.plugins import load_plugins, reset_plugins
from uniagent.run.jobs import BackgroundCloser
from uniagent.run.progress import Progress
from uniagent.run.runner import ResultsFile, run
from uniagent.run.summary import format_summary, pass_at_k, summarize
from uniagent.tasks import Task
from uniagent.testing.scripted import ScriptedTokenModel, hermes_call


class NoArgs(BaseModel):
    pass


DONE = ToolSpec(
    name="done",
    description="Finish.",
    arguments=NoArgs,
    render=lambda a: "echo ok",
    ends_episode=True,
)


@pytest.fixture
def config():
    reset_plugins()

    @hookimpl
    def uniagent_tools():
        return [DONE]

    load_plugins().register(types.SimpleNamespace(uniagent_tools=uniagent_tools), "test-tools")
    yield AgentConfig.from_dict(
        {"tools": ["done"], "instance_template": "{q}", "reward": {"name": "command"}}
    )
    reset_plugins()


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


EPISODES = 24


async def test_many_episodes_leak_no_file_handles_or_loggers(config, qwen3_tokenizer, tmp_path):
    # The command reward reads each task's test_command: even-numbered tasks pass. Three
    # waves of 8 at once: a handle or logger left by any episode shows (60 cost a minute).
    tasks = [
        Task(f"t{i}", {"q": f"task {i}", "test_command": "true" if i % 2 == 0 else "false"})
        for i in range(EPISODES)
    ]
    model = ScriptedTokenModel(qwen3_tokenizer, policy=lambda cache: hermes_call("done"))
    # What a process keeps once its first sandbox started (under bubblewrap the base mount
    # namespace's descriptor, env/mountns.py) is not an episode's: made before counting.
    quiet = Progress(io.StringIO(), live=False)
    await run(config, tasks[:1], [], lambda: model, tmp_path / "first", progress=quiet)
    loggers_before = set(logging.Logger.manager.loggerDict)
    fds_before = open_fds()
    stream = io.StringIO()
    summary = await run(
        config,
        tasks,
        [],
        lambda: model,
        tmp_path / "out",
        concurrency=8,
        progress=Progress(stream, live=False),
    )
    assert summary["episodes"] == EPISODES and summary["mean_reward"] == 0.5
    assert open_fds() <= fds_before, "every episode's log file and sandbox pipes are closed"
    assert set(logging.Logger.manager.loggerDict) == loggers_before
    assert stream.getvalue().count(": finished, reward") == EPISODES
    logs = list((tmp_path / "out" / "episodes").glob("*/0/log.txt"))
    assert len(logs) == EPISODES and all("finished: finished" in p.read_text() for p in logs)


async def test_sandboxes_close_off_the_episodes_path_at_most_limit_at_once():
    class Sandbox:  # closes when told to
        def __init__(self) -> None:
            self.go, self.closed = asyncio.Event(), False

        async def close(self) -> None:
            await self.go.wait()
            self.closed = True

    closer = BackgroundCloser(2)
    first, second, third = Sandbox(), Sandbox(), Sandbox()
    await closer(first)  # handed over: the episode goes on while it stops
    await closer(second)
    assert closer.closing == 2 and not first.closed
    waiting = asyncio.ensure_future(closer(third))  # the limit: waits until one stopped
    await asyncio.sleep(0)
    assert not waiting.done()
    first.go.set()
    await waiting
    assert first.closed and closer.closing == 2
    second.go.set()
    third.go.set()
    await closer.drain()
    assert second.closed and third.closed and closer.closing == 0


async def test_sandboxes_prepared_ahead_wait_for_an_agent_slot(config, qwen3_tokenizer, tmp_path):
    """`warm: 1` beside `concurrency: 1`: while one episode's agent runs, the next sets up
    and baselines its sandbox (the config has a reward) and waits in phase `ready`; its agent
    starts once the running one's agent has ended (its grading goes on beside it). Never two
    agents at once, and the third task waits for a place."""
    events: list[tuple[str, str]] = []
    two_ready = asyncio.Event()  # the running episode and the next one

    class Watch(Progress):
        def started(self, job, attempt=1):
            state = super().started(job, attempt)
            seen = state.phase

            def phase(name):
                seen(name)
                events.append((job.task.id, name))
                if sum(what == "ready" for _, what in events) == 2:
                    two_ready.set()

            state.phase = phase
            return state

    class Model(ScriptedTokenModel):
        async def generate(self, cache, **kwargs):
            if not any(what == "model" for _, what in events):
                # The first agent's turn: another episode gets its sandbox ready meanwhile.
                await asyncio.wait_for(two_ready.wait(), 120)
            events.append(("", "model"))
            return await super().generate(cache, **kwargs)

    tasks = [Task(f"t{i}", {"q": f"task {i}", "test_command": "true"}) for i in range(3)]
    model = Model(qwen3_tokenizer, policy=lambda cache: hermes_call("done"))
    out = tmp_path / "out"
    summary = await run(
        config, tasks, [], lambda: model, out, concurrency=1, warm=1,
        progress=Watch(io.StringIO(), live=False),
    )  # fmt: skip
    assert summary["episodes"] == 3 and summary["mean_reward"] == 1.0
    agents, most = 0, 0
    for _, what in events:
        agents += {"agent": 1, "grading": -1}.get(what, 0)
        most = max(most, agents)
    assert most == 1, events  # one agent slot
    first_model = events.index(("", "model"))
    ready_then = {t for t, what in events[:first_model] if what == "ready"}
    running = {t for t, what in events[:first_model] if what == "agent"}
    assert len(running) == 1 and len(ready_then) == 2, events  # the other one: set up, waiting
    for task in ("t0", "t1", "t2"):
        mine = [what for t, what in events if t == task]
        assert mine == ["setup", "tools", "baseline", "ready", "agent", "grading", "close"], mine
    third = [t for t, what in events if what == "setup"][2]
    first_closed = next(i for i, (_, what) in enumerate(events) if what == "close")
    assert events.index((third, "setup")) > first_closed, events  # two places: one freed
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert all("ready" in r["timings"] for r in records)


async def test_a_negative_warm_is_refused_before_anything_starts(config, qwen3_tokenizer, tmp_path):
    from uniagent.errors import ConfigError

    model = ScriptedTokenModel(qwen3_tokenizer, policy=lambda cache: hermes_call("done"))
    tasks = [Task("t0", {"q": "task", "test_command": "true"})]
    with pytest.raises(ConfigError, match="--warm must be 0 or more"):
        await run(config, tasks, [], lambda: model, tmp_path / "a", warm=-1)
    assert not (tmp_path / "a").exists()


def test_uniagent_run_takes_warm_from_the_command_line(done_run_files, tmp_path, monkeypatch):
    from uniagent.testing import Reply, ScriptedChatServer, cli, tool_call

    monkeypatch.setenv("OPENAI_API_KEY", "test")
    config, data = done_run_files(3)
    finish = Reply("Done.", tool_calls=[tool_call("done", {}, "call_done")])
    with ScriptedChatServer(default=lambda body: finish) as server:
        argv = ["run", str(config), "--data", str(data), "--model", f"openai:{server.base_url}#m",
                "--concurrency", "1"]  # fmt: skip
        with pytest.raises(SystemExit) as refused:  # argparse's exit: status 2, one line
            cli([*argv, "--out", str(tmp_path / "bad"), "--warm", "-1"])
        assert refused.value.code == 2
        assert cli([*argv, "--out", str(tmp_path / "out"), "--warm", "2"]) == 0
    records = [json.loads(x) for x in (tmp_path / "out" / "results.jsonl").read_text().splitlines()]
    assert len(records) == 3 and all("ready" in r["timings"] for r in records)
    assert not (tmp_path / "bad").exists()


async def test_an_episode_hands_its_sandbox_to_the_closer(config, qwen3_tokenizer):
    from uniagent.episode import run_episode
    from uniagent.resolver import resolve

    handed: list = []

    async def keep(env) -> None:
        handed.append(env)

    model = ScriptedTokenModel(qwen3_tokenizer, policy=lambda cache: hermes_call("done"))
    task = {"q": "task", "test_command": "true"}
    result = await run_episode(resolve(config), task, model, closer=keep)
    assert result.reward == 1.0 and len(handed) == 1
    assert await handed[0].is_alive()  # not closed by the episode: the closer's to close
    await handed[0].close()
    assert not await handed[0].is_alive()


async def test_the_manifest_plans_every_job_before_any_starts(config, qwen3_tokenizer, tmp_path):
    out = tmp_path / "out"
    seen: list[dict] = []

    def policy(cache):
        seen.append(json.loads((out / "manifest.json").read_text()))
        return hermes_call("done")

    tasks = [Task(f"t{i}", {"q": f"task {i}", "test_command": "true"}) for i in range(3)]
    model = ScriptedTokenModel(qwen3_tokenizer, policy=policy)
    quiet = Progress(io.StringIO(), live=False)
    await run(config, tasks, [], lambda: model, out, n=2, limit=2, progress=quiet)
    first = seen[0]
    assert first["jobs"] == [["t0", 0], ["t0", 1], ["t1", 0], ["t1", 1]]
    assert first["n"] == 2 and first["pid"] == os.getpid() and first["host"]
    # With the pid its start time, so that a later process reusing the pid is not the run.
    assert first["pid_start"] == procfs.info(os.getpid()).start_ticks
    assert first["started_at"].endswith("+00:00") and len(first["run_id"]) == 12

    # A resume plans the same jobs (finished ones too), runs none, and stays the same run:
    # its sandboxes carry the run id, by which a resume finds a killed run's leftovers.
    await run(config, tasks, [], lambda: model, out, n=2, limit=2, progress=quiet)
    again = json.loads((out / "manifest.json").read_text())
    assert again["jobs"] == first["jobs"] and again["run_id"] == first["run_id"]
    assert again["started_at"] == first["started_at"] and len(again["resumed_at"]) == 1
    assert len(seen) == 4


def test_live_progress_shows_each_running_episode_and_the_failures():
    from rich.console import Console

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = Terminal()
    progress = Progress.for_stream(stream)
    assert progress.live

    def job(task: str) -> types.SimpleNamespace:
        return types.SimpleNamespace(task=types.SimpleNamespace(id=task), sample=0)

    progress.begin(total=4)
    busy = progress.started(job("busy"), 2)
    busy.phase("setup")
    busy.phase("agent")
    busy.turn(3)
    busy.tool("execute_bash")
    waiting = progress.started(job("waiting"), 1)
    waiting.turn(1)
    odd = progress.started(job("proj[/x]"), 1)  # rich markup in a task id is shown as text
    odd.tool("[bold]x")
    progress.finished(job("done"), {"exit_reason": "finished", "reward": 1.0, "metrics": {}})
    broken = {"exit_reason": "env_error", "error": "EnvStartError: no image", "attempt": 1}
    progress.retrying(job("broken"), broken, 10.0, 2)
    screen = Console(width=120, record=True, file=io.StringIO())
    screen.print(progress.view())
    text = screen.export_text()
    assert "done 1/4  running 3  infra failures 0  mean reward 1.000" in text and "ETA" in text
    assert "busy#0" in text and "turn 3 · execute_bash" in text
    assert "waiting#0" in text and "turn 1 · waiting for the model" in text
    assert "proj[/x]#0" in text and "[bold]x" in text
    assert "broken#0: attempt 1 failed, env_error: EnvStartError: no image" in text
    progress.end()
    printed = stream.getvalue()
    assert "retrying in 10 s" in printed, "failures stay in the scroll-back"
    assert "done#0" not in printed, "no line per successful episode on a terminal"
    last = printed.strip().splitlines()[-1]
    assert "\x1b[2Kdone 1/4  running 3" in last, "the view is erased, the final counts stay"


def test_phase_times_add_up_in_order():
    from uniagent.run.progress import EpisodeState

    state = EpisodeState("t#0", 1)
    for phase in ("setup", "tools", "agent", "close"):
        state.phase(phase)
    assert list(state.timings()) == ["setup", "tools", "agent", "close"]
    assert all(v >= 0 for v in state.timings().values())


def test_progress_counts_the_episodes_waiting_for_an_agent_slot():
    progress = Progress(io.StringIO(), live=False)
    from uniagent.run.jobs import Job

    first = progress.started(Job(Task("a", {}), 0))
    second = progress.started(Job(Task("b", {}), 0))
    first.phase("agent")
    assert "running 2  infra" in progress.status()
    second.phase("ready")
    assert "running 2 (1 ready)  infra" in progress.status()
    assert second.describe() == "ready · waiting for an agent slot"


def test_results_file_drops_a_line_cut_short_by_a_crash(tmp_path: Path):
    path = tmp_path / "results.jsonl"
    path.write_text('{"task_id": "a", "sample": 0}\n{"task_id": "b", "sam')
    results = ResultsFile(path)
    assert [r["task_id"] for r in results.load()] == ["a"]
    results.repair()
    results.append({"task_id": "b", "sample": 0})
    assert [r["task_id"] for r in results.load()] == ["a", "b"]


def test_pass_at_k_is_the_unbiased_estimator():
    assert pass_at_k(n=5, c=0, k=1) == 0.0
    assert pass_at_k(n=5, c=5, k=3) == 1.0
    assert pass_at_k(n=4, c=1, k=1) == pytest.approx(0.25)
    assert pass_at_k(n=4, c=1, k=2) == pytest.approx(0.5)


def test_summary_figures_agree_with_the_records():
    records = [
        {
            "task_id": "a",
            "sample": 0,
            "exit_reason": "finished",
            "reward": 1.0,
            "metrics": {"tool_calls": {"x": 2}, "model_seconds": 1.5},
        },
        {
            "task_id": "a",
            "sample": 1,
            "exit_reason": "max_step_limit",
            "reward": 0.0,
            "metrics": {"tool_calls": {"x": 1, "y": 1}, "model_seconds": 0.5},
        },
        {
            "task_id": "b",
            "sample": 0,
            "exit_reason": "env_error",
            "reward": None,
            "traj_masked": True,
            "metrics": {},
        },
        {"task_id": "b", "sample": 1, "exit_reason": "finished", "reward": 0.0, "metrics": {}},
    ]
    summary = summarize(records, n=2, wall_seconds=3.0)
    assert summary["mean_reward"] == pytest.approx(1 / 3)
    assert summary["masked_episodes"] == 1
    assert summary["exit_reasons"] == {"finished": 2, "max_step_limit": 1, "env_error": 1}
    assert summary["tool_calls"] == {"x": 3, "y": 1}
    assert summary["time_seconds"]["model_seconds"] == 2.0
    assert summary["pass_at_k"] == {"pass@1": pytest.approx(0.25), "pass@2": pytest.approx(0.5)}
    text = format_summary(summary)
    assert "mean reward: 0.333 over 3 rewarded episodes" in text and "pass@2: 0.500" in text


async def test_a_failure_to_save_an_episode_stops_the_run_with_its_cause(
    config, qwen3_tokenizer, tmp_path
):
    out = tmp_path / "out"

    def policy(cache):
        if "task 1" in json.dumps(cache.messages):
            # Where the episode's files go is no longer a directory (as a full disk or a
            # lost mount would fail the write): the runner's failure, not the episode's.
            directory = out / "episodes" / "t1" / "0"
            shutil.rmtree(directory)
            directory.write_text("in the way")
        return hermes_call("done")

    tasks = [Task(f"t{i}", {"q": f"task {i}", "test_command": "true"}) for i in range(4)]
    model = ScriptedTokenModel(qwen3_tokenizer, policy=policy)
    summary = await run(
        config, tasks, [], lambda: model, out, concurrency=1,
        progress=Progress(io.StringIO(), live=False),
    )  # fmt: skip
    assert summary["status"] == "stopped"
    assert summary["stopped"].startswith("stopped: saving t1#0 failed: FileExistsError")
    assert summary["episodes"] == 1 and summary["pending"] == 3  # t0 saved, t2 and t3 not run
    assert not (out / "episodes" / "t2").exists()


async def test_a_resume_adds_its_wall_time_and_one_with_nothing_to_do_keeps_it(
    config, qwen3_tokenizer, tmp_path
):
    out = tmp_path / "out"
    tasks = [Task(f"t{i}", {"q": f"task {i}", "test_command": "true"}) for i in range(2)]
    model = ScriptedTokenModel(qwen3_tokenizer, policy=lambda cache: hermes_call("done"))
    quiet = Progress(io.StringIO(), live=False)
    await run(config, tasks, [], lambda: model, out, limit=1, progress=quiet)
    summary_file = out / "summary.json"
    first = json.loads(summary_file.read_text())
    assert first["episodes"] == 1 and first["wall_seconds"] > 0
    # As if the first run had taken 200 s.
    summary_file.write_text(json.dumps({**first, "wall_seconds": 200.0}))

    again = await run(config, tasks, [], lambda: model, out, limit=1, progress=quiet)
    assert again["wall_seconds"] == 200.0  # nothing left to run: before, this run's few seconds
    assert json.loads(summary_file.read_text())["wall_seconds"] == 200.0

    more = await run(config, tasks, [], lambda: model, out, limit=2, progress=quiet)
    assert more["episodes"] == 2 and more["wall_seconds"] > 200.0  # 200 s, then this run's


class Command(BaseModel):
    command: str


SHELL = ToolSpec(
    name="shell", description="Run a command.", arguments=Command, render=lambda a: a["command"]
)


@pytest.fixture
def shell_config():
    reset_plugins()

    @hookimpl
    def uniagent_tools():
        return [SHELL, DONE]

    load_plugins().register(types.SimpleNamespace(uniagent_tools=uniagent_tools), "test-tools")
    yield AgentConfig.from_dict(
        {"tools": ["shell", "done"], "tool_parser": "hermes", "instance_template": "{q}"}
    )
    reset_plugins()


async def test_calls_written_as_text_are_saved_parsed_and_logged_turn_by_turn(
    shell_config, tmp_path
):
    """A chat API that returns the calls as text (no tool parser on the server): the
    parser reads them; messages.json keeps what it read, and log.txt each call."""
    from uniagent.models import OpenAIChatModel
    from uniagent.testing import Reply, ScriptedChatServer

    replies = [
        Reply(hermes_call("shell", {"command": "echo hi && false"}, thought="Let me look.")),
        Reply(hermes_call("done")),
    ]
    out = tmp_path / "out"
    with ScriptedChatServer(replies) as server:
        summary = await run(
            shell_config,
            [Task("t", {"q": "say hi"})],
            [],
            lambda: OpenAIChatModel(server.base_url, "scripted", api_key="test"),
            out,
            progress=Progress(io.StringIO(), live=False),
        )
        sent = [m for body in server.requests for m in body["messages"]]
    assert summary["episodes"] == 1
    episode = out / "episodes" / "t" / "0"
    messages = json.loads((episode / "messages.json").read_text())
    call, answer, submit = messages[2], messages[3], messages[4]
    assert call["role"] == "assistant" and "<tool_call>" in call["content"]
    parsed = [{"name": "shell", "arguments": {"command": "echo hi && false"}}]
    assert call["parsed_tool_calls"] == parsed
    assert call["parsed_content"] == "Let me look."
    assert answer["role"] == "user" and answer["tool_output_of"] == "shell"
    assert "hi" in answer["content"] and "[exit code 1]" in answer["content"]
    assert submit["parsed_tool_calls"] == [{"name": "done", "arguments": {}}]
    assert not any(k.startswith(("parsed_", "tool_output")) for m in sent for k in m), (
        "what the record notes is never sent to the model"
    )
    log = (episode / "log.txt").read_text().splitlines()
    assert any("turn 1: model " in line for line in log)
    assert any("turn 1: shell $ echo hi && false -> exit 1, " in line for line in log)
    assert any("turn 2: done {} -> exit 0, " in line for line in log)
    assert "start" in log[0] and "finished: finished" in log[-1]


class Held(BaseModel):
    pass


HOLD = ToolSpec(
    name="hold",
    description="Wait for the test.",
    arguments=Held,
    render=lambda a: 'cat "$HOLD"',  # a FIFO: the command runs until the test closes it
)


async def writer_of(fifo: Path, the_run: asyncio.Task) -> int:
    """The FIFO's write end, once the sandbox's command opened the read end."""
    opening = asyncio.ensure_future(asyncio.to_thread(os.open, fifo, os.O_WRONLY))
    await asyncio.wait({opening, the_run}, return_when=asyncio.FIRST_COMPLETED)
    if not opening.done():  # the run ended first: free the thread, report the run
        os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))
        os.close(await opening)
        pytest.fail(f"the run ended before its command ran: {the_run.result()}")
    return opening.result()


@pytest.mark.parametrize("first", ["interrupted", "finished"])
async def test_two_runs_in_one_process_close_only_their_own_sandboxes(
    qwen3_tokenizer, tmp_path, first
):
    reset_plugins()

    @hookimpl
    def uniagent_tools():
        return [DONE, HOLD]

    load_plugins().register(types.SimpleNamespace(uniagent_tools=uniagent_tools), "test-tools")

    labels: dict[str, set[str | None]] = {"a": set(), "b": set()}

    def policy_of(name: str):
        def policy(cache):  # hold once, then finish
            labels[name].add(current_run_id())  # the id its sandboxes are labelled with
            held = any(m.get("role") == "tool" for m in cache.messages)
            return hermes_call("done" if held else "hold")

        return policy

    fifos = {name: tmp_path / f"{name}.fifo" for name in ("a", "b")}
    runs = {}
    for name, fifo in fifos.items():
        policy = policy_of(name)
        os.mkfifo(fifo)
        config = AgentConfig.from_dict({
            "tools": ["hold", "done"], "instance_template": "{q}",
            "reward": {"name": "command"},
            "env": {"env": {"HOLD": str(fifo)}, "deployment": {"type": "host",
                                                              "isolation": "none"}},
        })  # fmt: skip
        model = ScriptedTokenModel(qwen3_tokenizer, policy=policy)
        runs[name] = asyncio.create_task(run(
            config, [Task(f"{name}0", {"q": "wait", "test_command": "true"})], [],
            lambda model=model: model, tmp_path / name, retries=0,
            progress=Progress(io.StringIO(), live=False),
        ))  # fmt: skip
    try:
        # Both runs' episodes wait in their sandboxes' commands.
        writers = {name: await writer_of(fifo, runs[name]) for name, fifo in fifos.items()}
        if first == "interrupted":
            runs["a"].cancel()
            with pytest.raises(asyncio.CancelledError):
                await runs["a"]
            assert json.loads((tmp_path / "a" / "summary.json").read_text())["status"] == (
                "interrupted"
            )
        else:
            os.write(writers["a"], b"a may go\n")
            os.close(writers.pop("a"))
            assert (await runs["a"])["exit_reasons"] == {"finished": 1}
        # Run b's sandbox is untouched: its command goes on when the test lets it.
        try:
            os.write(writers["b"], b"b may go\n")
        except BrokenPipeError:
            pytest.fail(f"run b's command was killed when run a was {first}")
        os.close(writers.pop("b"))
        summary = await runs["b"]
    finally:
        for fd in locals().get("writers", {}).values():
            os.close(fd)
        reset_plugins()
    assert summary["status"] == "complete", summary
    assert summary["exit_reasons"] == {"finished": 1} and summary["mean_reward"] == 1.0
    messages = json.loads((tmp_path / "b" / "episodes" / "b0" / "0" / "messages.json").read_text())
    assert any("b may go" in str(m.get("content")) for m in messages if m["role"] == "tool")
    for name in ("a", "b"):  # each run's sandboxes carry its own id, not the other's
        manifest = json.loads((tmp_path / name / "manifest.json").read_text())
        assert labels[name] == {manifest["run_id"]}


def test_a_rows_config_overrides_and_verls_name_for_them() -> None:
    from uniagent.errors import ConfigError

    over = {"interaction": {"max_turns": 3}}
    assert Task("a", {"config_overrides": over}).overrides() == over
    assert Task("b", {"tools_kwargs": over}).overrides() == over  # verl's name
    assert Task("c", {"extra_info": {"tools_kwargs": json.dumps(over)}}).overrides() == over
    assert Task("d", {"problem": "x"}).overrides() == {}
    with pytest.raises(ConfigError, match="task e: give config_overrides .* not both"):
        Task("e", {"config_overrides": over, "tools_kwargs": over}).overrides()
    with pytest.raises(ConfigError, match="task f: config_overrides must be a mapping"):
        Task("f", {"config_overrides": [1]}).overrides()


@pytest.mark.parametrize("live", [False, True], ids=["plain", "live view"])
def test_the_first_signal_is_said_at_once_before_the_run_stops(capsys, live) -> None:
    """Before: nothing until the run had stopped, which waits for an in-process model's next
    token (a minute with a large model on a CPU). On a terminal the line goes above the live
    view (a plain print there would be drawn over)."""
    import signal

    from uniagent.run.shutdown import Interrupted, SignalGuard

    stream = io.StringIO()
    progress = Progress(stream, live=live)
    said_before_cancelled: list[str] = []

    async def main() -> None:
        signal.raise_signal(signal.SIGINT)  # the handler runs now; the cancellation comes next
        said_before_cancelled.append(stream.getvalue() + capsys.readouterr().err)
        await asyncio.Event().wait()

    with SignalGuard() as guard, pytest.raises(Interrupted, match="interrupted by SIGINT"):
        guard.run(main, progress=progress)
    assert said_before_cancelled == [
        "uniagent: stopping (SIGINT): cancelling the running episodes and closing their "
        "sandboxes; signal twice more to exit at once\n"
    ]
    assert bool(stream.getvalue()) is live  # through the progress view only when it is live


def test_a_workers_slots_with_and_without_warm():
    from uniagent.episode import worker_slots

    assert worker_slots(4, 0, 2) == (2, 2)  # no warm: as many sandboxes as agents
    assert worker_slots(2, 2, 2) == (1, 2)
    assert worker_slots(2, 1, 2) == (1, 2)  # some warm: at least one more a worker
    assert worker_slots(1, 8, 4) == (1, 3)  # at least one agent a worker
