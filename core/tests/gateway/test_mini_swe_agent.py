"""A real harness through the gateway: mini-swe-agent (from pip) with its litellm model and
its default config, pointed at a session's base URL, finishes a scripted task; the saved
tree is one token-exact branch. (Its LocalEnvironment runs the commands in a temporary
folder on this machine, not in a uniagent sandbox.)"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

import yaml
from conftest import check_tree

from uniagent.testing.scripted import hermes_call

# litellm fetches a cost map from GitHub at import unless told to use its bundled copy.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
import minisweagent  # noqa: F401  (the nox gateway suite installs it)


def test_mini_swe_agent_finishes_a_task_through_the_gateway(
    served, backend, tmp_path: Path, monkeypatch
) -> None:
    from minisweagent.agents.default import DefaultAgent
    from minisweagent.environments.local import LocalEnvironment
    from minisweagent.models.litellm_model import LitellmModel

    monkeypatch.setenv("MSWEA_COST_TRACKING", "ignore_errors")
    backend.script.extend(
        [
            "<think>\nWrite the file first.\n</think>\n\n"
            + hermes_call(
                "bash", {"command": "echo hello > out.txt && cat out.txt"}, "Writing it."
            ),
            hermes_call("bash", {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"}),
        ]
    )
    session = served.gateway.open_session()
    config = yaml.safe_load(
        (resources.files("minisweagent") / "config" / "default.yaml").read_text()
    )
    model = LitellmModel(
        model_name="openai/scripted",
        cost_tracking="ignore_errors",
        model_kwargs={"api_base": served.base_url(session) + "/v1", "api_key": session.key},
        observation_template=config["model"]["observation_template"],
        format_error_template=config["model"]["format_error_template"],
    )
    agent = DefaultAgent(
        model, LocalEnvironment(cwd=str(tmp_path)), **{**config["agent"], "step_limit": 5}
    )
    result = agent.run("Write hello into out.txt.")
    assert result.get("exit_status") == "Submitted", result
    assert (tmp_path / "out.txt").read_text() == "hello\n"
    closed = served.gateway.close(session.id)
    turns = closed["tree"]["turns"]
    assert [t["source"] for t in turns] == ["render", "extension"]
    assert closed["tree"]["branches"] == 1
    assert [t["exact"] for t in turns] == [True, True], [t["drift"] for t in turns]
    check_tree(session.tree, backend)
