"""mini-swe-agent (from pip, installed into the cache) solves a scripted task end to end
through `uniagent run`: in a bubblewrap sandbox, with a gateway session in front of a
scripted token model; its reward is graded and its tree saved, token-exact."""

from __future__ import annotations

from conftest import harness_config, run_one

from uniagent.rollout import RolloutCache
from uniagent.testing.scripted import ScriptedTokenModel, hermes_call


def _path_of(tree: dict) -> tuple[list[int], list[int]]:
    nodes = {n["id"]: n for n in tree["nodes"]}
    leaf = max(nodes)  # one branch: the last node is its leaf
    ids, mask = [], []
    chain = []
    while leaf:
        chain.append(nodes[leaf])
        leaf = nodes[leaf]["parent"]
    for node in reversed(chain):
        ids += node["ids"]
        mask += node["mask"]
    return ids, mask


async def test_mini_swe_agent_solves_a_task_through_uniagent_run(qwen3_tokenizer, tmp_path):
    script = [
        hermes_call("bash", {"command": "echo hello > out.txt && cat out.txt"}, "Writing it."),
        hermes_call("bash", {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"}),
    ]
    model = ScriptedTokenModel(qwen3_tokenizer, script)
    done = await run_one(harness_config("mini-swe-agent"), model, tmp_path / "out")
    result, rollout = done["result"], done["rollout"]
    assert result["exit_reason"] == "finished", (result, done["log"][-3000:])
    assert result["traj_masked"] is False and result["reward"] == 1.0
    assert result["outcome"] == "policy"
    tree = rollout["tree"]
    assert tree["branches"] == 1
    assert [t["source"] for t in tree["turns"]] == ["render", "extension"]
    assert [t["exact"] for t in tree["turns"]] == [True, True]
    # Token-exact: every id the model generated is in the tree, masked 1, in order.
    wanted = [qwen3_tokenizer.encode(s, add_special_tokens=False) for s in script]
    ids, mask = _path_of(tree)
    generated = [i for i, m in zip(ids, mask) if m]
    eot = rollout["eot_id"]
    assert generated == [*wanted[0], eot, *wanted[1], eot]
    # The linear rollout (what existing readers read) is the branch, exactly.
    assert rollout["prompt_ids"] + rollout["response_ids"] == ids
    assert rollout["response_mask"] == mask[len(rollout["prompt_ids"]) :]
    cache = RolloutCache.from_dict(rollout, qwen3_tokenizer)
    assert cache.messages[-1]["role"] == "assistant"
    assert "trajectory.json" in done["log"]  # its own log is kept in the episode log
