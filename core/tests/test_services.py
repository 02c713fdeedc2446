"""Process-wide services (``uniagent_services``): validated with the config, started once
per process before the first episode, stopped at the end of ``uniagent run``."""

from __future__ import annotations

import asyncio
import io
import json
import types
from pathlib import Path

import pytest
from pydantic import BaseModel, ConfigDict

from uniagent import ServiceSpec, ToolSpec, hookimpl
from uniagent.config import AgentConfig
from uniagent.errors import ConfigError, UnknownPluginNameError
from uniagent.plugins import load_plugins, reset_plugins
from uniagent.resolver import resolve
from uniagent.run.progress import Progress
from uniagent.run.runner import run
from uniagent.services import (
    ServiceStartError,
    ensure_services,
    running_services,
    stop_service,
)
from uniagent.tasks import Task
from uniagent.testing.scripted import ScriptedTokenModel, hermes_call


class NoArgs(BaseModel):
    pass


class MarkerSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    marker: str
    fail: bool = False


class Recorder:
    """The service under test: writes a marker file while it runs, records start and stop."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.gate: asyncio.Event | None = None
        self.stop_gate: asyncio.Event | None = None  # hold the stop (a slow shutdown)

    async def start(self, settings: MarkerSettings) -> Recorder.Handle:
        self.events.append("start")
        if self.gate is not None:  # hold the start so concurrent callers pile up behind it
            await self.gate.wait()
        if settings.fail:
            raise RuntimeError("port in use")
        Path(settings.marker).write_text("up")
        return Recorder.Handle(self, Path(settings.marker))

    class Handle:
        def __init__(self, owner: Recorder, marker: Path) -> None:
            self.owner, self.marker = owner, marker

        async def stop(self) -> None:
            self.owner.events.append("stop")
            if self.owner.stop_gate is not None:
                await self.owner.stop_gate.wait()
            self.marker.unlink()


@pytest.fixture
def recorder():
    reset_plugins()
    rec = Recorder()

    @hookimpl
    def uniagent_services():
        return [ServiceSpec(name="marker", start=rec.start, settings=MarkerSettings)]

    @hookimpl
    def uniagent_tools():
        # Ends the episode with the marker's content as the submission.
        return [
            ToolSpec(
                name="probe",
                description="d",
                arguments=NoArgs,
                ends_episode=True,
                render=lambda a: 'cat "$MARKER" || echo down',
            )
        ]

    load_plugins().register(
        types.SimpleNamespace(uniagent_services=uniagent_services, uniagent_tools=uniagent_tools),
        "test-services",
    )
    yield rec
    reset_plugins()


def config_for(marker: Path, **settings: object) -> AgentConfig:
    return AgentConfig.from_dict(
        {
            "tools": ["probe"],
            "instance_template": "{q}",
            "env": {
                "env": {"MARKER": str(marker)},
                "deployment": {"type": "host", "isolation": "none"},
            },
            "services": {"marker": {"marker": str(marker), **settings}},
        }
    )


def test_an_unknown_service_is_rejected_naming_the_installed_ones(recorder):
    with pytest.raises(UnknownPluginNameError, match="unknown service 'retriever'.*marker"):
        resolve(AgentConfig.from_dict({"tools": ["probe"], "services": {"retriever": {}}}))


def test_bad_service_settings_are_rejected_with_their_key_path(recorder, tmp_path):
    with pytest.raises(ConfigError, match=r"services\.marker\.prot: unknown key"):
        resolve(config_for(tmp_path / "m", prot=1))
    with pytest.raises(ConfigError, match=r"services\.marker\.marker: Field required"):
        resolve(AgentConfig.from_dict({"tools": ["probe"], "services": {"marker": {}}}))


async def test_run_starts_a_service_once_before_the_first_episode_and_stops_it_at_the_end(
    recorder, qwen3_tokenizer, tmp_path
):
    marker = tmp_path / "marker"
    model = ScriptedTokenModel(qwen3_tokenizer, policy=lambda cache: hermes_call("probe"))
    summary = await run(
        config_for(marker),
        [Task(f"t{i}", {"q": "go"}) for i in range(6)],
        [],
        lambda: model,
        tmp_path / "out",
        concurrency=3,
        progress=Progress(io.StringIO(), live=False),
    )
    assert summary["episodes"] == 6
    records = [json.loads(line) for line in (tmp_path / "out" / "results.jsonl").open()]
    assert [r["submission"] for r in records] == ["up"] * 6  # every episode saw it running
    assert recorder.events == ["start", "stop"]
    assert not marker.exists()


async def test_concurrent_episodes_start_a_service_once(recorder, tmp_path):
    config = config_for(tmp_path / "marker")
    recorder.gate = asyncio.Event()
    waiting = [asyncio.create_task(ensure_services(resolve(config))) for _ in range(20)]
    while not recorder.events:  # the first caller is inside start(), the rest queue behind it
        await asyncio.sleep(0)
    recorder.gate.set()
    await asyncio.gather(*waiting)
    await ensure_services(resolve(config))
    assert recorder.events == ["start"]
    for spec, settings in resolve(config).services:
        await stop_service(spec, settings)
    assert recorder.events == ["start", "stop"]


async def test_a_failed_start_is_a_service_error_and_the_next_call_tries_again(recorder, tmp_path):
    config = config_for(tmp_path / "marker", fail=True)
    for _ in range(2):
        with pytest.raises(ServiceStartError, match="'marker'.*test-services.*port in use"):
            await ensure_services(resolve(config))
    assert recorder.events == ["start", "start"]


async def test_running_services_stops_what_it_started_when_the_block_fails(recorder, tmp_path):
    config = config_for(tmp_path / "marker")
    with pytest.raises(KeyError):
        async with running_services(resolve(config)):
            assert (tmp_path / "marker").read_text() == "up"
            raise KeyError("the run failed")
    assert recorder.events == ["start", "stop"]


async def test_a_run_cancelled_while_its_services_stop_waits_for_the_stop(recorder, tmp_path):
    config = config_for(tmp_path / "marker")
    recorder.stop_gate = asyncio.Event()

    async def the_run() -> None:
        async with running_services(resolve(config)):
            pass

    task = asyncio.create_task(the_run())
    while "stop" not in recorder.events:  # the run's teardown is stopping the service
        await asyncio.sleep(0)
    task.cancel()  # as a signal in the teardown of `uniagent run` does
    for _ in range(20):  # the task's turns come and go: it keeps waiting for the stop
        await asyncio.sleep(0)
    assert not task.done(), "the stop is not abandoned"
    recorder.stop_gate.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not (tmp_path / "marker").exists(), "the stop ran to its end"


async def test_a_task_cannot_change_the_services(recorder, qwen3_tokenizer, tmp_path):
    model = ScriptedTokenModel(qwen3_tokenizer, policy=lambda cache: hermes_call("probe"))
    other = {"services": {"marker": {"marker": str(tmp_path / "other")}}}
    summary = await run(
        config_for(tmp_path / "marker"),
        [Task("t0", {"q": "go", "tools_kwargs": other})],
        [],
        lambda: model,
        tmp_path / "out",
        progress=Progress(io.StringIO(), live=False),
    )
    assert summary["episodes"] == 0
    assert "services cannot be changed per task" in str(summary["failed_tasks"])
    assert recorder.events == ["start", "stop"]
