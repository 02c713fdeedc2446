"""MCP servers as tools: a real server (the ``mcp`` SDK's MCPServer), listed and called by a
scripted agent through ``run()``, over stdio inside host sandboxes and over streamable HTTP."""

from __future__ import annotations

import asyncio
import io
import json
import os
import shutil
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from uniagent import ToolSpec, hookimpl
from uniagent.cli import plugins_report
from uniagent.config import AgentConfig
from uniagent.errors import ConfigError
from uniagent.mcp.config import McpServerConfig
from uniagent.mcp.process import close_mcp_servers, ensure_mcp_server, socket_dir
from uniagent.mcp.tools import HELPER
from uniagent.plugins import load_plugins, reset_plugins
from uniagent.resolver import resolve
from uniagent.run.progress import Progress
from uniagent.run.runner import run
from uniagent.tasks import Task
from uniagent.testing.scripted import ScriptedTokenModel, hermes_call

pytest.importorskip("mcp", reason="the core suite installs uniagent[mcp]")

SERVER = Path(__file__).with_name("mcp_servers") / "demo_server.py"
VENV = Path(sys.prefix)
ISOLATIONS = [
    "none",
    pytest.param(
        "bwrap",
        marks=pytest.mark.skipif(
            shutil.which("bwrap") is None, reason="needs bubblewrap (apt-get install bubblewrap)"
        ),
    ),
]


class NoArgs(BaseModel):
    pass


DONE = ToolSpec(
    name="done",
    description="Finish.",
    arguments=NoArgs,
    render=lambda a: "echo ok",
    ends_episode=True,
)


@pytest.fixture(autouse=True)
def done_tool() -> Iterator[None]:
    reset_plugins()

    @hookimpl
    def uniagent_tools() -> list[ToolSpec]:
        return [DONE]

    load_plugins().register(types.SimpleNamespace(uniagent_tools=uniagent_tools), "test-tools")
    yield
    reset_plugins()


def stdio_server(**more: Any) -> dict[str, Any]:
    return {
        "name": "demo",
        "command": [sys.executable, str(SERVER)],
        "python": sys.executable,
        **more,
    }


def agent_config(
    server: dict[str, Any], isolation: str = "none", **interaction: Any
) -> AgentConfig:
    deployment: dict[str, Any] = {"type": "host", "isolation": isolation}
    if isolation == "bwrap":  # the sandbox sees the interpreter with `mcp`, and the server
        deployment["ro_binds"] = [sys.base_prefix, str(VENV), str(SERVER.parent)]
    return AgentConfig.from_dict(
        {
            "tools": ["done", {"mcp": server}],
            "instance_template": "{q}",
            "env": {"deployment": deployment},
            "interaction": {"max_turns": 12, **interaction},
        }
    )


async def run_one(config: AgentConfig, script: list[str], tokenizer: Any, out: Path) -> Path:
    model = ScriptedTokenModel(tokenizer, script)
    await run(
        config,
        [Task("t", {"q": "use the tools"})],
        [],
        lambda: model,
        out,
        retries=0,  # an infrastructure failure is what some tests look for: not retried
        progress=Progress(io.StringIO(), live=False),
    )
    (episode,) = (out / "episodes").glob("*/0")
    return episode


def outputs(episode: Path) -> list[str]:
    """The observations the model got, in order (text-mode calls come back as user turns)."""
    messages = json.loads((episode / "messages.json").read_text())
    return [str(m["content"]) for m in messages[2:] if m["role"] in ("user", "tool")]


@pytest.mark.parametrize("isolation", ISOLATIONS)
async def test_stdio_server_in_the_sandbox_lists_and_calls_its_tools(
    isolation: str, qwen3_tokenizer: Any, tmp_path: Path
) -> None:
    config = agent_config(stdio_server(exclude=["hang", "pid"]), isolation)
    script = [
        hermes_call("add", {"a": 2, "b": 40}),
        hermes_call("write_note", {"name": "note.txt", "text": "hello"}),
        hermes_call("add", {"a": "two"}),  # a schema violation: the server is never asked
        hermes_call("fail", {"reason": "because"}),  # the tool raises
        hermes_call("crash"),  # the server process dies mid-call
        hermes_call("add", {"a": 1, "b": 1}),  # the next call starts a fresh server
        hermes_call("done"),
    ]
    episode = await run_one(config, script, qwen3_tokenizer, tmp_path / "out")
    result = json.loads((episode / "result.json").read_text())
    assert result["exit_reason"] == "finished", result
    added, wrote, invalid, failed, crashed, again = outputs(episode)
    assert "42" in added and "[exit code" not in added
    # The server ran in the episode's work dir, inside the sandbox (bwrap: /work there).
    assert "wrote 5 characters to " in wrote and "note.txt" in wrote
    assert 'parameter "a"' in invalid and "integer" in invalid and "missing" in invalid
    assert "Error executing tool fail" in failed and "[exit code 1]" in failed
    assert "the MCP server failed" in crashed and "[exit code 2]" in crashed
    assert "2" in again and "[exit code" not in again
    # The tools the model saw are saved with the episode, with the server's schemas.
    tools = {
        t["function"]["name"]: t["function"]
        for t in json.loads((episode / "rollout.json").read_text())["tools"]
    }
    assert set(tools) == {"done", "add", "write_note", "fail", "crash"}  # `hang` excluded
    assert tools["add"]["parameters"]["properties"]["a"]["type"] == "integer"
    assert tools["add"]["parameters"]["required"] == ["a", "b"]
    assert result["metrics"]["tool_calls"]["add"] == 2


async def test_a_call_that_never_answers_is_bounded_by_the_server_timeout(
    qwen3_tokenizer: Any, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    config = AgentConfig.from_dict(
        {
            **agent_config(stdio_server(include=["hang"], timeout=1)).model_dump(),
            "env": {"workdir": str(work), "deployment": {"type": "host", "isolation": "none"}},
        }
    )
    script = [hermes_call("hang"), hermes_call("done")]
    episode = await run_one(config, script, qwen3_tokenizer, tmp_path / "out")
    assert json.loads((episode / "result.json").read_text())["exit_reason"] == "finished"
    (hung,) = outputs(episode)
    assert (work / "hang.started").exists(), "the server got the call"
    assert "did not answer within 1" in hung and "[exit code 3]" in hung


async def test_a_call_that_outlives_the_action_timeout_is_a_timeout(
    qwen3_tokenizer: Any, tmp_path: Path
) -> None:
    # No server timeout: the action timeout interrupts the call, as any command's.
    config = agent_config(stdio_server(include=["hang"]), action_timeout=20, timeout_budget=0)
    episode = await run_one(config, [hermes_call("hang")], qwen3_tokenizer, tmp_path / "out")
    assert json.loads((episode / "result.json").read_text())["exit_reason"] == "timeout_error"


async def test_a_server_that_does_not_start_is_an_infrastructure_failure(
    qwen3_tokenizer: Any, tmp_path: Path
) -> None:
    config = agent_config(
        {
            "name": "broken",
            "command": [
                sys.executable,
                "-c",
                "import sys; print('no such server', file=sys.stderr); sys.exit(5)",
            ],
            "python": sys.executable,
        }
    )
    episode = await run_one(config, [hermes_call("done")], qwen3_tokenizer, tmp_path / "out")
    result = json.loads((episode / "result.json").read_text())
    assert result["exit_reason"] == "env_error" and result["traj_masked"] is True
    assert "MCP server 'broken' did not list its tools" in result["error"]
    assert "no such server" in result["error"]


async def test_include_naming_a_missing_tool_fails_the_set_up(
    qwen3_tokenizer: Any, tmp_path: Path
) -> None:
    config = agent_config(stdio_server(include=["add", "nope"]))
    episode = await run_one(config, [hermes_call("done")], qwen3_tokenizer, tmp_path / "out")
    result = json.loads((episode / "result.json").read_text())
    assert result["exit_reason"] == "env_error" and "has no tool 'nope'" in result["error"]


@pytest.fixture
def http_server() -> Iterator[str]:
    process = subprocess.Popen(
        [sys.executable, str(SERVER), "http"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None
        port = int(process.stdout.readline())  # printed once the socket listens
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.kill()
        process.wait()


async def test_streamable_http_server(
    http_server: str, qwen3_tokenizer: Any, tmp_path: Path
) -> None:
    server = {
        "name": "web",
        "transport": "streamable-http",
        "url": http_server,
        "python": sys.executable,
        "include": ["add", "fail"],
    }
    script = [
        hermes_call("add", {"a": 5, "b": 6}),
        hermes_call("fail", {"reason": "x"}),
        hermes_call("done"),
    ]
    episode = await run_one(agent_config(server), script, qwen3_tokenizer, tmp_path / "out")
    assert json.loads((episode / "result.json").read_text())["exit_reason"] == "finished"
    added, failed = outputs(episode)
    assert "11" in added and "[exit code 1]" in failed


async def run_tasks(
    config: AgentConfig, script: list[str], tokenizer: Any, out: Path, n: int, **options: Any
) -> dict[str, Any]:
    """``n`` tasks, one at a time, the model's script shared in order: each task's result
    and the observations its model got."""
    model = ScriptedTokenModel(tokenizer, script)
    await run(
        config,
        [Task(f"t{i}", {"q": "use the tools"}) for i in range(n)],
        [],
        lambda: model,
        out,
        progress=Progress(io.StringIO(), live=False),
        concurrency=1,
        **options,
    )
    return {
        p.parent.parent.name: (json.loads(p.read_text()), outputs(p.parent))
        for p in (out / "episodes").glob("*/0/result.json")
    }


def served_pid(text: str) -> int:
    assert text.startswith("pid "), text
    return int(text.split()[1])


def gone(pid: int) -> bool:
    """Whether process ``pid`` has exited (and was reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.parametrize("isolation", ISOLATIONS)
async def test_a_process_wide_server_is_shared_by_the_runs_episodes(
    isolation: str, qwen3_tokenizer: Any, tmp_path: Path
) -> None:
    config = agent_config(stdio_server(scope="process", include=["pid", "add", "fail"]), isolation)
    script = [
        hermes_call("pid"),
        hermes_call("add", {"a": 2, "b": 40}),
        hermes_call("fail", {"reason": "because"}),  # a tool error: fed back, as always
        hermes_call("done"),
        hermes_call("pid"),
        hermes_call("done"),
    ]
    episodes = await run_tasks(config, script, qwen3_tokenizer, tmp_path / "out", 2)
    (first, first_outputs), (second, second_outputs) = episodes["t0"], episodes["t1"]
    assert first["exit_reason"] == second["exit_reason"] == "finished", (first, second)
    pid, added, failed = first_outputs
    # One server for both episodes, run by this process (not in the sandbox: its cwd is ours).
    assert served_pid(pid) == served_pid(second_outputs[0]) != os.getpid()
    assert pid.strip().endswith(f"cwd {os.getcwd()}")
    assert "42" in added and "[exit code" not in added
    assert "Error executing tool fail" in failed and "[exit code 1]" in failed
    # The run stopped it at its end, and removed its socket.
    assert gone(served_pid(pid))
    assert not list(socket_dir().glob("demo-*.sock"))


@pytest.mark.parametrize("isolation", ISOLATIONS)
async def test_a_process_wide_server_that_crashes_under_a_call_is_the_calls_error(
    isolation: str, qwen3_tokenizer: Any, tmp_path: Path
) -> None:
    """A call that crashes the shared server gets the failure as its observation (as in the
    sandbox): never masked, or the policy could mask its own episodes by crashing it. The
    next episode finds it gone and starts a fresh one."""
    config = agent_config(stdio_server(scope="process", include=["pid", "crash"]), isolation)
    script = [
        hermes_call("pid"),
        hermes_call("crash"),  # the call brings the shared server down
        hermes_call("done"),
        hermes_call("pid"),  # the next episode: a fresh server
        hermes_call("done"),
    ]
    out = tmp_path / "out"
    episodes = await run_tasks(config, script, qwen3_tokenizer, out, 2, retries=0)
    (crashed, crashed_outputs), (later, later_outputs) = episodes["t0"], episodes["t1"]
    assert crashed["exit_reason"] == "finished" and crashed["traj_masked"] is False
    assert "the MCP server failed" in crashed_outputs[1] and "[exit code 2]" in crashed_outputs[1]
    assert later["exit_reason"] == "finished"
    assert served_pid(later_outputs[0]) != served_pid(crashed_outputs[0])
    assert gone(served_pid(crashed_outputs[0])) and gone(served_pid(later_outputs[0]))


async def test_a_process_wide_server_that_does_not_start_is_an_infrastructure_failure(
    qwen3_tokenizer: Any, tmp_path: Path
) -> None:
    broken = {
        "name": "broken",
        "scope": "process",
        "command": [sys.executable, "-c", "import sys; print('no server', file=sys.stderr)"],
    }
    config = agent_config(broken)
    out = tmp_path / "out"
    ((result, _),) = (await run_tasks(config, [], qwen3_tokenizer, out, 1, retries=0)).values()
    assert result["exit_reason"] == "env_error" and result["traj_masked"] is True
    assert "MCP server 'broken' (scope: process) did not start" in result["error"]
    assert "no server" in result["error"]


async def test_a_process_wide_server_is_started_once_and_its_socket_keeps_its_filters(
    tmp_path: Path,
) -> None:
    server = McpServerConfig.model_validate(stdio_server(scope="process", exclude=["crash"]))
    process = await ensure_mcp_server(server)
    try:
        assert await ensure_mcp_server(server) is process  # started once
        # The socket is the sandbox's to use: a tool left out stays out there too.
        settings = tmp_path / "server.json"
        settings.write_text(json.dumps({"socket": str(process.socket), "timeout": 30}))
        for tool, code, says in (("add", 0, "3"), ("crash", 1, "gives no tool 'crash'")):
            called = await asyncio.to_thread(
                subprocess.run,
                [sys.executable, str(HELPER), str(settings), "call", tool, '{"a": 1, "b": 2}'],
                capture_output=True,
                text=True,
            )
            assert called.returncode == code and says in called.stdout, called
    finally:
        await close_mcp_servers()
    assert process.failed() == "stopped"


def test_process_scope_needs_a_host_deployment_and_stdio() -> None:
    server = {"name": "a", "command": ["x"], "scope": "process"}
    with pytest.raises(ConfigError, match="tools.1.mcp.scope: process needs a host deployment"):
        resolve(
            AgentConfig.from_dict(
                {
                    "tools": ["done", {"mcp": server}],
                    "env": {"deployment": {"type": "local", "image": "python:3.12"}},
                }
            )
        )
    with pytest.raises(ConfigError, match="`scope` is for transport stdio".replace("`", ".")):
        AgentConfig.from_dict(
            {
                "tools": [
                    {
                        "mcp": {
                            "name": "a",
                            "transport": "streamable-http",
                            "url": "u",
                            "scope": "process",
                        }
                    }
                ]
            }
        )
    # Its sockets' folder is made visible to the sandbox.
    agent = resolve(
        AgentConfig.from_dict(
            {
                "tools": ["done", {"mcp": server}],
                "env": {"deployment": {"type": "host", "isolation": "bwrap"}},
            }
        )
    )
    assert str(socket_dir()) in agent.deployment_config.ro_binds


@pytest.mark.parametrize(
    ("server", "message"),
    [
        ({"name": "a", "command": ["x"], "comand": ["y"]}, "tools.1.mcp.comand: unknown key"),
        ({"name": "a"}, "tools.1.mcp: a stdio server needs `command`"),
        ({"name": "a", "transport": "streamable-http"}, "needs `url`"),
        ({"name": "a", "transport": "sse", "url": "u"}, "tools.1.mcp.transport"),
        ({"name": "a b", "command": ["x"]}, "tools.1.mcp.name"),
        ({"name": "a", "command": ["x"], "include": ["t"], "exclude": ["t"]}, "both included"),
    ],
)
def test_the_mcp_block_is_checked_before_any_sandbox_starts(
    server: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message.replace("`", ".").replace("(", r"\(")):
        AgentConfig.from_dict({"tools": ["done", {"mcp": server}]})


def test_resolve_keeps_the_servers_and_refuses_one_listed_twice() -> None:
    server = {"name": "fs", "command": ["srv"]}
    agent = resolve(AgentConfig.from_dict({"tools": ["done", {"mcp": server}]}))
    assert [t.name for t in agent.tools] == ["done"]
    assert [s.name for s in agent.mcp_servers] == ["fs"]
    assert agent.config.tool_names == ("done", "mcp:fs")
    with pytest.raises(ConfigError, match="'mcp:fs' is listed twice"):
        resolve(AgentConfig.from_dict({"tools": [{"mcp": server}, {"mcp": server}]}))
    with pytest.raises(ConfigError, match="takes no `name`"):
        AgentConfig.from_dict({"tools": [{"name": "done", "mcp": server}]})


def test_plugins_report_says_mcp_is_supported() -> None:
    report = plugins_report()
    assert report["mcp"]["supported"] is True
    assert report["mcp"]["config"] == "tools: [{mcp: {name, command | url, ...}}]"


def test_plugins_report_with_a_config_lists_its_servers_tools(tmp_path: Path) -> None:
    broken = {"name": "broken", "command": [sys.executable, "-c", "import sys; sys.exit(3)"]}
    config = agent_config(stdio_server(include=["add", "fail"]))
    data = config.model_dump(mode="json", exclude_unset=True)
    # Only the servers: the CLI below runs without this test's `done` plugin.
    data["tools"] = [data["tools"][1], {"mcp": {**broken, "python": sys.executable}}]
    path = tmp_path / "config.yaml"
    path.write_text(json.dumps(data))
    report = plugins_report(config=str(path))
    demo, failed = report["mcp"]["servers"]
    assert demo["name"] == "demo" and demo["error"] is None
    tools = {t["name"]: t for t in demo["tools"]}
    assert set(tools) == {"add", "fail"}  # `include` applies, as in an episode
    assert tools["add"]["server"] == "demo" and tools["add"]["ends_episode"] is False
    schema = tools["add"]["schema"]["function"]
    assert schema["name"] == "add" and schema["parameters"]["required"] == ["a", "b"]
    # A server that does not list its tools is an error of the report (exit 1), by name.
    assert failed["tools"] == [] and "MCP server 'broken'" in failed["error"]
    assert failed["error"] in report["errors"]
    cli = subprocess.run(
        [sys.executable, "-m", "uniagent.cli", "plugins", "--config", str(path)],
        capture_output=True,
        text=True,
    )
    assert cli.returncode == 1, cli.stderr
    assert "MCP server demo (stdio): tools: add, fail" in cli.stdout
    assert "MCP server broken (stdio): tools: none" in cli.stdout
    assert "error: MCP server 'broken' did not list its tools" in cli.stderr
