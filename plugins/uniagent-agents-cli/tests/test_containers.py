"""Harnesses in podman (or docker) containers: mini-swe-agent (pip), Codex and Claude Code
(npm) each solve a Harbor Dockerfile task through `uniagent run` on the ``local`` backend, the image
built from the test image (Debian bookworm with Python and node), the install folder
mounted read-only, the gateway reached on the container network's address; the reward
graded by the task's verifier, the tree token-exact. An image without node, and a task
without a network, are refused with what is missing."""

from __future__ import annotations

import shutil

import pytest
from conftest import HARBOR_TASK, check_exact, check_solved, run_harbor

from uniagent import AgentConfig
from uniagent.testing import TEST_IMAGE, ScriptedTokenModel, hermes_call


@pytest.fixture(scope="module")
def engine() -> str:
    from uniagent.testing import engine_with_test_image

    return engine_with_test_image()


def local_config(name: str, engine: str, image: str | None = None) -> AgentConfig:
    deployment = {"type": "local", "image": image or TEST_IMAGE, "engine": engine}
    return AgentConfig.from_dict(
        {
            "agent": {"name": name},
            "env": {"deployment": {**deployment, "pull": "never"}},
            "reward": {"name": "harbor"},
        }
    )


@pytest.mark.slow
async def test_mini_swe_agent_solves_a_harbor_task_in_a_container(
    engine, qwen3_tokenizer, tmp_path
):
    script = [
        hermes_call("bash", {"command": "echo hello > hello.txt && pwd"}, "Writing it."),
        hermes_call("bash", {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"}),
    ]
    model = ScriptedTokenModel(qwen3_tokenizer, script)
    done = await run_harbor(
        local_config("mini-swe-agent", engine), HARBOR_TASK, model, tmp_path / "out", TEST_IMAGE
    )
    result, log = done["result"], done["log"]
    assert result["exit_reason"] == "finished", (result, log[-3000:])
    assert result["reward"] == 1.0 and result["traj_masked"] is False
    assert result["outcome"] == "policy"
    check_exact(done["rollout"], script, qwen3_tokenizer)
    # It ran in the task's image, in its workdir, the gateway on the bridge's address.
    assert "/app" in done["rollout"]["tree"]["turns"][1]["messages"][-1]["content"]
    assert "api_base=http://" in log and "api_base=http://127.0.0.1" not in log
    assert "trajectory.json" in log


@pytest.mark.slow
async def test_codex_solves_a_harbor_task_in_a_container(engine, qwen3_tokenizer, tmp_path):
    script = [hermes_call("exec_command", {"cmd": "echo hello > hello.txt"}), "Done."]
    model = ScriptedTokenModel(qwen3_tokenizer, script)
    done = await run_harbor(
        local_config("codex", engine), HARBOR_TASK, model, tmp_path / "out", TEST_IMAGE
    )
    check_solved(done, script, qwen3_tokenizer, "responses")


@pytest.mark.slow
async def test_claude_code_solves_a_harbor_task_in_a_container(engine, qwen3_tokenizer, tmp_path):
    """Claude Code's CLI is a native executable (no node needed in the image)."""
    script = [hermes_call("Bash", {"command": "echo hello > hello.txt"}, "Writing it."), "Done."]
    model = ScriptedTokenModel(qwen3_tokenizer, script)
    config = local_config("claude-code", engine)
    done = await run_harbor(config, HARBOR_TASK, model, tmp_path / "out", TEST_IMAGE)
    assert done["result"]["submission"] == "Done."
    check_solved(done, script, qwen3_tokenizer, "messages")


@pytest.mark.slow
async def test_an_image_without_node_is_refused_by_name(engine, qwen3_tokenizer, tmp_path):
    """A task whose image has no node: Codex cannot run there, and the episode says so
    (infrastructure, masked) before the harness or the model is asked anything."""
    task = tmp_path / "no-node"
    shutil.copytree(HARBOR_TASK, task)
    dockerfile = task / "environment" / "Dockerfile"
    dockerfile.write_text(dockerfile.read_text() + "RUN rm -f /usr/bin/node /usr/bin/nodejs\n")
    model = ScriptedTokenModel(qwen3_tokenizer, ["Done."])
    config = local_config("codex", engine)
    done = await run_harbor(config, task, model, tmp_path / "out", TEST_IMAGE, retries=0)
    result = done["result"]
    assert result["exit_reason"] == "env_error" and result["traj_masked"] is True
    assert "the image has no node (@openai/codex needs node >= " in result["error"]
    assert model.calls == []


def test_a_harness_in_a_container_without_a_network_is_refused():
    """No network, no gateway: said at resolve time, naming the key."""
    from uniagent import ConfigError, resolve

    config = AgentConfig.from_dict(
        {
            "agent": {"name": "codex"},
            "env": {
                "deployment": {"type": "local", "image": "x", "run_args": ["--network", "none"]}
            },
        }
    )
    with pytest.raises(
        ConfigError, match="env.deployment.run_args: agent 'codex' .*--network none"
    ):
        resolve(config)
