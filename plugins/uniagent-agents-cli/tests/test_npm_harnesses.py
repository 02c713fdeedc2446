"""Claude Code and Codex (from npm, pinned, installed into the cache) each solve a scripted
task end to end through `uniagent run`: in a bubblewrap sandbox, with a gateway session in
front of a scripted token model; the reward is graded, the tree saved and token-exact."""

from __future__ import annotations

from conftest import check_solved, harness_config, run_one

from uniagent.testing import ScriptedTokenModel, hermes_call


async def test_claude_code_solves_a_task_through_uniagent_run(qwen3_tokenizer, tmp_path):
    script = [hermes_call("Bash", {"command": "echo hello > out.txt"}, "Writing it."), "Done."]
    model = ScriptedTokenModel(qwen3_tokenizer, script)
    done = await run_one(harness_config("claude-code"), model, tmp_path / "out")
    assert done["result"]["submission"] == "Done."
    check_solved(done, script, qwen3_tokenizer, "messages")


async def test_codex_solves_a_task_through_uniagent_run(qwen3_tokenizer, tmp_path):
    script = [hermes_call("exec_command", {"cmd": "echo hello > out.txt"}), "Done."]
    model = ScriptedTokenModel(qwen3_tokenizer, script)
    done = await run_one(harness_config("codex"), model, tmp_path / "out")
    check_solved(done, script, qwen3_tokenizer, "responses")
