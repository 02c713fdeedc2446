"""The agent seam: an agent of a plugin (its own ``runner``, neither the built-in loop nor
a harness) runs in the one episode body: its sandbox, set-up, the grader's baseline before
it and the grading after it, the exit reasons of its failures."""

from __future__ import annotations

import shlex
import types
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest

from uniagent import (
    AgentConfig,
    AgentEnv,
    AgentRun,
    AgentSpec,
    EnvStartError,
    EpisodeContext,
    EpisodeMetrics,
    ExitReason,
    hookimpl,
    load_plugins,
    reset_plugins,
    resolve,
)
from uniagent.episode import run_episode

BUGGY = "def add(a, b):\n    return a - b\n"
FIXED = "def add(a, b):\n    return a + b\n"
TESTS = "from calc import add\nassert add(2, 3) == 5, 'add is broken'\n"
SETUP = (
    "git init -q && git config user.email t@t && git config user.name t && "
    f"printf %s {shlex.quote(BUGGY)} > calc.py && mkdir tests && "
    f"printf %s {shlex.quote(TESTS)} > tests/check.py && git add -A && git commit -qm base"
)


class ScriptAgent:
    """An agent that runs the task's ``commands`` in its sandbox, one a turn; ``fail`` in
    the task makes its set-up (``setup``) or its run (``run``) raise."""

    made: ClassVar[list[ScriptAgent]] = []

    def __init__(self, context: EpisodeContext) -> None:
        self.context = context
        self.events: list[str] = []
        ScriptAgent.made.append(self)

    async def new_env(self) -> AgentEnv:
        self.events.append("new_env")
        return self.context.agent.new_env()

    async def setup(self, env: AgentEnv) -> None:
        self.events.append("setup")
        if self.context.task.get("fail") == "setup":
            raise EnvStartError("the agent's image lacks its runtime")

    async def run(self, env: AgentEnv, metrics: EpisodeMetrics) -> AgentRun:
        self.events.append("run")
        if self.context.task.get("fail") == "run":
            raise RuntimeError("a bug in the agent")
        for command in self.context.task["commands"]:
            await env.run_action(command, timeout=30)
            metrics.turns += 1
        return AgentRun(exit_reason=ExitReason.FINISHED, submission="done", turn_scores={0: 0.5})


class Phases:
    def __init__(self) -> None:
        self.seen: list[str] = []

    def phase(self, name: str) -> None:
        self.seen.append(name)

    def turn(self, number: int) -> None:
        pass

    def tool(self, name: str) -> None:
        pass


@pytest.fixture
def script_agent() -> Iterator[None]:
    reset_plugins()
    ScriptAgent.made.clear()

    @hookimpl
    def uniagent_agents() -> Iterator[AgentSpec[Any]]:
        yield AgentSpec(name="script", runner=ScriptAgent)

    load_plugins().register(types.SimpleNamespace(uniagent_agents=uniagent_agents), "t-agent")
    yield
    reset_plugins()


def config() -> AgentConfig:
    return AgentConfig.from_dict(
        {
            "agent": {"name": "script"},
            "env": {"deployment": {"type": "host", "isolation": "none"}, "post_setup": [SETUP]},
            "reward": {
                "name": "command",
                "settings": {"command": "PYTHONPATH=. python3 tests/check.py"},
                "integrity": {"protect_paths": ["tests/"]},
            },
        }
    )


@pytest.mark.usefixtures("script_agent")
async def test_an_agent_of_a_plugin_runs_between_the_baseline_and_the_grading() -> None:
    agent = resolve(config())
    assert agent.agent.runner is ScriptAgent and not agent.agent.is_harness
    fix = f"printf %s {shlex.quote(FIXED)} > calc.py"
    phases = Phases()
    fixed = await run_episode(agent, {"commands": ["ls", fix]}, model=None, observer=phases)
    assert fixed.exit_reason is ExitReason.FINISHED, fixed.error
    assert (fixed.reward, fixed.submission, fixed.metrics.turns) == (1.0, "done", 2)
    assert fixed.turn_scores == {0: 0.5}
    assert fixed.integrity, "the grader's baseline ran before the agent"
    assert phases.seen == ["setup", "tools", "baseline", "agent", "grading", "close"]
    assert ScriptAgent.made[-1].events == ["new_env", "setup", "run"]

    unfixed = await run_episode(agent, {"commands": ["ls"]}, model=None)
    assert (unfixed.exit_reason, unfixed.reward) == (ExitReason.FINISHED, 0.0)
    # Tampering is the grader's to see, whatever the agent: the protected tests rewritten.
    cheat = "printf 'pass\\n' > tests/check.py"
    cheated = await run_episode(agent, {"commands": [cheat]}, model=None)
    assert cheated.reward == 0.0 and cheated.reward_info.get("score_reason"), cheated.reward_info


@pytest.mark.usefixtures("script_agent")
@pytest.mark.parametrize(
    ("fail", "reason"), [("setup", ExitReason.ENV_ERROR), ("run", ExitReason.UNKNOWN_ERROR)]
)
async def test_an_agents_failures_are_exit_reasons_and_its_sandbox_is_closed(
    fail: str, reason: ExitReason
) -> None:
    phases = Phases()
    result = await run_episode(
        resolve(config()), {"commands": [], "fail": fail}, model=None, observer=phases
    )
    assert result.exit_reason is reason and result.reward is None
    assert ("the agent's image lacks" if fail == "setup" else "a bug in the agent") in (
        result.error or ""
    )
    assert phases.seen[-1] == "close"


def test_an_agent_needs_a_runner_or_a_harness() -> None:
    with pytest.raises(ValueError, match="give it a runner"):
        AgentSpec(name="nothing")
