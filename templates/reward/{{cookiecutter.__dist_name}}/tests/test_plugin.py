"""The plugin is found once installed, and its reward scores a real sandbox."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from uniagent import AgentEnv, get_registry, open_env
from uniagent.testing import grade, prepare_grader

REWARD = "{{ cookiecutter.__record_name }}"


def test_plugin_is_discovered() -> None:
    """After ``pip install``, uniagent lists the reward as this distribution's."""
    assert get_registry().rewards()[REWARD].distribution == "{{ cookiecutter.__dist_name }}"


@pytest.fixture
async def env() -> AsyncIterator[AgentEnv]:
    """A started host sandbox (its work dir is a fresh, empty directory)."""
    sandbox = open_env({"type": "host"})
    await sandbox.start()
    try:
        yield sandbox
    finally:
        await sandbox.close()


async def test_reward_is_1_only_for_the_expected_answer(env: AgentEnv) -> None:
    """No answer file scores 0.0, a wrong answer 0.0, the right one 1.0."""
    task = {"answer": "42"}
    # The grader's baseline is taken before the agent acts, as in an episode.
    grader = await prepare_grader(env, REWARD, task, settings={"path": "answer.txt"})
    assert (await grade(grader, env)).score == 0.0
    await env.write_file("answer.txt", "41\n")
    assert (await grade(grader, env)).score == 0.0
    await env.write_file("answer.txt", "42\n")
    result = await grade(grader, env)
    assert result.score == 1.0
    assert result.info["found"] == "42"


async def test_the_answering_turn_gets_its_per_turn_score(env: AgentEnv) -> None:
    """With ``turn_bonus``, a right answer also credits the last model turn (index 1)."""
    grader = await prepare_grader(env, REWARD, {"answer": "42"}, settings={"turn_bonus": 0.5})
    await env.write_file("answer.txt", "42\n")
    turns = [{"role": "assistant", "content": "looking"}, {"role": "tool", "content": "ok"}]
    turns += [{"role": "assistant", "content": "answered"}]
    result = await grade(grader, env, messages=turns)
    assert result.score == 1.0 and result.turn_scores == {1: 0.5}
