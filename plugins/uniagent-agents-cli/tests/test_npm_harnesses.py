"""Claude Code and Codex (from npm, pinned, installed into the cache) each solve a scripted
task end to end through `uniagent run`: in a bubblewrap sandbox, with a gateway session in
front of a scripted token model, in this process or served (`--model openai:...`: the
gateway sends a server's /v1/completions the prompt ids); the reward is graded, the tree
saved and token-exact."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import check_solved, harness_config, run_one

from uniagent.testing import (
    ScriptedChatServer,
    ScriptedTokenModel,
    hermes_call,
    qwen3_tokenizer_path,
    served_token_model,
)


@pytest.fixture(params=["in-process", "served"])
def scripted(request: pytest.FixtureRequest, qwen3_tokenizer: Any) -> Any:
    """A token model replaying a script: in this process, or an openai: server's."""

    @contextlib.contextmanager
    def model(script: list[str]) -> Iterator[Any]:
        if request.param == "in-process":
            yield ScriptedTokenModel(qwen3_tokenizer, script)
            return
        with ScriptedChatServer.completing(qwen3_tokenizer, script) as server:
            yield served_token_model(server.base_url, qwen3_tokenizer_path())
            assert server.requests and all("prompt" in r for r in server.requests)

    return model


async def test_claude_code_solves_a_task_through_uniagent_run(scripted, qwen3_tokenizer, tmp_path):
    script = [hermes_call("Bash", {"command": "echo hello > out.txt"}, "Writing it."), "Done."]
    with scripted(script) as model:
        done = await run_one(harness_config("claude-code"), model, tmp_path / "out")
    assert done["result"]["submission"] == "Done."
    check_solved(done, script, qwen3_tokenizer, "messages")


async def test_codex_solves_a_task_through_uniagent_run(scripted, qwen3_tokenizer, tmp_path):
    script = [hermes_call("exec_command", {"cmd": "echo hello > out.txt"}), "Done."]
    with scripted(script) as model:
        done = await run_one(harness_config("codex"), model, tmp_path / "out")
    check_solved(done, script, qwen3_tokenizer, "responses")
