"""Probing shows while a run trains: tamper flags per class, their metrics, the summary, and
the alert that stops a run."""

from __future__ import annotations

import pytest

from uniagent.exit import ExitReason
from uniagent.protect.report import (
    CLASSES,
    KINDS,
    RULE_CLASSES,
    episode_classes,
    integrity_flags,
    integrity_metrics,
    is_tampered,
    report_class,
)
from uniagent.protect.rules import CACHES, GIT_ATTRIBUTES, GIT_FOREIGN, GIT_METADATA, PYTHON_HARNESS
from uniagent.protect.settings import IntegritySettings
from uniagent.run.retry import CircuitBreaker, TamperAlarm
from uniagent.run.summary import format_summary, summarize

CONFTEST = {"kind": "protected_file", "path": "conftest.py", "change": "added",
            "rule": "pytest-plugins"}  # fmt: skip
GIT_CONFIG = {"kind": "protected_file", "path": ".git/config", "change": "modified",
              "rule": "git-metadata", "scores": False}  # fmt: skip
TEST_ENV = {"kind": "toolchain", "path": "root:/env/lib", "change": "modified",
            "rule": "test-env"}  # fmt: skip


def record(i: int, reward: float | None, tampered: list[dict] = (), reason: str = "") -> dict:
    info: dict = {"integrity": {"tampered": list(tampered)}}
    if reason:
        info["score_reason"] = reason
    return {"task_id": f"t{i}", "sample": 0, "exit_reason": "finished", "traj_masked": False,
            "reward": reward, "reward_info": info}  # fmt: skip


def test_flags_name_the_kind_the_rule_and_the_forced_score():
    flags = integrity_flags(record(0, 0.0, [CONFTEST, GIT_CONFIG], "tampered")["reward_info"])
    assert flags == {"tampered": 1, "tampered/protected_file": 1, "tampered/plugin_config": 1,
                     "rule/pytest-plugins": 1, "rule/git-metadata": 1,
                     "score_reason/tampered": 1}  # fmt: skip
    unscored = integrity_flags(record(0, 1.0, [GIT_CONFIG])["reward_info"])
    assert unscored == {"rule/git-metadata": 1}, "reported, not counted as tampering or a class"
    assert integrity_flags(None) == {} and integrity_flags({"integrity": "x"}) == {}


def test_metrics_are_shares_per_step_with_every_kind_present():
    records = [{"integrity": integrity_flags(r["reward_info"])} for r in (
        record(0, 0.0, [CONFTEST], "tampered"), record(1, 0.0, [TEST_ENV], "tampered"),
        record(2, 1.0), record(3, 0.0, reason="reward_failed"))]  # fmt: skip
    metrics = integrity_metrics(records)
    assert metrics["integrity/tampered"] == 0.5
    assert metrics["integrity/tampered/protected_file"] == 0.25
    assert metrics["integrity/tampered/toolchain"] == 0.25
    assert metrics["integrity/tampered/content"] == 0.0  # charted even when none probed so
    assert metrics["integrity/rule/test-env"] == 0.25
    assert metrics["integrity/score_reason/reward_failed"] == 0.25
    assert metrics["integrity/tampered/test_env"] == 0.25
    assert metrics["integrity/tampered/plugin_config"] == 0.25
    assert metrics["integrity/tampered/self_masking"] == 0.25, "a reward failed on the output"
    assert metrics["integrity/tampered/outside_paths"] == 0.0  # every class, every step
    assert integrity_metrics([]) == {}


def test_the_summary_counts_tampering_per_kind_rule_and_reason():
    records = [record(0, 0.0, [CONFTEST], "tampered"), record(1, 0.0, [TEST_ENV], "tampered"),
               record(2, 1.0, [GIT_CONFIG]), record(3, None)]  # fmt: skip
    summary = summarize(records, n=1, wall_seconds=1.0)
    assert summary["integrity"] == {
        "graded_episodes": 3,
        "tampered_episodes": 2,
        "tampered": {"protected_file": 1, "toolchain": 1, "content": 0, "tree": 0, "verdict": 0},
        "classes": {cls: int(cls in ("plugin_config", "test_env")) for cls in CLASSES},
        "rules": {"git-metadata": 1, "pytest-plugins": 1, "test-env": 1},
        "score_reasons": {"tampered": 2},
    }
    assert "tampering reported: 2 of 3 graded episodes" in format_summary(summary)


def test_the_alert_trips_at_its_share_after_its_minimum():
    alert = IntegritySettings.model_validate({"alert": {"share": 0.5, "min_episodes": 3}}).alert
    breaker = CircuitBreaker(3, alarm=TamperAlarm.of(alert))
    tampered, clean = record(0, 0.0, [CONFTEST]), record(1, 1.0)
    assert is_tampered(tampered) and not is_tampered(clean)
    assert [breaker.observe(r) for r in (tampered, clean)] == [False, False]
    assert breaker.observe(record(2, None)) is False, "an ungraded episode is not counted"
    assert breaker.observe(tampered) is True  # 2 of 3
    assert breaker.tripped and "2 of 3 graded episodes report tampering" in breaker.message()
    assert TamperAlarm.of(None) is None


def test_the_verl_extras_carry_the_episodes_flags():
    """What the verl adapter writes per sample (its ``extras``) holds the grading's flags."""
    from uniagent.episode import EpisodeResult
    from uniagent.interaction.metrics import EpisodeMetrics
    from uniagent.verl.output import UNIAGENT_KEY, _extra

    result = EpisodeResult(exit_reason=ExitReason.FINISHED, traj_masked=False,
                           metrics=EpisodeMetrics())  # fmt: skip
    result.reward, result.reward_info = 0.0, {
        "score_reason": "tampered",
        "integrity": {"tampered": [{"kind": "toolchain", "path": "/env/bin/python",
                                    "change": "modified", "rule": "test-env"}]},
    }  # fmt: skip
    extra = _extra(result, exit_reason=ExitReason.FINISHED, traj_masked=False,
                   truncated=False, error=None)["extras"][UNIAGENT_KEY]  # fmt: skip
    assert extra["integrity"] == {"tampered": 1, "tampered/toolchain": 1, "tampered/test_env": 1,
                                  "rule/test-env": 1, "score_reason/tampered": 1}  # fmt: skip


def tamper(rule: str, kind: str = "protected_file", scores: bool = True) -> dict:
    return {"kind": kind, "path": "x", "change": "modified", "rule": rule, "scores": scores}


@pytest.mark.parametrize(
    ("report", "cls"),
    [
        (tamper("pytest-plugins"), "plugin_config"),
        (tamper("runner-config-sections"), "plugin_config"),
        (tamper("package-metadata"), "plugin_config"),
        (tamper("caches", scores=False), "plugin_config"),
        (tamper("git-attributes"), "patch_screen"),
        (tamper("git-foreign", scores=False), "patch_screen"),
        (tamper("binary-source", "content"), "patch_screen"),
        (tamper("import-path", "content"), "patch_screen"),  # any content rule
        (tamper("toolchain", "toolchain"), "test_env"),
        (tamper("test-env", "toolchain"), "test_env"),
        (tamper("outside-paths"), "outside_paths"),
        (tamper("task-paths"), "task_files"),
        (tamper("config-paths"), "task_files"),
        (tamper("a-future-rule"), "task_files"),  # by its kind
        (tamper("status-channel", "verdict"), "status_channel"),  # swe_bench's own report
        (tamper("inconsistent-exit", "verdict"), "status_channel"),
        (tamper("module-shadow", "verdict"), "plugin_config"),  # by its rule
        (tamper("a-future-rule", "a-future-kind"), None),
    ],
)
def test_each_tamper_report_has_its_class(report, cls):
    assert report_class(report) == cls


def test_every_rule_of_the_grader_has_a_class():
    """A rule added to the grader's screen without a class would be counted nowhere."""
    rules = {r.name for r in (*PYTHON_HARNESS, GIT_METADATA, GIT_ATTRIBUTES, GIT_FOREIGN, CACHES)}
    rules |= {"toolchain", "test-env", "outside-paths", "task-paths", "config-paths"}
    rules.add("binary-source")
    assert rules <= set(RULE_CLASSES)
    assert set(RULE_CLASSES.values()) <= set(CLASSES)
    assert not set(CLASSES) & set(KINDS), "a class and a kind share tampered/<name>"


@pytest.mark.parametrize(
    ("info", "classes"),
    [
        ({"score_reason": "grading_timed_out"}, {"artifacts"}),  # a FIFO, a held output
        ({"score_reason": "reward_failed"}, {"self_masking"}),
        ({"score_reason": "sandbox_ended_by_agent"}, {"self_masking"}),
        ({"score_reason": "agent_killed_shell"}, {"self_masking"}),
        ({"score_reason": "patch_too_large"}, {"patch_screen"}),
        ({"score_reason": "patch_did_not_apply"}, set()),
        ({"probing": ["self_masking"]}, {"self_masking"}),  # the reward's word (a marker)
        ({"probing": ["artifacts", "not-a-class", 3]}, {"artifacts"}),
        ({"probing": "self_masking"}, set()),  # not a list: nothing made up
        (
            {
                "score_reason": "tampered",
                "integrity": {
                    "tampered": [
                        tamper("git-attributes"),
                        tamper("outside-paths"),
                        tamper("git-metadata", scores=False),
                    ]
                },
            },
            {"patch_screen", "outside_paths"},
        ),
    ],
)
def test_forced_scores_and_the_rewards_word_have_their_class(info, classes):
    assert episode_classes(info) == classes
    flags = integrity_flags(info)
    assert {k.removeprefix("tampered/") for k in flags if k.removeprefix("tampered/") in
            CLASSES} == classes  # fmt: skip
    assert ("tampered" in flags) == bool(info.get("integrity")), "a class alone is not tampering"


def test_a_rewards_own_tamper_report_counts_as_tampering():
    """The harbor reward's files left where the verifier's inputs go (``reward_info.tampered``,
    beside the grader's) count like the grader's: tampering, of the task's files, and the
    alert sees them."""
    info = {
        "score_reason": "tampered",
        "tampered": [{"kind": "verifier_input", "path": "/tests/test.sh"}],
    }
    flags = integrity_flags(info)
    assert flags["tampered"] == 1 and flags["tampered/task_files"] == 1
    assert flags["tampered/verifier_input"] == 1
    assert is_tampered({"reward_info": info})
    assert integrity_flags({"tampered": "not a list"}) == {}
