"""The ReAct loop and the episode around it, with a scripted model and a real host sandbox.

Every exit reason (docs/config.md) is reached here; the rollout cache's mask is
checked against the transcript.
"""

from __future__ import annotations

import asyncio
import copy
import types
from typing import Any

import pytest
from pydantic import BaseModel, Field

from uniagent import ToolSpec, get_parser, hookimpl, open_env
from uniagent.config import AgentConfig, InteractionConfig
from uniagent.env.errors import ActionError
from uniagent.episode import run_episode
from uniagent.exit import ExitReason
from uniagent.interaction.loop import AgentInteraction
from uniagent.models.base import ModelError
from uniagent.parsers import HermesParser
from uniagent.plugins import load_plugins, reset_plugins
from uniagent.resolver import resolve
from uniagent.testing.scripted import ScriptedTokenModel, hermes_call, logprob_for


class CommandArgs(BaseModel):
    command: str = Field(description="a bash command")


class NoArgs(BaseModel):
    pass


class CrashArgs(BaseModel):
    pass


def _crash(_: Any) -> str:
    raise RuntimeError("a bug in a tool's render function")


SHELL = ToolSpec(
    name="shell",
    description="Run a bash command.",
    arguments=CommandArgs,
    render=lambda a: a["command"],
)
DONE = ToolSpec(
    name="done",
    description="Finish; prints the diff.",
    arguments=NoArgs,
    render=lambda a: "echo SUBMITTED",
    ends_episode=True,
)
CRASH = ToolSpec(name="crash", description="Broken.", arguments=CrashArgs, render=_crash)
TOOLS = [SHELL, DONE, CRASH]


@pytest.fixture
def registry_with_test_tools():
    """The process-wide registry with the built-ins plus a test plugin of three tools."""
    reset_plugins()

    @hookimpl
    def uniagent_tools():
        return TOOLS

    load_plugins().register(types.SimpleNamespace(uniagent_tools=uniagent_tools), "test-tools")
    yield
    reset_plugins()


def config(**overrides: Any) -> AgentConfig:
    base = {
        "tool_parser": "hermes",
        "tools": ["shell", "done", "crash"],
        "instance_template": "Task: {problem}",
        "interaction": {"max_turns": 6, "action_timeout": 5, "timeout_budget": 5},
    }
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            base[key] = {**base[key], **value}
        else:
            base[key] = value
    return AgentConfig.from_dict(base)


TASK = {"problem": "say hello"}


async def episode(tokenizer, script, **overrides):
    model = ScriptedTokenModel(tokenizer, script, sampling_params={"max_tokens": 200})
    result = await run_episode(resolve(config(**overrides)), TASK, model)
    return result, model


def model_spans(cache) -> list[list[int]]:
    """Runs of mask-1 ids in the response."""
    spans, current = [], []
    for token, mask in zip(cache.response_ids, cache.response_mask, strict=True):
        if mask:
            current.append(token)
        elif current:
            spans.append(current)
            current = []
    if current:
        spans.append(current)
    return spans


pytestmark = pytest.mark.usefixtures("registry_with_test_tools")


async def test_finishing_tool_ends_the_episode_with_its_output_as_submission(qwen3_tokenizer):
    script = [hermes_call("shell", {"command": "echo hello > out.txt"}), hermes_call("done")]
    result, _ = await episode(qwen3_tokenizer, script)
    assert result.exit_reason is ExitReason.FINISHED
    assert result.submission == "SUBMITTED\n"
    assert not result.traj_masked
    assert result.metrics.turns == 2
    assert result.metrics.tool_calls == {"shell": 1, "done": 1}


async def test_cache_mask_marks_exactly_the_model_turns(qwen3_tokenizer):
    texts = [hermes_call("shell", {"command": "echo hi"}), hermes_call("done")]
    result, model = await episode(qwen3_tokenizer, list(texts))
    cache = result.cache
    eot = qwen3_tokenizer.convert_tokens_to_ids("<|im_end|>")
    expected = [qwen3_tokenizer.encode(t, add_special_tokens=False) + [eot] for t in texts]
    assert model_spans(cache) == expected
    # Log-probs: exactly those returned for mask-1 tokens, 0.0 for tool output.
    generated = [lp for lp, m in zip(cache.response_logprobs, cache.response_mask) if m]
    assert generated == [logprob_for(i) for i in range(len(generated))]
    assert all(lp == 0.0 for lp, m in zip(cache.response_logprobs, cache.response_mask) if not m)
    # The model was asked to continue exactly the context the cache held at each turn.
    assert model.calls == cache.turn_context_lengths
    tool_text = qwen3_tokenizer.decode(
        [t for t, m in zip(cache.response_ids, cache.response_mask) if not m]
    )
    assert "hi\n" in tool_text and "<tool_response>" in tool_text
    report = cache.check_exactness()
    assert report.ok, report.summary()


async def test_finishing_on_the_last_allowed_turn_counts_as_finished(qwen3_tokenizer):
    script = [hermes_call("shell", {"command": "true"}), hermes_call("done")]
    result, _ = await episode(qwen3_tokenizer, script, interaction={"max_turns": 2})
    assert result.exit_reason is ExitReason.FINISHED


async def test_max_turns_without_finishing_is_max_step_limit(qwen3_tokenizer):
    script = [hermes_call("shell", {"command": "true"})] * 3
    result, _ = await episode(qwen3_tokenizer, script, interaction={"max_turns": 3})
    assert result.exit_reason is ExitReason.MAX_STEP_LIMIT
    assert result.metrics.turns == 3 and not result.traj_masked


async def test_format_errors_are_fed_back_and_the_episode_recovers(qwen3_tokenizer):
    script = ["I will just talk.", '<tool_call>{"name": "shell"', hermes_call("done")]
    result, _ = await episode(qwen3_tokenizer, script)
    assert result.exit_reason is ExitReason.FINISHED
    assert result.metrics.format_errors == 2
    feedback = [m["content"] for m in result.messages if m["role"] == "tool"]
    assert len(feedback) == 2
    assert "<tool_call>" in feedback[0], "the error shows the expected format"
    assert "shell" in feedback[0] and "done" in feedback[0], "and the allowed tools"


async def test_too_many_consecutive_format_errors_end_with_format_error(qwen3_tokenizer):
    result, _ = await episode(
        qwen3_tokenizer, ["no call"] * 5, interaction={"max_format_errors": 2}
    )
    assert result.exit_reason is ExitReason.FORMAT_ERROR
    assert result.metrics.format_errors == 2


async def test_bash_syntax_error_is_fed_back_without_running(qwen3_tokenizer):
    script = [hermes_call("shell", {"command": "echo ran; if then fi"}), hermes_call("done")]
    result, _ = await episode(qwen3_tokenizer, script)
    assert result.exit_reason is ExitReason.FINISHED
    assert result.metrics.syntax_errors == 1
    feedback = [m["content"] for m in result.messages if m["role"] == "tool"][0]
    assert "syntax error" in feedback and "ran" not in feedback.split("\n")[0]


class QuotaError(ActionError):
    """A backend's own action error: what the model sees is the error's to say."""

    outcome = "over quota"
    counted_as = "syntax_errors"

    def observation(self) -> str:
        return "Your sandbox is out of disk quota; nothing was run."


class LostError(ActionError):
    """A backend's action error that ends the episode with its own exit reason."""

    ends_with = ExitReason.ENV_ERROR
    outcome = "the sandbox was lost"


async def test_an_action_error_is_shown_or_ends_the_episode_as_it_says(
    qwen3_tokenizer, monkeypatch
):
    from uniagent.env import AgentEnv

    original = AgentEnv.run_action

    async def run_action(self: AgentEnv, command: str, **kwargs: Any) -> Any:
        for marker, error in (("fill-disk", QuotaError), ("lose-it", LostError)):
            if marker in command:
                raise error(marker)
        return await original(self, command, **kwargs)

    monkeypatch.setattr(AgentEnv, "run_action", run_action)
    shown = [hermes_call("shell", {"command": "fill-disk"}), hermes_call("done")]
    result, _ = await episode(qwen3_tokenizer, shown)
    assert result.exit_reason is ExitReason.FINISHED and result.metrics.syntax_errors == 1
    tool_messages = [m["content"] for m in result.messages if m["role"] == "tool"]
    assert tool_messages[0] == "Your sandbox is out of disk quota; nothing was run."
    ended, _ = await episode(qwen3_tokenizer, [hermes_call("shell", {"command": "lose-it"})])
    assert ended.exit_reason is ExitReason.ENV_ERROR and ended.traj_masked


async def test_timeouts_within_budget_recover_then_spending_it_ends(qwen3_tokenizer):
    recover = [
        hermes_call("shell", {"command": "sleep 30"}),
        hermes_call("shell", {"command": "echo ok"}),
        hermes_call("done"),
    ]
    cfg = {"interaction": {"action_timeout": 1, "timeout_budget": 1.5}}
    result, _ = await episode(qwen3_tokenizer, recover, **cfg)
    assert result.exit_reason is ExitReason.FINISHED
    assert result.metrics.timeouts == 1
    tool_messages = [m["content"] for m in result.messages if m["role"] == "tool"]
    assert "timed out" in tool_messages[0] and tool_messages[1] == "ok\n"

    spend = [hermes_call("shell", {"command": "sleep 30"})] * 3
    result, _ = await episode(qwen3_tokenizer, spend, **cfg)
    assert result.exit_reason is ExitReason.TIMEOUT_ERROR
    assert result.metrics.timeouts == 2


async def test_the_agent_ending_its_own_shell_is_trained_on_with_reward_zero(qwen3_tokenizer):
    reward = {"name": "command", "settings": {"command": "true"}}
    for command in ("exit 3", "kill -9 $$", "exec true"):
        script = [hermes_call("shell", {"command": command})]
        result, _ = await episode(qwen3_tokenizer, script, reward=reward)
        assert result.exit_reason is ExitReason.AGENT_KILLED_SHELL, command
        assert not result.traj_masked, command
        assert result.reward == 0.0, command


async def test_a_sandbox_dying_under_a_command_is_terminal_not_alive_and_masked(
    qwen3_tokenizer,
):
    env = open_env({"type": "host"})
    await env.start()
    started = env.deployment.root / "work" / "started"

    async def lose_the_sandbox() -> None:
        # Wait for the command to be running (an event, not a delay), then lose the sandbox.
        while not started.exists():
            await asyncio.sleep(0.01)
        await env.deployment.stop()

    model = ScriptedTokenModel(
        qwen3_tokenizer,
        [hermes_call("shell", {"command": "touch started; sleep 60"})],
        sampling_params={"max_tokens": 200},
    )
    loop = AgentInteraction(
        model, env, TOOLS, get_parser("hermes"), InteractionConfig(action_timeout=120)
    )
    watcher = asyncio.ensure_future(lose_the_sandbox())
    try:
        cache = model.start_cache([{"role": "user", "content": "go"}], [])
        outcome = await loop.run(cache)
    finally:
        await watcher
        await env.close()
    assert outcome.exit_reason is ExitReason.TERMINAL_NOT_ALIVE
    assert config().treatment(outcome.exit_reason) == "mask"


async def test_a_command_with_a_nul_byte_or_a_lone_surrogate_is_fed_back(qwen3_tokenizer):
    # The model writes JSON escapes; json.loads turns them into the raw characters.
    raw = '<tool_call>\n{{"name": "shell", "arguments": {{"command": "echo {}"}}}}\n</tool_call>'
    script = [
        raw.format("a\\u0000b"),
        raw.format("\\ud800"),
        hermes_call("shell", {"command": "echo still-here"}),
        hermes_call("done"),
    ]
    result, _ = await episode(qwen3_tokenizer, script)
    assert result.exit_reason is ExitReason.FINISHED
    tool_texts = [m["content"] for m in result.messages if m["role"] == "tool"]
    assert "NUL byte" in tool_texts[0] and "not run" in tool_texts[0]
    assert "not valid Unicode" in tool_texts[1]
    assert tool_texts[2] == "still-here\n"


async def test_a_command_that_tampers_with_the_shell_protocol_is_fed_back(qwen3_tokenizer):
    script = [
        hermes_call("shell", {"command": "echo mine; printf '\\036E%s|0 1 x\\036' 0 >&255"}),
        hermes_call("shell", {"command": "echo still-here"}),
        hermes_call("done"),
    ]
    result, _ = await episode(qwen3_tokenizer, script)
    assert result.exit_reason is ExitReason.FINISHED
    tool_texts = [m["content"] for m in result.messages if m["role"] == "tool"]
    assert tool_texts[0].startswith("mine\n[the shell reports: ")
    assert "control channel" in tool_texts[0]
    assert tool_texts[1] == "still-here\n"


async def test_context_budget_spent_is_token_limit(qwen3_tokenizer):
    long_output = hermes_call("shell", {"command": "seq 1 400"})
    model = ScriptedTokenModel(
        qwen3_tokenizer,
        [long_output] * 5,
        sampling_params={"max_tokens": 100},
        response_length=300,
    )
    result = await run_episode(resolve(config()), TASK, model)
    assert result.exit_reason is ExitReason.TOKEN_LIMIT
    assert not result.traj_masked


async def test_model_failure_is_model_error_and_masked(qwen3_tokenizer):
    result, _ = await episode(qwen3_tokenizer, [ModelError("server unreachable after 4 retries")])
    assert result.exit_reason is ExitReason.MODEL_ERROR
    assert result.traj_masked and "unreachable" in result.error


async def test_sandbox_that_fails_to_start_is_env_error_and_masked(qwen3_tokenizer):
    result, model = await episode(
        qwen3_tokenizer, [hermes_call("done")], env={"post_setup": ["exit 7"]}
    )
    assert result.exit_reason is ExitReason.ENV_ERROR
    assert result.traj_masked and model.calls == [], "the model is never asked"


async def test_failing_reward_is_reward_error_and_masked(qwen3_tokenizer):
    # The command reward needs a command: neither the config nor the task gives one.
    result, _ = await episode(qwen3_tokenizer, [hermes_call("done")], reward={"name": "command"})
    assert result.exit_reason is ExitReason.REWARD_ERROR
    assert result.traj_masked and "test_command" in result.error


async def test_reward_runs_in_the_still_open_sandbox(qwen3_tokenizer):
    script = [hermes_call("shell", {"command": "echo fixed > state"}), hermes_call("done")]
    reward = {"name": "command", "settings": {"command": "grep -q fixed state"}}
    result, _ = await episode(qwen3_tokenizer, script, reward=reward)
    assert result.exit_reason is ExitReason.FINISHED
    assert result.reward == 1.0 and result.reward_info["exit_code"] == 0
    result, _ = await episode(qwen3_tokenizer, [hermes_call("done")], reward=reward)
    assert result.reward == 0.0


async def test_unexpected_exception_is_unknown_error_with_traceback(qwen3_tokenizer):
    result, _ = await episode(qwen3_tokenizer, [hermes_call("crash")])
    assert result.exit_reason is ExitReason.UNKNOWN_ERROR
    assert result.traj_masked
    assert "Traceback" in result.error and "a bug in a tool's render function" in result.error


async def test_exit_policy_overrides_the_default(qwen3_tokenizer):
    script = [hermes_call("shell", {"command": "true"})]
    result, _ = await episode(
        qwen3_tokenizer,
        script,
        interaction={"max_turns": 1},
        exit_policy={"max_step_limit": "mask"},
    )
    assert result.exit_reason is ExitReason.MAX_STEP_LIMIT and result.traj_masked


async def test_at_most_max_tool_calls_per_turn(qwen3_tokenizer):
    two = (
        hermes_call("shell", {"command": "echo a"})
        + "\n"
        + hermes_call("shell", {"command": "echo b"})
    )
    result, _ = await episode(qwen3_tokenizer, [two, hermes_call("done")])
    assert result.metrics.format_errors == 1 and result.metrics.tool_calls["shell"] == 0
    result, _ = await episode(
        qwen3_tokenizer, [two, hermes_call("done")], interaction={"max_tool_calls_per_turn": 2}
    )
    assert result.metrics.tool_calls["shell"] == 2
    assert [m["content"] for m in result.messages if m["role"] == "tool"] == ["a\n", "b\n"]


async def test_loop_alone_on_an_open_env(qwen3_tokenizer):
    model = ScriptedTokenModel(
        qwen3_tokenizer, [hermes_call("shell", {"command": "pwd"}), hermes_call("done")]
    )
    async with open_env({"type": "host"}) as env:
        cache = model.start_cache(
            [{"role": "user", "content": "hi"}], [t.openai_schema() for t in TOOLS]
        )
        loop = AgentInteraction(model, env, TOOLS, get_parser("hermes"), InteractionConfig())
        outcome = await loop.run(cache)
    assert outcome.exit_reason is ExitReason.FINISHED
    assert outcome.messages[-2]["content"].strip() == env.workdir


CHATML_WITHOUT_TOOLS = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


async def test_tools_are_described_in_the_system_prompt_when_the_template_drops_them(
    qwen3_tokenizer,
):
    tokenizer = copy.deepcopy(qwen3_tokenizer)
    tokenizer.chat_template = CHATML_WITHOUT_TOOLS
    model = ScriptedTokenModel(tokenizer, [hermes_call("done")])
    assert not model.renders_tools()
    result = await run_episode(resolve(config()), TASK, model)
    assert result.exit_reason is ExitReason.FINISHED
    system = result.messages[0]["content"]
    assert '"name": "shell"' in system and "<tool_call>" in system
    assert tokenizer.decode(result.cache.prompt_ids).count('"name": "done"') == 1


async def test_tools_are_not_repeated_when_the_template_renders_them(qwen3_tokenizer):
    model = ScriptedTokenModel(qwen3_tokenizer, [hermes_call("done")])
    assert model.renders_tools()
    result = await run_episode(resolve(config()), TASK, model)
    assert "<tools>" not in result.messages[0]["content"]
    assert qwen3_tokenizer.decode(result.cache.prompt_ids).count('"name": "done"') == 1


async def test_the_default_prompt_names_the_finishing_tools_that_are_configured(
    qwen3_tokenizer,
):
    result, _ = await episode(qwen3_tokenizer, [hermes_call("done")], system_prompt=None)
    system = result.messages[0]["content"]
    assert "call the done tool" in system and "submit" not in system
    result, _ = await episode(
        qwen3_tokenizer,
        [hermes_call("shell", {"command": "true"})],
        tools=["shell"],
        interaction={"max_turns": 1},
    )
    assert "When the task is done" not in result.messages[0]["content"]


class InexactModel(ScriptedTokenModel):
    """A token model whose server claims to have seen other prompt ids than the cache's."""

    async def generate(self, cache, **kwargs):
        turn = await super().generate(cache, **kwargs)
        turn.prompt_exact = False
        return turn


async def test_a_turn_that_is_not_token_exact_is_recorded_and_masked(qwen3_tokenizer):
    for policy, masked in ((None, True), ("train", False)):
        model = InexactModel(
            qwen3_tokenizer, [hermes_call("done")], sampling_params={"max_tokens": 200}
        )
        overrides = {"exit_policy": {"inexact_tokens": policy}} if policy else {}
        result = await run_episode(resolve(config(**overrides)), TASK, model)
        assert result.exit_reason is ExitReason.FINISHED
        assert result.metrics.inexact_turns == 1
        assert result.traj_masked is masked


async def test_token_backends_stop_at_the_parsers_stop_sequences(qwen3_tokenizer):
    class ReActish(HermesParser):
        stop_sequences = ("\nObservation:",)

    model = ScriptedTokenModel(
        qwen3_tokenizer,
        ['<tool_call>\n{"name": "done", "arguments": {}}\n</tool_call>\nObservation: I win'],
        sampling_params={"max_tokens": 200},
    )
    env = open_env({"type": "host", "isolation": "none"})
    await env.start()
    try:
        loop = AgentInteraction(model, env, TOOLS, ReActish(), InteractionConfig())
        cache = model.start_cache([{"role": "user", "content": "go"}], [])
        outcome = await loop.run(cache)
    finally:
        await env.close()
    assert outcome.exit_reason is ExitReason.FINISHED
    generated = qwen3_tokenizer.decode(cache.response_ids)
    assert generated.endswith("\nObservation:") and "I win" not in generated


async def test_text_calls_sent_to_a_chat_api_are_answered_by_user_messages():
    """Strict chat APIs take ``role: tool`` only as the answer of a structured call."""
    from uniagent.models import OpenAIChatModel
    from uniagent.testing import Reply, ScriptedChatServer, tool_call

    with ScriptedChatServer(
        [
            Reply(hermes_call("shell", {"command": "echo hi"})),  # a call written as text
            Reply("", tool_calls=[tool_call("shell", {"command": "echo there"}, "c1")]),
            Reply(hermes_call("done")),
        ]
    ) as server:
        model = OpenAIChatModel(server.base_url, "m", api_key="k")
        result = await run_episode(resolve(config()), TASK, model)
    assert result.exit_reason is ExitReason.FINISHED
    second, third = (r["messages"] for r in server.requests[1:])
    assert second[-1] == {"role": "user", "content": "<tool_response>\nhi\n\n</tool_response>"}
    assert not any(m["role"] == "tool" and "tool_call_id" not in m for m in third)
    assert third[-1]["role"] == "tool" and third[-1]["tool_call_id"] == "c1"


async def test_a_call_written_as_text_is_answered_as_the_rollout_says(qwen3_tokenizer):
    """The loop asks the rollout, not its mode, how to answer a call written as text."""
    from uniagent.rollout import TokenRollout

    class Tagging(TokenRollout):
        def answer_text_call(self, content, name, call_id, wrap):
            return {"role": "user", "content": "[tagged] " + wrap(content)}

    model = ScriptedTokenModel(
        qwen3_tokenizer,
        [hermes_call("shell", {"command": "echo hi"}), hermes_call("done")],
        sampling_params={"max_tokens": 200},
    )
    env = open_env({"type": "host", "isolation": "none"})
    await env.start()
    try:
        loop = AgentInteraction(model, env, TOOLS, HermesParser(), InteractionConfig())
        cache = Tagging.start(qwen3_tokenizer, [{"role": "user", "content": "go"}], [])
        outcome = await loop.run(cache)
    finally:
        await env.close()
    assert outcome.exit_reason is ExitReason.FINISHED
    answers = [m for m in outcome.messages if m["role"] in ("user", "tool")][1:]
    tagged = "[tagged] <tool_response>\nhi\n\n</tool_response>"
    assert answers == [{"role": "user", "content": tagged}]
    assert cache.check_exactness().ok


@pytest.mark.parametrize(
    ("script", "reason"),
    [
        ([ModelError("server unreachable after 4 retries")], ExitReason.MODEL_ERROR),
        ([hermes_call("shell", {"command": "kill -9 $$"})], ExitReason.AGENT_KILLED_SHELL),
        ([hermes_call("done")], ExitReason.FINISHED),
    ],
)
async def test_the_fresh_sandbox_started_ahead_is_stopped_however_the_episode_ends(
    qwen3_tokenizer, script, reason
):
    """grade_in: fresh starts a second sandbox at the baseline: an episode that is masked,
    ends its own shell (not graded) or is graded leaves no sandbox running."""
    from uniagent.env.open_envs import env_scope

    repo = "git init -q && git -c user.name=t -c user.email=t@t commit -q --allow-empty -m base"
    reward = {"name": "command", "grade_in": "fresh", "settings": {"command": "true"}}
    with env_scope() as scope:
        result, _ = await episode(
            qwen3_tokenizer, script, reward=reward, env={"post_setup": [repo]}
        )
        assert result.exit_reason is reason, result.error
        assert len(scope) == 0
