"""The plugin is found once installed, and its reward scores a real sandbox."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from uniagent.env import AgentEnv
from uniagent.registry import get_rewards
from uniagent.reward import RewardContext, RewardResult

REWARD = "{{ cookiecutter.__record_name }}"


def test_plugin_is_discovered() -> None:
    """After ``pip install``, uniagent lists the reward as this distribution's."""
    assert get_rewards()[REWARD].distribution == "{{ cookiecutter.__dist_name }}"


@pytest.fixture
async def env() -> AsyncIterator[AgentEnv]:
    """A started host sandbox whose shell sits in a fresh, empty directory."""
    sandbox = AgentEnv.from_config({"type": "host"})
    await sandbox.start()
    try:
        await sandbox.run_action('cd "$(mktemp -d)"', timeout=10)
        yield sandbox
    finally:
        await sandbox.close()


async def score(env: AgentEnv, task: dict[str, str]) -> RewardResult:
    """Run the reward as uniagent does at the end of an episode."""
    spec = get_rewards()[REWARD]
    config = spec.config.model_validate({"path": "answer.txt"}) if spec.config else None
    return RewardResult.coerce(await spec.fn(RewardContext(env=env, task=task, config=config)))


async def test_reward_is_1_only_for_the_expected_answer(env: AgentEnv) -> None:
    """No answer file scores 0.0, a wrong answer 0.0, the right one 1.0."""
    assert (await score(env, {"answer": "42"})).score == 0.0
    await env.run_action("echo 41 > answer.txt", timeout=10)
    assert (await score(env, {"answer": "42"})).score == 0.0
    await env.run_action("echo 42 > answer.txt", timeout=10)
    result = await score(env, {"answer": "42"})
    assert result.score == 1.0
    assert result.info["found"] == "42"
