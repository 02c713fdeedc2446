"""mini-swe-agent (from pip, installed into the cache) solves a scripted task end to end
through `uniagent run`: in a bubblewrap sandbox, with a gateway session in front of a
scripted token model; its reward is graded and its tree saved, token-exact."""

from __future__ import annotations

from conftest import check_solved, harness_config, run_one

from uniagent.testing import ScriptedTokenModel, hermes_call


async def test_mini_swe_agent_solves_a_task_through_uniagent_run(qwen3_tokenizer, tmp_path):
    script = [
        hermes_call("bash", {"command": "echo hello > out.txt && cat out.txt"}, "Writing it."),
        hermes_call("bash", {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"}),
    ]
    model = ScriptedTokenModel(qwen3_tokenizer, script)
    done = await run_one(harness_config("mini-swe-agent"), model, tmp_path / "out")
    check_solved(done, script, qwen3_tokenizer)
    assert "trajectory.json" in done["log"]  # its own log is kept in the episode log
