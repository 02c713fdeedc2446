"""A harness episode through `uniagent run`: the harness runs in the sandbox through a
gateway session; its exit, time-out and crash map to exit reasons, the backend's failure
is infrastructure, and its tree is saved in rollout.json (with every branch)."""

from __future__ import annotations

import asyncio
import io
import json
import re
import types
from pathlib import Path
from typing import Any, ClassVar

import pytest

from uniagent.agents import gateways
from uniagent.config import AgentConfig
from uniagent.errors import ConfigError
from uniagent.models.base import ModelError
from uniagent.parsers.base import (
    ParseResult,
    ToolCall,
    ToolCallFormatError,
    example_call,
    format_error,
    validate_call,
)
from uniagent.rollout import Rollout
from uniagent.run.progress import Progress
from uniagent.run.runner import run
from uniagent.tasks import Task
from uniagent.testing.harness import tiny_config
from uniagent.testing.scripted import ScriptedTokenModel, hermes_call


async def _run(agent_config: AgentConfig, model, out: Path) -> dict:
    await run(
        agent_config,
        [Task("t", {"problem_statement": "Write hello."})],
        [],
        lambda: model,
        out,
        retries=0,
        progress=Progress(io.StringIO(), live=False),
    )
    episode = out / "episodes" / "t" / "0"
    rollout = episode / "rollout.json"
    return {
        "result": json.loads((episode / "result.json").read_text()),
        "rollout": json.loads(rollout.read_text()) if rollout.exists() else None,
        "log": (episode / "log.txt").read_text(),
    }


WRITE = hermes_call("bash", {"command": "echo hello > out.txt"})


async def test_a_harness_solves_the_task_and_is_graded(tiny, qwen3_tokenizer, tmp_path) -> None:
    model = ScriptedTokenModel(qwen3_tokenizer, [WRITE, "Done."])
    done = await _run(tiny_config(), model, tmp_path / "out")
    result, rollout = done["result"], done["rollout"]
    assert result["exit_reason"] == "finished", done["log"][-2000:]
    assert result["reward"] == 1.0 and result["traj_masked"] is False
    assert rollout["tree"]["branches"] == 1 and len(rollout["tree"]["turns"]) == 2
    assert all(t["exact"] for t in rollout["tree"]["turns"])
    reply = qwen3_tokenizer.encode(WRITE, add_special_tokens=False) + [rollout["eot_id"]]
    gen = [i for i, m in zip(rollout["response_ids"], rollout["response_mask"]) if m]
    assert gen[: len(reply)] == reply
    # The run's gateway keeps no finished session (a long run's memory stays flat).
    assert all(not server.gateway.sessions for _, server in gateways._running.values())
    # Readers of linear episodes load it as a token rollout: the tree's main branch.
    cache = Rollout.from_dict(rollout, qwen3_tokenizer)
    assert cache.prompt_ids == rollout["prompt_ids"] and cache.messages[-1]["role"] == "assistant"
    assert cache.check_exactness().ok


class SlowModel(ScriptedTokenModel):
    """A scripted model that spends at least :data:`GENERATION` seconds on each reply."""

    async def _generate(self, prompt_ids: list[int], max_tokens: int | None) -> Any:
        await asyncio.sleep(GENERATION)
        return await super()._generate(prompt_ids, max_tokens)


GENERATION = 0.5


async def test_a_harness_episode_reports_the_time_spent_in_the_model(
    tiny, qwen3_tokenizer, tmp_path
) -> None:
    """The gateway's time waiting for the model is the episode's model time (the results and
    the summary), as the built-in loop's time in ``generate`` is; not the harness's own."""
    model = SlowModel(qwen3_tokenizer, [WRITE, "Done."])
    done = await _run(tiny_config(), model, tmp_path / "out")
    metrics = done["result"]["metrics"]
    assert done["result"]["exit_reason"] == "finished", done["log"][-2000:]
    assert metrics["model_seconds"] >= 2 * GENERATION  # two replies, each at least that long
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["time_seconds"]["model_seconds"] == pytest.approx(
        metrics["model_seconds"], abs=1e-3
    )


async def test_a_harness_exiting_non_zero_is_the_policys_outcome(
    tiny, qwen3_tokenizer, tmp_path
) -> None:
    model = ScriptedTokenModel(qwen3_tokenizer, ["I give up."])
    done = await _run(tiny_config({"exit_with": 2}), model, tmp_path / "out")
    result = done["result"]
    assert result["exit_reason"] == "format_error" and result["traj_masked"] is False
    assert result["outcome"] == "policy" and result["reward"] == 0.0


async def test_a_harness_past_its_time_limit_is_a_timeout(tiny, qwen3_tokenizer, tmp_path) -> None:
    model = ScriptedTokenModel(qwen3_tokenizer, [hermes_call("bash", {"command": "sleep 600"})])
    done = await _run(tiny_config({"timeout": 3}), model, tmp_path / "out")
    assert done["result"]["exit_reason"] == "timeout_error"
    assert done["result"]["traj_masked"] is False


async def test_a_harness_whose_history_outgrows_the_context_ends_at_the_token_limit(
    tiny, qwen3_tokenizer, tmp_path
) -> None:
    """The gateway refuses a prompt with no room left in the model's context (the API's
    400): the policy's end (``token_limit``, trained on), never the backend's failure."""
    big = hermes_call("bash", {"command": "seq 1 3000; echo hello > out.txt"})
    model = ScriptedTokenModel(qwen3_tokenizer, [big, "Done."], max_model_len=2000)
    done = await _run(tiny_config(), model, tmp_path / "out")
    result = done["result"]
    assert result["exit_reason"] == "token_limit", (result, done["log"][-2000:])
    assert result["traj_masked"] is False and result["outcome"] == "policy"
    assert "context" in result["error"] and "max_model_len" in result["error"]
    assert result["reward"] == 1.0  # graded as usual: out.txt says hello
    assert "context length exceeded" in done["log"]  # what the harness was told


async def test_the_backend_failing_under_a_harness_is_infrastructure(
    tiny, qwen3_tokenizer, tmp_path
) -> None:
    model = ScriptedTokenModel(qwen3_tokenizer, [ModelError("the server went away")])
    done = await _run(tiny_config(), model, tmp_path / "out")
    result = done["result"]
    assert result["exit_reason"] == "model_error" and result["traj_masked"] is True
    assert result["outcome"] == "infrastructure" and result["reward"] is None
    assert "the server went away" in result["error"]


async def test_a_harness_whose_model_failed_is_ended_at_once_not_left_to_retry(
    tiny, qwen3_tokenizer, tmp_path
) -> None:
    """Once the token backend failed under it the episode is infrastructure whatever the
    harness does next: a harness whose client retries (for ever, here) is ended then, not at
    its time-out, and the episode is ``model_error`` (retried by the run)."""
    model = ScriptedTokenModel(qwen3_tokenizer, [ModelError("the server went away")])
    done = await _run(tiny_config({"retry_errors": True, "timeout": 900}), model, tmp_path / "out")
    result = done["result"]
    assert result["exit_reason"] == "model_error" and result["outcome"] == "infrastructure"
    assert "the server went away" in result["error"]
    assert (
        "the token backend failed under the harness: the server went away: ending the agent's "
        "session and its processes"
    ) in done["log"]
    assert "ran past" not in done["log"]


async def test_a_harness_that_starts_over_saves_every_branch(tiny, qwen3_tokenizer, tmp_path):
    model = ScriptedTokenModel(qwen3_tokenizer, [WRITE, "Done.", "Done again."])
    done = await _run(tiny_config({"restarts": 1}), model, tmp_path / "out")
    assert done["result"]["exit_reason"] == "finished" and done["result"]["reward"] == 1.0
    tree = done["rollout"]["tree"]
    assert tree["branches"] == 2 and len(tree["turns"]) == 3
    # The saved linear rollout is the last-served branch: the restarted conversation.
    gen = [
        i for i, m in zip(done["rollout"]["response_ids"], done["rollout"]["response_mask"]) if m
    ]
    eot = done["rollout"]["eot_id"]
    assert gen == [*qwen3_tokenizer.encode("Done again.", add_special_tokens=False), eot]


async def test_a_model_the_gateway_cannot_serve_is_refused_before_any_episode(tiny, tmp_path):
    with pytest.raises(ConfigError, match="agent 'tiny' is a harness: it needs a token model"):
        await _run(tiny_config(), object(), tmp_path / "out")
    assert not (tmp_path / "out" / "episodes").exists()


async def test_a_guided_model_is_refused_for_a_harness_before_any_episode(
    tiny, qwen3_tokenizer, tmp_path
) -> None:
    # The gateway hands a harness's requests to the model as prompt ids: no guided turn is
    # ever opened, so every attempt would end model_error (uniagent run refuses the spec).
    from uniagent.models.hf import HFLocalModel

    model = HFLocalModel(object(), qwen3_tokenizer, guided="tool_call")  # never generates
    with pytest.raises(ConfigError, match=r"agent 'tiny' is a harness.*guided decoding"):
        await _run(tiny_config(), model, tmp_path / "out")
    assert not (tmp_path / "out" / "episodes").exists()


async def test_a_harness_that_edits_the_tests_is_caught_as_the_built_in_loop_would_be(
    tiny, qwen3_tokenizer, tmp_path
) -> None:
    """The harness runs as the agent: the grader's baseline and protections hold for it."""
    agent_config = AgentConfig.from_dict(
        {
            "agent": {"name": "tiny"},
            "env": {
                "deployment": {"type": "host", "isolation": "bwrap", "network": True},
                "post_setup": ["mkdir -p tests && echo 'grep -qx hello out.txt' > tests/check.sh"],
            },
            "reward": {
                "name": "command",
                "settings": {"command": "sh tests/check.sh"},
                "integrity": {"protect_paths": ["tests/"]},
            },
        }
    )
    tamper = hermes_call("bash", {"command": "echo 'exit 0' > tests/check.sh"})
    model = ScriptedTokenModel(qwen3_tokenizer, [tamper, "Done."])
    done = await _run(agent_config, model, tmp_path / "out")
    result = done["result"]
    assert result["exit_reason"] == "finished" and result["traj_masked"] is False
    assert result["reward"] == 0.0 and result["reward_info"]["score_reason"] == "tampered"
    tampered = result["reward_info"]["integrity"]["tampered"]
    assert [t["path"] for t in tampered] == ["tests/check.sh"]


@pytest.mark.parametrize(
    ("script", "reason"),
    [([ModelError("the server went away")], "model_error"), ([WRITE, "Done."], "finished")],
)
async def test_a_harness_episode_stops_the_fresh_sandbox_started_ahead(
    tiny, qwen3_tokenizer, script, reason
) -> None:
    """grade_in: fresh starts a second sandbox at the baseline; a harness episode, masked or
    graded, leaves no sandbox running (the episode's own grader is the one closed)."""
    from uniagent.env.open_envs import env_scope
    from uniagent.episode import run_episode
    from uniagent.resolver import resolve

    repo = "git init -q && git -c user.name=t -c user.email=t@t commit -q --allow-empty -m base"
    raw = tiny_config().model_dump(exclude_unset=True)
    raw["env"]["post_setup"] = [repo]
    raw["reward"]["grade_in"] = "fresh"
    agent = resolve(AgentConfig.from_dict(raw))
    with env_scope() as scope:
        result = await run_episode(
            agent,
            {"problem_statement": "Write hello."},
            ScriptedTokenModel(qwen3_tokenizer, script),
        )
        assert result.exit_reason.value == reason, result.error
        assert len(scope) == 0


class JsonBlocks:
    """A tool-call parser of a plugin, none of uniagent's classes: hermes-shaped blocks (the
    shape Qwen3's template renders calls in, so the turns stay exact) read by its own code."""

    name = "json_blocks"
    stop_sequences: tuple[str, ...] = ()
    BLOCK = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.DOTALL)
    read: ClassVar[list[str]] = []  # the texts the gateway had it read

    def parse(self, text: str, tools: Any, *, max_calls: int | None = None) -> ParseResult:
        content, calls = self.read_calls(text, None)
        if not calls:
            raise format_error("no tool call found.", "no_tool_call", self, tools, content=text)
        checked = [validate_call(n, a, tools, self, content=content) for n, a in calls]
        return ParseResult(content=content, tool_calls=checked)

    def format_tool_call(self, call: ToolCall) -> str:
        body = json.dumps({"name": call.name, "arguments": call.arguments}, ensure_ascii=False)
        return f"<tool_call>\n{body}\n</tool_call>"

    def format_example(self, tools: Any) -> str:
        return self.format_tool_call(example_call(tools))

    def format_tool_response(self, content: str) -> str:
        return f"<tool_response>\n{content}\n</tool_response>"

    def read_calls(self, text: str, tools: Any) -> tuple[str, list[tuple[str, dict[str, Any]]]]:
        JsonBlocks.read.append(text)
        calls = []
        for match in self.BLOCK.finditer(text):
            try:
                call = json.loads(match.group(1))
            except ValueError:
                raise ToolCallFormatError("a block is not JSON", "malformed") from None
            calls.append((call["name"], call["arguments"]))
        return self.BLOCK.sub("", text).strip(), calls


class Plain:
    """A parser of a plugin that cannot serve the gateway (no ``read_calls``)."""

    name = "plain"
    stop_sequences: tuple[str, ...] = ()
    parse = JsonBlocks.parse
    format_tool_call = JsonBlocks.format_tool_call
    format_example = JsonBlocks.format_example
    format_tool_response = JsonBlocks.format_tool_response


@pytest.fixture
def plugin_parsers(tiny):
    """The ``tiny`` harness and two tool parsers of a plugin."""
    from uniagent import ParserSpec, hookimpl
    from uniagent.plugins import load_plugins

    @hookimpl
    def uniagent_tool_parsers():
        yield ParserSpec(name="json_blocks", factory=JsonBlocks)
        yield ParserSpec(name="plain", factory=Plain)

    load_plugins().register(
        types.SimpleNamespace(uniagent_tool_parsers=uniagent_tool_parsers), "test-parsers"
    )
    JsonBlocks.read.clear()
    yield


@pytest.mark.usefixtures("plugin_parsers")
async def test_a_parser_of_a_plugin_serves_a_harness_through_the_gateway(
    qwen3_tokenizer, tmp_path
) -> None:
    config = tiny_config().with_overrides({"tool_parser": "json_blocks"})
    model = ScriptedTokenModel(qwen3_tokenizer, [WRITE, "Done."])
    done = await _run(config, model, tmp_path / "out")
    result, rollout = done["result"], done["rollout"]
    assert result["exit_reason"] == "finished", done["log"][-2000:]
    assert result["reward"] == 1.0, "the call the plugin's parser read ran in the sandbox"
    assert JsonBlocks.read and any("echo hello > out.txt" in text for text in JsonBlocks.read)
    assert all(t["exact"] for t in rollout["tree"]["turns"])
    reply = qwen3_tokenizer.encode(WRITE, add_special_tokens=False) + [rollout["eot_id"]]
    gen = [i for i, m in zip(rollout["response_ids"], rollout["response_mask"]) if m]
    assert gen[: len(reply)] == reply
    assert Rollout.from_dict(rollout, qwen3_tokenizer).check_exactness().ok


@pytest.mark.usefixtures("plugin_parsers")
def test_a_parser_that_cannot_serve_the_gateway_is_refused_for_a_harness_at_resolve() -> None:
    from uniagent.resolver import resolve

    with pytest.raises(ConfigError, match=r"tool_parser: agent 'tiny' is a harness.*'plain'"):
        resolve(tiny_config().with_overrides({"tool_parser": "plain"}))
    assert resolve(tiny_config().with_overrides({"tool_parser": "json_blocks"})).parser.name == (
        "json_blocks"
    )
