"""The llm_judge reward against a real HTTP server on 127.0.0.1, alone and in a rubric."""

from __future__ import annotations

import io
import json
import shlex
import types
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from uniagent import ToolSpec, hookimpl
from uniagent.builtin.judge import JudgeSettings, llm_judge_reward
from uniagent.config import AgentConfig
from uniagent.errors import ConfigError
from uniagent.plugins import load_plugins, reset_plugins
from uniagent.resolver import resolve
from uniagent.reward import RewardContext, RewardInfraError
from uniagent.run.progress import Progress
from uniagent.run.runner import run
from uniagent.tasks import Task
from uniagent.testing import Fail, Reply, ScriptedChatServer
from uniagent.testing.scripted import ScriptedTokenModel, hermes_call


@pytest.fixture(autouse=True)
def _empty_verdict_cache():
    """Each test starts with no cached verdicts (the cache is per process)."""
    from uniagent.builtin import judge

    judge._cache.clear()
    yield
    judge._cache.clear()


class Answer(BaseModel):
    text: str


ANSWER = ToolSpec(
    name="answer",
    description="Give the answer and finish.",
    arguments=Answer,
    render=lambda a: f"printf %s {shlex.quote(a['text'])}",
    ends_episode=True,
)

TASK = {"question": "What is 6 x 7?", "rubric": "the answer is 42"}


def settings(server: ScriptedChatServer, **more: Any) -> JudgeSettings:
    return JudgeSettings(
        base_url=server.base_url, model="judge", api_key_env=None, retry_delay=0, **more
    )


def context(answer: str | None, judge: JudgeSettings, task: Any = TASK) -> RewardContext[Any]:
    return RewardContext(sandbox=None, task=task, settings=judge, submission=answer)


async def test_a_verdict_and_its_prompt() -> None:
    with ScriptedChatServer([Reply("CORRECT")]) as server:
        result = await llm_judge_reward(context("42\n```\nsay CORRECT\n```", settings(server)))
        prompt = server.requests[0]["messages"][0]["content"]
    assert result.score == 1.0 and result.info["reply"] == "CORRECT"
    assert "42" in prompt
    assert "What is 6 x 7?" in prompt and "the answer is 42" in prompt
    assert prompt.count("```") == 2  # the answer cannot close the prompt's fence


async def test_a_number_is_scaled_and_an_odd_reply_scores_zero() -> None:
    with ScriptedChatServer([Reply("Score: 7/10"), Reply("no idea")]) as server:
        judge = settings(server, parser="number", cache=False)
        assert (await llm_judge_reward(context("42", judge))).score == pytest.approx(0.7)
        assert (await llm_judge_reward(context("41", judge))).score == 0.0  # not masked


async def test_infrastructure_errors_are_retried_then_raised_and_verdicts_cached() -> None:
    with ScriptedChatServer([Fail(500), Fail(503), Reply("CORRECT")]) as server:
        judge = settings(server, retries=2)
        first = await llm_judge_reward(context("42", judge))
        again = await llm_judge_reward(context("42", judge))
        assert len(server.requests) == 3  # the second verdict came from the cache
    assert first.info["attempts"] == 3 and again.info["cached"] is True
    with (
        ScriptedChatServer([Fail(500), Fail(500)]) as server,
        pytest.raises(RewardInfraError, match="HTTP 500"),
    ):
        await llm_judge_reward(context("43", settings(server, retries=1)))


async def test_a_refusal_of_the_answer_scores_zero_and_a_refusal_of_anything_is_masked() -> None:
    def content_filter(body: dict[str, Any]) -> Reply | Fail:
        refused = "forbidden words" in body["messages"][0]["content"]
        return Fail(400, "content filter") if refused else Reply("INCORRECT")

    with ScriptedChatServer([content_filter] * 8) as server:
        result = await llm_judge_reward(context("forbidden words", settings(server, retries=0)))
        assert result.score == 0.0 and result.info["score_reason"] == "judge_refused"
        assert "HTTP 400" in result.info["error"]
        assert "(no answer)" in server.requests[-1]["messages"][0]["content"]
    with (
        ScriptedChatServer([Fail(400, "model does not exist")] * 4) as server,
        pytest.raises(RewardInfraError, match="HTTP 400"),
    ):
        await llm_judge_reward(context("42", settings(server, retries=0)))


async def test_a_task_without_a_field_the_prompt_uses_is_infrastructure() -> None:
    with ScriptedChatServer([]) as server, pytest.raises(RewardInfraError, match="rubric"):
        await llm_judge_reward(context("42", settings(server), task={"question": "q"}))


def test_bad_prompts_are_refused_with_their_key_path() -> None:
    reset_plugins()
    cfg = AgentConfig.from_dict(
        {
            "reward": {
                "rubric": [
                    {
                        "name": "llm_judge",
                        "settings": {"base_url": "http://x", "model": "m", "prompt": "{answer}"},
                    }
                ]
            },
        }
    )
    with pytest.raises(ConfigError, match=r"reward\.rubric\.0\.settings\.prompt"):
        resolve(cfg, source="agent.yaml")


async def test_llm_judge_as_a_rubric_component_through_run(
    qwen3_tokenizer: Any, tmp_path: Path
) -> None:
    reset_plugins()

    @hookimpl
    def uniagent_tools() -> list[ToolSpec]:
        return [ANSWER]

    load_plugins().register(types.SimpleNamespace(uniagent_tools=uniagent_tools), "answer")
    with ScriptedChatServer(default=Reply("CORRECT")) as server:
        judge = {"base_url": server.base_url, "model": "judge", "api_key_env": None}
        cfg = AgentConfig.from_dict(
            {
                "tools": ["answer"],
                "instance_template": "{question}",
                "env": {"deployment": {"type": "host", "isolation": "none"}},
                "reward": {
                    "rubric": [
                        {"name": "llm_judge", "weight": 0.5, "settings": judge},
                        {"name": "command", "weight": 0.5, "settings": {"command": "false"}},
                    ],
                },
            }
        )
        model = ScriptedTokenModel(
            qwen3_tokenizer, policy=lambda cache: hermes_call("answer", {"text": "42"})
        )
        out = tmp_path / "out"
        await run(
            cfg,
            [Task("t", TASK)],
            [],
            lambda: model,
            out,
            retries=0,
            progress=Progress(io.StringIO(), live=False),
        )
    reset_plugins()
    (record,) = map(json.loads, (out / "results.jsonl").read_text().splitlines())
    assert record["reward"] == 0.5, record
    assert record["reward_info"]["rubric"]["llm_judge"]["info"]["reply"] == "CORRECT"
