"""Services named by the agent config, in verl's real AgentLoopWorker: started once per worker
process before its first episode; a service that cannot start masks the samples (env_error)."""

from __future__ import annotations

import logging
import types
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict
from verl_helpers import (
    AGENT,
    SCRIPTS,
    agent_field,
    make_batch,
    make_worker,
    task,
    trainer_config,
    write_loop_yaml,
)

from uniagent import ServiceSpec, hookimpl
from uniagent.config import AgentConfig
from uniagent.plugins import load_plugins, reset_plugins
from uniagent.resolver import resolve
from uniagent.services import stop_service
from uniagent.verl.testing import ScriptedTokenServer


class Settings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    fail: bool = False


class Handle:
    async def stop(self) -> None:
        pass


@pytest.fixture
def starts() -> Any:
    reset_plugins()
    calls: list[Settings] = []

    async def start(settings: Settings) -> Handle:
        calls.append(settings)
        if settings.fail:
            raise OSError("address already in use")
        return Handle()

    @hookimpl
    def uniagent_services():
        return [ServiceSpec(name="helper", start=start, settings=Settings)]

    load_plugins().register(types.SimpleNamespace(uniagent_services=uniagent_services), "t-svc")
    yield calls
    reset_plugins()


async def run_batch(tmp_path: Path, verl_model_dir: Path, tokenizer: Any, agent: dict) -> Any:
    loop_yaml = write_loop_yaml(tmp_path, agent)
    batch = make_batch(tmp_path, tokenizer, [task(f"t{i}", "[script:finish]") for i in range(3)])
    server = ScriptedTokenServer(str(verl_model_dir), SCRIPTS)
    config = trainer_config(verl_model_dir, loop_yaml)
    return await make_worker(config, server).generate_sequences(batch)


async def test_a_worker_starts_the_service_once_for_all_its_episodes(
    tmp_path: Path, verl_model_dir: Path, qwen3_tokenizer: Any, starts: list
) -> None:
    agent = {**AGENT, "services": {"helper": {}}}
    out = await run_batch(tmp_path, verl_model_dir, qwen3_tokenizer, agent)
    assert agent_field(out, "exit_reason") == ["finished"] * 3
    assert len(starts) == 1
    for spec, settings in resolve(AgentConfig.from_dict(agent)).services:
        await stop_service(spec, settings)


async def test_a_service_that_cannot_start_masks_the_samples_as_env_error(
    tmp_path: Path, verl_model_dir: Path, qwen3_tokenizer: Any, starts: list
) -> None:
    agent = {**AGENT, "services": {"helper": {"fail": True}}}
    out = await run_batch(tmp_path, verl_model_dir, qwen3_tokenizer, agent)
    assert agent_field(out, "exit_reason") == ["env_error"] * 3
    assert agent_field(out, "traj_masked") == [True] * 3
    assert all("address already in use" in e for e in agent_field(out, "error"))
    assert starts  # tried (a later episode tries again; concurrent ones share the failure)


async def test_a_worker_resolves_its_agent_once_and_each_distinct_override_once(
    tmp_path: Path, verl_model_dir: Path, qwen3_tokenizer: Any, caplog: Any
) -> None:
    loop_yaml = write_loop_yaml(tmp_path, AGENT)
    override = {"interaction": {"max_turns": 2}}
    rows = [task(f"t{i}", "[script:finish]") for i in range(3)]
    rows += [task(f"o{i}", "[script:finish]", tools_kwargs=override) for i in range(2)]
    batch = make_batch(tmp_path, qwen3_tokenizer, rows)
    caplog.set_level(logging.DEBUG, logger="uniagent.resolver")
    caplog.clear()  # `uniagent data prepare` above resolved the config too, in this process
    server = ScriptedTokenServer(str(verl_model_dir), SCRIPTS)
    config = trainer_config(verl_model_dir, loop_yaml)
    out = await make_worker(config, server).generate_sequences(batch)
    assert agent_field(out, "exit_reason") == ["finished"] * 5
    resolved = [r.getMessage() for r in caplog.records if r.name == "uniagent.resolver"]
    assert len([m for m in resolved if not m.endswith("(overrides)")]) == 1
    assert len([m for m in resolved if m.endswith("(overrides)")]) == 1
