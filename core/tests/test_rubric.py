"""Rubrics: several rewards on one grading sandbox, aggregated, with zero-weight metrics."""

from __future__ import annotations

import asyncio
import io
import json
import shlex
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict

from uniagent import RewardSpec, ToolSpec, hookimpl
from uniagent.config import AgentConfig
from uniagent.errors import ConfigError, UnknownPluginNameError
from uniagent.plugins import load_plugins, reset_plugins
from uniagent.resolver import resolve
from uniagent.reward import RewardContext, RewardResult
from uniagent.rubric import Component, Rubric, aggregate
from uniagent.run.preflight import check_task_fields
from uniagent.run.progress import Progress
from uniagent.run.runner import run
from uniagent.run.summary import format_summary
from uniagent.tasks import Task
from uniagent.testing.scripted import ScriptedTokenModel, hermes_call
from uniagent.view.rundir import RunFolder

# Two rewards that each wait for the other: they finish only when run at the same time.
MET = {"first": asyncio.Event(), "second": asyncio.Event()}


class Meet(BaseModel):
    model_config = ConfigDict(extra="forbid")
    me: str
    other: str


async def meet(ctx: RewardContext[Meet]) -> RewardResult:
    MET[ctx.settings.me].set()
    await MET[ctx.settings.other].wait()
    done = await ctx.require_sandbox().run("cat mark.txt", timeout=60)
    return RewardResult(1.0, {"saw": done.output.strip()})


async def per_turn(ctx: RewardContext[None]) -> RewardResult:
    return RewardResult(0.5, turn_scores={0: 0.5, 1: -0.25})


class Args(BaseModel):
    text: str


MARK = ToolSpec(
    name="mark",
    description="Write mark.txt.",
    arguments=Args,
    render=lambda a: f"printf %s {shlex.quote(a['text'])} > mark.txt",
)


class NoArgs(BaseModel):
    pass


CHECK = ToolSpec(
    name="check",
    description="Check mark.txt (a quick test worth points).",
    arguments=NoArgs,
    render=lambda a: "grep -q yes mark.txt",
    score=lambda args, output, code: 0.5 if code == 0 else -0.1,
)


DONE = ToolSpec(
    name="done",
    description="Finish.",
    arguments=NoArgs,
    render=lambda a: "echo ok",
    ends_episode=True,
)


@pytest.fixture(autouse=True)
def plugins() -> Iterator[None]:
    reset_plugins()
    for event in MET.values():
        event.clear()

    @hookimpl
    def uniagent_tools() -> list[ToolSpec]:
        return [MARK, CHECK, DONE]

    @hookimpl
    def uniagent_rewards() -> list[RewardSpec[Any]]:
        return [
            RewardSpec(name="meet", fn=meet, settings=Meet, concurrent=True),
            RewardSpec(name="per_turn", fn=per_turn, uses_sandbox=False),
        ]

    load_plugins().register(
        types.SimpleNamespace(uniagent_tools=uniagent_tools, uniagent_rewards=uniagent_rewards),
        "test-rubric",
    )
    yield
    reset_plugins()


def config(reward: dict[str, Any]) -> AgentConfig:
    return AgentConfig.from_dict(
        {
            "tools": ["mark", "done"],
            "instance_template": "{q}",
            "env": {"deployment": {"type": "host", "isolation": "none"}},
            "reward": reward,
        }
    )


RUBRIC = {
    "rubric": [
        {"name": "command", "weight": 0.75, "settings": {"command": "grep -q yes mark.txt"}},
        {"name": "command", "label": "fails", "weight": 0.5, "settings": {"command": "false"}},
        {"name": "command", "label": "exists", "weight": 0.25, "settings": {"command": "true"}},
    ],
    "metrics": [{"name": "command", "label": "lint", "settings": {"command": "test -s mark.txt"}}],
}


async def run_tasks(
    cfg: AgentConfig, marks: list[str], tokenizer: Any, out: Path
) -> dict[str, Any]:
    def policy(cache: Any) -> str:
        acted = any(m.get("role") == "tool" for m in cache.messages)
        if acted:
            return hermes_call("done")
        task = next(m["content"] for m in cache.messages if m["role"] == "user")
        return hermes_call("mark", {"text": task})

    model = ScriptedTokenModel(tokenizer, policy=policy)
    return await run(
        cfg,
        [Task(f"t{i}", {"q": mark}) for i, mark in enumerate(marks)],
        [],
        lambda: model,
        out,
        retries=0,
        progress=Progress(io.StringIO(), live=False),
    )


def records(out: Path) -> dict[str, dict[str, Any]]:
    lines = (out / "results.jsonl").read_text().splitlines()
    return {r["task_id"]: r for r in map(json.loads, lines)}


async def test_a_rubric_through_run_is_the_weighted_sum_and_logs_its_metric(
    qwen3_tokenizer: Any, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    summary = await run_tasks(config(RUBRIC), ["yes", "no"], qwen3_tokenizer, out)
    by_task = records(out)
    yes, no = by_task["t0"], by_task["t1"]
    # 0.75 * 1 + 0.5 * 0 + 0.25 * 1; the metric (weight 0) is not in the reward.
    assert yes["reward"] == pytest.approx(1.0)
    assert no["reward"] == pytest.approx(0.25)
    info = yes["reward_info"]
    assert info["aggregate"] == "weighted-sum"
    assert {k: (v["score"], v["weight"]) for k, v in info["rubric"].items()} == {
        "command": (1.0, 0.75),
        "fails": (0.0, 0.5),
        "exists": (1.0, 0.25),
    }
    assert info["rubric"]["command"]["info"]["command"] == "grep -q yes mark.txt"
    assert info["metrics"]["lint"]["score"] == 1.0 and info["metrics"]["lint"]["weight"] == 0
    # One grading sandbox and one integrity check for the whole rubric.
    assert "integrity" in info
    assert all("integrity" not in v["info"] for v in info["rubric"].values())
    assert summary["reward_components"] == {
        "command": 0.5,
        "exists": 1.0,
        "fails": 0.0,
        "lint": 1.0,
    }
    saved = json.loads((out / "summary.json").read_text())
    assert saved["reward_components"] == summary["reward_components"]
    assert "lint: 1.000" in format_summary(summary)
    # The viewer's rows carry each component's score.
    rows = {row.task_id: row for row in RunFolder(out).rows.values()}
    expected = {"command": 0.0, "fails": 0.0, "exists": 1.0, "lint": 1.0}
    assert rows["t1"].reward_components == expected
    assert rows["t1"].to_json()["reward_components"]["lint"] == 1.0


async def test_concurrent_components_run_together_on_the_same_sandbox(
    qwen3_tokenizer: Any, tmp_path: Path
) -> None:
    reward = {
        "rubric": [
            {"name": "meet", "settings": {"me": "first", "other": "second"}},
            {"name": "meet", "label": "again", "settings": {"me": "second", "other": "first"}},
        ],
        "aggregate": "weighted-mean",
    }
    out = tmp_path / "out"
    # Each waits for the other: run one after the other, the first would never end.
    await asyncio.wait_for(run_tasks(config(reward), ["hi"], qwen3_tokenizer, out), 600)
    (record,) = records(out).values()
    assert record["exit_reason"] == "finished" and record["reward"] == 1.0
    assert record["reward_info"]["rubric"]["again"]["info"] == {"saw": "hi"}


def test_aggregates() -> None:
    spec = RewardSpec(name="x", fn=meet)
    parts = (
        Component("a", spec, None, 2.0),
        Component("b", spec, None, 1.0),
        Component("m", spec, None, 0.0, metric=True),
    )
    scores = {"a": 0.5, "b": 1.0, "m": 0.0}
    assert aggregate(Rubric(parts), scores) == 2.0
    assert aggregate(Rubric(parts, "weighted-mean"), scores) == pytest.approx(2.0 / 3)
    assert aggregate(Rubric(parts, "min"), scores) == 0.5  # the metric is not counted
    assert aggregate(Rubric(parts, "all-pass"), scores) == 0.0
    assert aggregate(Rubric(parts, "all-pass", pass_score=0.5), scores) == 1.0


@pytest.mark.parametrize(
    ("reward", "error", "message"),
    [
        (
            {"rubric": [{"name": "command"}, {"name": "nope"}]},
            UnknownPluginNameError,
            "reward.rubric.1.name",
        ),
        (
            {"rubric": [{"name": "command"}], "metrics": [{"name": "missing"}]},
            UnknownPluginNameError,
            "reward.metrics.0.name",
        ),
        (
            {"rubric": [{"name": "command", "settings": {"timeout": -1}}]},
            ConfigError,
            "reward.rubric.0.settings.timeout",
        ),
        ({"rubric": [{"name": "command", "wieght": 2}]}, ConfigError, "wieght"),
        ({"rubric": [{"name": "command"}, {"name": "command"}]}, ConfigError, "named twice"),
        ({"rubric": [{"name": "command", "weight": 0}]}, ConfigError, "every weight is 0"),
        ({"name": "command", "rubric": [{"name": "command"}]}, ConfigError, "not both"),
        ({"name": "command", "metrics": [{"name": "command"}]}, ConfigError, "only with"),
        ({"rubric": []}, ConfigError, "at least one"),
        ({"rubric": [{"name": "command"}], "aggregate": "max"}, ConfigError, "aggregate"),
        ({}, ConfigError, "give a reward `name`"),
    ],
)
def test_a_bad_rubric_is_refused_at_resolve_time(
    reward: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message.replace(".", r"\.")):
        resolve(config(reward), source="agent.yaml")


def test_a_rubric_needs_the_task_fields_of_its_components_before_any_episode() -> None:
    """A component ``command`` without its own command reads each task's ``test_command``:
    tasks without it are refused by name, unless their own overrides give the command."""
    reward = {"rubric": [*RUBRIC["rubric"], {"name": "command", "label": "tests"}]}
    own = {"reward": {"rubric": [{"name": "command", "settings": {"command": "true"}}]}}
    tasks = [
        Task("with", {"q": "x", "test_command": "true"}),
        Task("without", {"q": "x"}),
        Task("overridden", {"q": "x", "config_overrides": own}),
    ]
    agent = resolve(config(reward), source="agent.yaml")
    with pytest.raises(
        ConfigError, match=r"'test_command' field, which 1 task\(s\) lack: without\."
    ):
        check_task_fields(agent, tasks)
    check_task_fields(resolve(config(RUBRIC), source="agent.yaml"), tasks)  # none needed


async def test_turn_scores_of_a_rubric_are_its_weighted_sum_in_results(
    qwen3_tokenizer: Any, tmp_path: Path
) -> None:
    reward = {
        "rubric": [
            {"name": "per_turn", "weight": 2.0},
            {"name": "command", "settings": {"command": "true"}},
        ],
        "metrics": [{"name": "per_turn", "label": "logged"}],  # a metric gives no turn credit
        "credit": "turn",
    }
    out = tmp_path / "out"
    await run_tasks(config(reward), ["hi"], qwen3_tokenizer, out)
    (record,) = records(out).values()
    assert record["reward"] == 2.0
    assert record["turn_scores"] == {"0": 1.0, "1": -0.5}


def test_turn_scores_must_be_turn_indexes() -> None:
    with pytest.raises(TypeError, match="turn index"):
        RewardResult(1.0, turn_scores={-1: 1.0})
    with pytest.raises(TypeError, match="a number"):
        RewardResult(1.0, turn_scores={0: "1"})  # type: ignore[dict-item]


async def test_a_tool_scores_its_turn_and_the_reward_adds_its_own(
    qwen3_tokenizer: Any, tmp_path: Path
) -> None:
    script = [
        hermes_call("check"),  # turn 0: no mark.txt yet
        hermes_call("mark", {"text": "yes"}),
        hermes_call("check"),  # turn 2: passes
        hermes_call("done"),
    ]
    cfg = AgentConfig.from_dict(
        {
            "tools": ["mark", "check", "done"],
            "instance_template": "{q}",
            "env": {"deployment": {"type": "host", "isolation": "none"}},
            "reward": {"rubric": [{"name": "per_turn"}], "credit": "turn"},
        }
    )
    out = tmp_path / "out"
    await run(
        cfg,
        [Task("t", {"q": "check"})],
        [],
        lambda: ScriptedTokenModel(qwen3_tokenizer, script),
        out,
        retries=0,
        progress=Progress(io.StringIO(), live=False),
    )
    (record,) = records(out).values()
    # tools: turn 0 -0.1, turn 2 +0.5; the reward: turn 0 +0.5, turn 1 -0.25
    assert record["turn_scores"] == {
        "0": pytest.approx(0.4),
        "1": -0.25,
        "2": 0.5,
    }


async def test_concurrent_failures_raise_the_infrastructure_error_first() -> None:
    from uniagent.reward import RewardInfraError
    from uniagent.rubric import grade_rubric

    async def broken(ctx: RewardContext[None]) -> RewardResult:
        raise ValueError("the tested code's output broke me")

    async def infra(ctx: RewardContext[None]) -> RewardResult:
        raise RewardInfraError("the task row lacks its field")

    parts = tuple(
        Component(name, RewardSpec(name=name, fn=fn, uses_sandbox=False, concurrent=True), None, 1)
        for name, fn in (("broken", broken), ("infra", infra))
    )
    ctx: RewardContext[Rubric] = RewardContext(sandbox=None, task={}, settings=Rubric(parts))
    with pytest.raises(RewardInfraError, match="lacks its field"):
        await grade_rubric(ctx)
    only_broken = Rubric(parts[:1])
    with pytest.raises(ValueError, match="broke me"):
        await grade_rubric(RewardContext(sandbox=None, task={}, settings=only_broken))


async def test_a_component_that_reports_tampering_zeroes_the_whole_rubric() -> None:
    from uniagent.rubric import grade_rubric

    async def honest(ctx: RewardContext[None]) -> RewardResult:
        return RewardResult(1.0, {}, turn_scores={0: 1.0})

    async def caught(ctx: RewardContext[None]) -> RewardResult:
        tampered = [{"kind": "verifier_input", "path": "/tests/test.sh"}]
        return RewardResult(0.0, {"score_reason": "tampered", "tampered": tampered})

    parts = tuple(
        Component(name, RewardSpec(name=name, fn=fn, uses_sandbox=False), None, 1)
        for name, fn in (("honest", honest), ("caught", caught))
    )
    ctx: RewardContext[Rubric] = RewardContext(sandbox=None, task={}, settings=Rubric(parts))
    result = await grade_rubric(ctx)
    assert result.score == 0.0 and result.turn_scores == {}, "not only the part that caught it"
    assert result.info["score_reason"] == "tampered" and "caught" in result.info["detail"]
    assert result.info["tampered"] == [{"kind": "verifier_input", "path": "/tests/test.sh"}]
    assert result.info["rubric"]["honest"]["score"] == 1.0  # every component still recorded
    clean = await grade_rubric(RewardContext(sandbox=None, task={}, settings=Rubric(parts[:1])))
    assert clean.score == 1.0 and clean.turn_scores == {0: 1.0}


async def test_what_the_components_saw_of_probing_is_the_rubrics() -> None:
    """A component's ``probing`` (its word on the attack classes it saw, counted per class by
    uniagent.protect.report) is lifted to the rubric's info, so nesting hides nothing."""
    from uniagent.protect.report import episode_classes
    from uniagent.rubric import grade_rubric

    async def marked(ctx: RewardContext[None]) -> RewardResult:
        return RewardResult(0.0, {"probing": ["self_masking"]})

    async def faked(ctx: RewardContext[None]) -> RewardResult:
        return RewardResult(1.0, {"probing": ["artifacts", "self_masking"]})

    async def plain(ctx: RewardContext[None]) -> RewardResult:
        return RewardResult(1.0, {"probing": "not a list"})

    parts = tuple(
        Component(name, RewardSpec(name=name, fn=fn, uses_sandbox=False), None, 1)
        for name, fn in (("marked", marked), ("faked", faked), ("plain", plain))
    )
    result = await grade_rubric(RewardContext(sandbox=None, task={}, settings=Rubric(parts)))
    assert result.info["probing"] == ["artifacts", "self_masking"]
    assert episode_classes(result.info) == {"artifacts", "self_masking"}
    clean = await grade_rubric(RewardContext(sandbox=None, task={}, settings=Rubric(parts[2:])))
    assert "probing" not in clean.info
