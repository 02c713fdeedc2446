"""The OpenHands SDK agent (from pip, into the cache, on a Python >= 3.12 found here) solves
a scripted task end to end through `uniagent run`: in a bubblewrap sandbox that sees its
interpreter read-only, with a gateway session in front of a scripted token model; its
reward is graded, its tree saved, token-exact, and its step limit is the policy's."""

from __future__ import annotations

from conftest import check_solved, harness_config, run_one

from uniagent.testing import ScriptedTokenModel, hermes_call

WRITE = hermes_call("terminal", {"command": "echo hello > out.txt && cat out.txt"}, "Writing it.")


async def test_openhands_solves_a_task_through_uniagent_run(qwen3_tokenizer, tmp_path):
    script = [WRITE, hermes_call("finish", {"message": "Wrote hello into out.txt."})]
    model = ScriptedTokenModel(qwen3_tokenizer, script)
    done = await run_one(harness_config("openhands"), model, tmp_path / "out")
    check_solved(done, script, qwen3_tokenizer)
    assert "openhands-events.jsonl" in done["log"]  # its own event log is kept


async def test_openhands_past_its_step_limit_is_the_policys(qwen3_tokenizer, tmp_path):
    script = [WRITE, hermes_call("terminal", {"command": "cat out.txt"})]
    model = ScriptedTokenModel(qwen3_tokenizer, script)
    config = harness_config("openhands", {"max_iterations": 2})
    done = await run_one(config, model, tmp_path / "out")
    result = done["result"]
    assert result["exit_reason"] == "max_step_limit", (result, done["log"][-3000:])
    assert result["traj_masked"] is False and result["reward"] == 1.0  # out.txt is right


def test_how_a_run_ended_is_read_from_the_launchers_own_lines():
    from uniagent_agents_cli.openhands import STARTED, STATUS, OpenHandsSettings, outcome

    settings = OpenHandsSettings()
    # never started its conversation (the SDK did not import): before the policy acted
    assert outcome(1, "Traceback ... ImportError", settings).exit_reason == "env_error"
    started = f"{STARTED}\n"
    assert outcome(0, f"{started}{STATUS}finished -\n", settings).exit_reason == "finished"
    limit = f"{started}{STATUS}error MaxIterationsReached\n"
    assert outcome(0, limit, settings).exit_reason == "max_step_limit"
    # killed mid-run (by the agent's own command, say), or stuck: the policy's outcome
    assert outcome(-9, started, settings).exit_reason == "format_error"
    assert outcome(0, f"{started}{STATUS}stuck -\n", settings).exit_reason == "format_error"
