"""EpisodeResult → AgentLoopOutput fields: truncation, masks, log-probs, placeholders."""

from __future__ import annotations

from typing import Any

import pytest

from uniagent.episode import EpisodeResult
from uniagent.exit import ExitReason
from uniagent.interaction.metrics import EpisodeMetrics
from uniagent.rollout import Rollout
from uniagent.verl.output import (
    EXTRA_FIELD_KEYS,
    UNIAGENT_FIELDS,
    episode_fields,
    extras_record,
    placeholder_fields,
)

EOS = 151645
PROMPT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hi."}]


def episode(
    tokenizer: Any,
    *,
    logprobs: bool = True,
    generate: bool = True,
    reason: ExitReason = ExitReason.FINISHED,
    masked: bool = False,
) -> EpisodeResult:
    """A two-turn token-mode episode (or one that never generated)."""
    cache = Rollout.start(tokenizer, PROMPT)
    if generate:
        first = tokenizer.encode("Hello there", add_special_tokens=False) + [EOS]
        cache.append_generation(first, [-0.5] * len(first) if logprobs else None)
        cache.append_messages([{"role": "user", "content": "Again."}])
        second = tokenizer.encode("Hi again", add_special_tokens=False) + [EOS]
        cache.append_generation(second, [-0.25] * len(second) if logprobs else None)
    return EpisodeResult(
        exit_reason=reason,
        traj_masked=masked,
        metrics=EpisodeMetrics(turns=2),
        cache=cache,
        reward=1.0,
    )


def record(fields: Any) -> dict[str, Any]:
    """The uniagent record of converted fields."""
    found = extras_record(fields.extra_fields["extras"])
    assert found is not None
    return found


def convert(result: EpisodeResult, **overrides: Any) -> Any:
    """episode_fields with roomy defaults."""
    kwargs: dict[str, Any] = {
        "prompt_length": 512,
        "response_length": 512,
        "want_logprobs": True,
        "reward_configured": True,
        "end_token_id": EOS,
    }
    return episode_fields(result, **{**kwargs, **overrides})


def test_trained_episode_keeps_ids_mask_and_logprobs(qwen3_tokenizer: Any) -> None:
    """Mask 1 exactly under generated ids, their log-probs, 0.0 elsewhere; reward kept."""
    result = episode(qwen3_tokenizer)
    fields = convert(result)
    cache = result.cache
    assert cache is not None
    assert fields.prompt_ids == cache.prompt_ids
    assert fields.response_ids == cache.response_ids
    assert fields.response_mask == cache.response_mask
    assert fields.response_logprobs == cache.response_logprobs
    assert fields.reward_score == 1.0
    assert fields.num_turns == 4  # two assistant turns, one user turn, plus the prompt
    assert set(fields.extra_fields) == set(EXTRA_FIELD_KEYS)
    assert set(record(fields)) == set(UNIAGENT_FIELDS)
    assert record(fields)["traj_masked"] is False


def test_response_cut_to_length_stays_aligned(qwen3_tokenizer: Any) -> None:
    """A response longer than response_length keeps its head, all three lists alike."""
    result = episode(qwen3_tokenizer)
    assert result.cache is not None
    full = len(result.cache.response_ids)
    fields = convert(result, response_length=full - 3)
    assert len(fields.response_ids) == len(fields.response_mask) == full - 3
    assert fields.response_logprobs is not None and len(fields.response_logprobs) == full - 3
    assert record(fields)["truncated"] is True


def test_logprobs_only_when_verl_asks(qwen3_tokenizer: Any) -> None:
    """calculate_log_probs=False: None for every sample, even when the server sent some."""
    assert convert(episode(qwen3_tokenizer), want_logprobs=False).response_logprobs is None


def test_missing_logprobs_mask_the_trajectory(qwen3_tokenizer: Any) -> None:
    """Asked for but not returned: zeros for alignment, and nothing is trained on them."""
    fields = convert(episode(qwen3_tokenizer, logprobs=False))
    assert fields.response_logprobs == [0.0] * len(fields.response_ids)
    assert set(fields.response_mask) == {0}
    assert record(fields)["traj_masked"] is True
    assert fields.reward_score == 0.0


def test_masked_exit_keeps_ids_with_zero_mask(qwen3_tokenizer: Any) -> None:
    """traj_masked (e.g. model_error): ids kept for inspection, mask all 0, reward 0.0."""
    result = episode(qwen3_tokenizer, reason=ExitReason.MODEL_ERROR, masked=True)
    fields = convert(result)
    assert result.cache is not None
    assert fields.response_ids == result.cache.response_ids
    assert set(fields.response_mask) == {0}
    assert fields.reward_score == 0.0
    assert record(fields)["exit_reason"] == "model_error"


def test_prompt_longer_than_prompt_length_is_masked(qwen3_tokenizer: Any) -> None:
    """The model saw the whole prompt; a cut one would train on another context: masked."""
    result = episode(qwen3_tokenizer)
    assert result.cache is not None
    fields = convert(result, prompt_length=5)
    assert fields.prompt_ids == result.cache.prompt_ids[-5:]
    assert set(fields.response_mask) == {0}
    assert record(fields)["traj_masked"] is True
    assert "prompt_length" in record(fields)["error"]


def test_no_generation_gives_one_masked_token(qwen3_tokenizer: Any) -> None:
    """An empty response still has a last valid token for the reward (mask 0)."""
    fields = convert(episode(qwen3_tokenizer, generate=False, reason=ExitReason.MODEL_ERROR))
    assert fields.response_ids == [EOS] and fields.response_mask == [0]
    assert fields.response_logprobs == [0.0]


@pytest.mark.parametrize("want", [True, False])
@pytest.mark.parametrize("reward", [True, False])
def test_placeholder(want: bool, reward: bool) -> None:
    """Placeholders agree with the batch: log-probs iff asked, reward iff the agent scores."""
    fields = placeholder_fields(
        prompt_ids=list(range(10)),
        prompt_length=4,
        want_logprobs=want,
        reward_configured=reward,
        end_token_id=EOS,
        exit_reason=ExitReason.ENV_ERROR,
    )
    assert fields.prompt_ids == [6, 7, 8, 9]
    assert fields.response_ids == [EOS] and fields.response_mask == [0]
    assert fields.response_logprobs == ([0.0] if want else None)
    assert fields.reward_score == (0.0 if reward else None)
    assert record(fields)["traj_masked"] is True
    assert record(fields)["exit_reason"] == "env_error"
    assert set(fields.extra_fields) == set(EXTRA_FIELD_KEYS)


@pytest.mark.parametrize(
    ("credit", "at_turns"),
    [("outcome", [0.0, 0.0]), ("turn", [0.5, -0.25]), ("discounted", [0.375, -0.25])],
)
def test_turn_credit_on_each_turns_last_generated_token(
    qwen3_tokenizer: Any, credit: str, at_turns: list[float]
) -> None:
    """token_scores name each turn's last mask-1 token; the v1 output's rm_scores carry them."""
    from uniagent.verl.agent_loop import _output

    result = episode(qwen3_tokenizer)
    result.turn_scores = {0: 0.5, 1: -0.25}
    fields = convert(result, credit=credit, gamma=0.5)
    mask = fields.response_mask
    ends = [i for i, m in enumerate(mask) if m and (i + 1 == len(mask) or not mask[i + 1])]
    assert len(ends) == 2
    expected = [[e, v] for e, v in zip(ends, at_turns, strict=True) if v]
    assert record(fields)["token_scores"] == expected
    assert fields.extra_fields["turn_scores"] == [0.5, -0.25]
    rm_scores = _output(fields).as_dict()["rm_scores"].tolist()  # what the v1 trainer stores
    want = [0.0] * len(mask)
    want[-1] += 1.0  # the episode's reward on the last token
    for end, value in zip(ends, at_turns, strict=True):
        want[end] += value
    assert rm_scores == pytest.approx(want)


def test_a_masked_episode_gets_no_turn_credit(qwen3_tokenizer: Any) -> None:
    result = episode(qwen3_tokenizer, masked=True)
    result.turn_scores = {0: 0.5}
    fields = convert(result, credit="turn")
    assert record(fields)["token_scores"] == [] and fields.extra_fields["turn_scores"] == []
