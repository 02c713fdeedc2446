"""``agent_metrics``: the ``agent/...`` numbers of a batch's ``extras`` column.

Their way into verl's step metrics is tested with verl's real trainers' code in
``test_transfer_queue.py`` (v1) and ``test_mixed_batches.py`` (classic manager).
"""

from __future__ import annotations

from typing import Any

import pytest

from uniagent.exit import ExitReason
from uniagent.verl.metrics import agent_metrics
from uniagent.verl.output import UNIAGENT_KEY


def row(**fields: Any) -> dict[str, Any]:
    """One row's ``extras`` value, as the adapter writes it."""
    base = {
        "exit_reason": "finished",
        "traj_masked": False,
        "turns": 2,
        "tool_calls": {},
        "format_errors": 0,
        "syntax_errors": 0,
        "timeouts": 0,
        "setup_seconds": 0.0,
        "model_seconds": 0.0,
        "env_seconds": 0.0,
        "reward_seconds": 0.0,
        "truncated": False,
        "error": None,
    }
    return {UNIAGENT_KEY: {**base, **fields}}


def test_shares_counts_and_times() -> None:
    """Exit-reason shares, masked share, error rates, tool calls and the time breakdown."""
    extras = [
        row(
            turns=4,
            tool_calls={"execute_bash": 3, "submit": 1},
            format_errors=1,
            setup_seconds=1.0,
            model_seconds=2.0,
            env_seconds=1.0,
        ),
        row(
            exit_reason="max_step_limit",
            turns=6,
            tool_calls={"execute_bash": 5},
            timeouts=2,
            setup_seconds=1.0,
            model_seconds=4.0,
            env_seconds=1.0,
            truncated=True,
        ),
        row(
            exit_reason="env_error",
            traj_masked=True,
            turns=0,
            error="setup failed",
            setup_seconds=2.0,
        ),
        None,  # another agent loop's row
        {"other_framework": {"exit_reason": "finished"}},
    ]
    m = agent_metrics(extras)
    assert m["agent/samples"] == 3
    assert m["agent/exit_reason/finished"] == pytest.approx(1 / 3)
    assert m["agent/exit_reason/max_step_limit"] == pytest.approx(1 / 3)
    assert m["agent/exit_reason/env_error"] == pytest.approx(1 / 3)
    assert m["agent/exit_reason/model_error"] == 0.0
    assert {k for k in m if k.startswith("agent/exit_reason/")} == {
        f"agent/exit_reason/{r.value}" for r in ExitReason
    }
    assert m["agent/masked_share"] == pytest.approx(1 / 3)
    assert m["agent/truncated_share"] == pytest.approx(1 / 3)
    assert m["agent/failed_share"] == pytest.approx(1 / 3)
    assert (m["agent/turns/mean"], m["agent/turns/max"], m["agent/turns/min"]) == (
        pytest.approx(10 / 3),
        6,
        0,
    )
    assert m["agent/format_errors/mean"] == pytest.approx(1 / 3)
    assert m["agent/format_errors/per_turn"] == pytest.approx(1 / 10)
    assert m["agent/timeouts/share"] == pytest.approx(1 / 3)
    assert m["agent/syntax_errors/mean"] == 0.0
    assert m["agent/tool_calls/mean"] == pytest.approx(3.0)
    assert m["agent/tool_calls/execute_bash/mean"] == pytest.approx(8 / 3)
    assert m["agent/tool_calls/submit/mean"] == pytest.approx(1 / 3)
    assert m["agent/time/model/mean"] == pytest.approx(2.0)
    assert m["agent/time/setup/max"] == 2.0
    assert m["agent/time/model/share"] == pytest.approx(6 / 12)
    assert m["agent/time/reward/share"] == 0.0


def test_exit_reason_of_a_newer_version_is_counted() -> None:
    """A reason this version does not know still gets its share (nothing silently dropped)."""
    m = agent_metrics([row(exit_reason="a_future_reason"), row()])
    assert m["agent/exit_reason/a_future_reason"] == 0.5


def test_no_uniagent_rows_gives_nothing() -> None:
    """A batch of other loops' rows (or an empty one) adds no agent metrics."""
    assert agent_metrics([None, None]) == {}
    assert agent_metrics([]) == {}


def test_tamper_reports_are_shares_per_step() -> None:
    """``integrity/...``: every kind and class each step (0 when unseen), rules and forced
    reasons seen."""
    from uniagent.protect.report import integrity_flags

    tampered = {
        "score_reason": "tampered",
        "integrity": {
            "tampered": [
                {"kind": "protected_file", "path": "setup.cfg", "change": "modified",
                 "rule": "runner-config-sections", "scores": True},
                {"kind": "content", "path": "calc.py", "change": "added",
                 "rule": "pytest-internals", "scores": False},
            ]
        },
    }  # fmt: skip
    extras = [row(integrity=integrity_flags(tampered)), row(integrity={}), row(integrity={})]
    out = agent_metrics(extras)
    assert out["integrity/tampered"] == pytest.approx(1 / 3)
    assert out["integrity/tampered/protected_file"] == pytest.approx(1 / 3)
    assert out["integrity/tampered/content"] == 0.0, "a report that does not score is a rule"
    assert out["integrity/tampered/toolchain"] == 0.0, "every kind, seen or not"
    assert out["integrity/tampered/plugin_config"] == pytest.approx(1 / 3), "the class"
    assert out["integrity/tampered/patch_screen"] == 0.0, "a report that does not score"
    assert out["integrity/tampered/self_masking"] == 0.0, "every class, seen or not"
    assert out["integrity/rule/pytest-internals"] == pytest.approx(1 / 3)
    assert out["integrity/score_reason/tampered"] == pytest.approx(1 / 3)
    assert "integrity/tampered" in agent_metrics([row(integrity={})])
