"""The run folder's pieces: directory names, the manifest, retries and the breaker."""

from __future__ import annotations

import json
import os

import pytest

from uniagent.errors import ConfigError
from uniagent.run.folder import safe_name, start_attempt, write_task_error
from uniagent.run.manifest import differences, public_argv, public_model_spec, resume
from uniagent.run.results import done_keys, latest
from uniagent.run.retry import CircuitBreaker, RetryPolicy, cause_of, default_window


@pytest.mark.parametrize(
    "ids",
    [
        ["proj/issue-1", "proj_issue-1", "proj issue-1", "proj:issue-1"],
        [".hidden", "hidden", "_hidden"],
        ["a" * 200, "a" * 201],
        ["", "task"],
    ],
)
def test_directory_names_differ_for_different_ids(ids):
    names = [safe_name(i) for i in ids]
    assert len(set(names)) == len(ids)
    assert all("/" not in n and n not in (".", "..") and len(n) < 120 for n in names)


def test_plain_ids_are_their_own_directory_names():
    assert safe_name("django__django-11099") == "django__django-11099"
    assert safe_name("proj/issue-1").startswith("proj_issue-1+")


def test_each_attempt_keeps_its_own_log(tmp_path):
    directory = tmp_path / "ep"
    assert start_attempt(directory) == 1
    (directory / "log.txt").write_text("first")
    assert start_attempt(directory) == 2
    (directory / "log.txt").write_text("second")
    assert start_attempt(directory) == 3
    assert (directory / "attempt-1.log").read_text() == "first"
    assert (directory / "attempt-2.log").read_text() == "second"
    assert (directory / "log.txt").read_text() == "", "the new attempt's log, empty so far"


def test_an_attempt_marks_its_start_in_a_folder_an_earlier_run_left_without_a_log(tmp_path):
    """A Ray worker's log arrives when its episode ends: an interrupted ``--ray`` run
    leaves the folder without ``log.txt``. The next attempt marks the folder anyway."""
    directory = tmp_path / "ep"
    directory.mkdir()
    write_task_error(directory, "t", 0, "task has no field 'problem_statement'")
    os.utime(directory, (1_000_000, 1_000_000))  # left long ago
    assert start_attempt(directory) == 1
    assert directory.stat().st_mtime > 1_000_000
    assert (directory / "log.txt").exists()
    assert not (directory / "task_error.json").exists(), "the earlier attempt's error is gone"


def test_a_task_that_cannot_start_leaves_its_error_in_its_folder(tmp_path):
    directory = tmp_path / "ep"
    write_task_error(directory, "proj/1", 2, "task has no field 'problem_statement'")
    assert json.loads((directory / "task_error.json").read_text()) == {
        "task_id": "proj/1",
        "sample": 2,
        "error": "task has no field 'problem_statement'",
    }


@pytest.mark.parametrize(
    ("spec", "public"),
    [
        ("openai:https://user:sk-1@api.example.com/v1?api-key=sk-2#gpt-4o",
         "openai:https://api.example.com/v1#gpt-4o"),
        ("openai:http://127.0.0.1:8000/v1#Qwen/Qwen3-8B?tokenizer=Qwen/Qwen3-8B",
         "openai:http://127.0.0.1:8000/v1#Qwen/Qwen3-8B?tokenizer=Qwen/Qwen3-8B"),
        ("hf:smollm2", "hf:smollm2"),
    ],
)  # fmt: skip
def test_model_specs_lose_their_credentials(spec, public):
    assert public_model_spec(spec) == public
    assert "sk-" not in " ".join(public_argv(["uniagent", "run", "--model", spec]))
    assert "sk-" not in " ".join(public_argv(["uniagent", "run", f"--model={spec}"]))


def manifest(max_turns: int, model: str = "openai:http://h/v1#m", digest: str = "a" * 64):
    return {
        "run_id": "r1", "started_at": "t0", "model": {"spec": model, "api_key_env": "X"},
        "config": {"interaction": {"max_turns": max_turns}}, "tasks": {"sha256": digest},
    }  # fmt: skip


def test_a_resume_must_be_the_same_run():
    old = manifest(15)
    assert differences(old, manifest(15)) == []
    assert differences(old, {**manifest(15), "model": {"spec": "openai:http://h/v1#m"}}) == [], (
        "where the key comes from is not the model"
    )
    assert differences(old, manifest(3)) == ["config.interaction.max_turns: 15 -> 3"]
    assert differences(old, manifest(15, digest="b" * 64))[0].startswith("tasks.sha256")
    with pytest.raises(ConfigError, match="--force-resume"):
        resume(old, {**manifest(3), "started_at": "t1"}, force=False)
    forced = resume(old, {**manifest(3), "started_at": "t1"}, force=True)
    assert forced["run_id"] == "r1" and forced["started_at"] == "t0"
    assert forced["resumed_at"] == ["t1"]
    assert forced["changes"] == [{"at": "t1", "differences": ["config.interaction.max_turns: "
                                                              "15 -> 3"]}]  # fmt: skip


def record(task: str, reason: str, error: str | None = None) -> dict:
    return {"task_id": task, "sample": 0, "exit_reason": reason, "error": error}


def test_only_policy_outcomes_are_done_and_the_latest_record_counts():
    records = latest([record("a", "model_error"), record("a", "finished"),
                      record("b", "env_error"), record("c", "format_error")])  # fmt: skip
    assert records[("a", 0)]["exit_reason"] == "finished"
    assert done_keys(records, keep_failures=False) == {("a", 0), ("c", 0)}
    assert done_keys(records, keep_failures=True) == {("a", 0), ("b", 0), ("c", 0)}


def test_the_breaker_trips_only_on_a_first_streak_of_one_infrastructure_reason():
    traceback = ("Traceback (most recent call last):\n  File \"x.py\", line 1\n"
                 "uniagent.env.errors.EnvStartError: could not pull image x\n")  # fmt: skip
    breaker = CircuitBreaker(3)
    assert not breaker.observe(record("a", "env_error", traceback))
    assert not breaker.observe(record("b", "env_error", traceback))
    assert breaker.observe(record("c", "env_error", traceback))
    assert "the first 3 episodes all failed with env_error" in breaker.message()
    assert "EnvStartError: could not pull image x" in breaker.message()

    mixed = CircuitBreaker(3)
    for reason in ("env_error", "model_error", "env_error", "env_error"):
        assert not mixed.observe(record("t", reason))
    healthy = CircuitBreaker(3)
    healthy.observe(record("t", "finished"))
    assert not any(healthy.observe(record("t", "env_error")) for _ in range(10))
    assert not CircuitBreaker(0).observe(record("t", "env_error"))
    # One task failing and retried is one episode, not a streak; its success disarms.
    retried = CircuitBreaker(3)
    assert not retried.observe(record("a", "env_error"))
    assert not any(retried.observe(record("a", "env_error"), first=False) for _ in range(5))
    assert not retried.observe(record("b", "env_error"))
    assert retried.observe(record("c", "env_error"))
    recovered = CircuitBreaker(3)
    recovered.observe(record("a", "env_error"))
    recovered.observe(record("a", "finished"), first=False)
    assert not any(recovered.observe(record(t, "env_error")) for t in "bcdef")


def test_retry_delays_double_up_to_a_cap_and_the_window_follows_concurrency():
    policy = RetryPolicy(retries=5, delay=10)
    assert [policy.backoff(k) for k in (1, 2, 3, 6)] == [10, 20, 40, 300]
    assert [default_window(c) for c in (1, 4, 64)] == [3, 4, 10]
    assert cause_of(record("t", "model_error", "http://h failed: 502")) == (
        "model_error: http://h failed: 502"
    )
