"""The screen on a corpus of real agent commands (which must run) and blocking ones.

The corpus is ``data/screen_corpus.yaml``; its header says where each command
comes from.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from uniagent_tools_swe import DEFAULT_BLOCKED
from uniagent_tools_swe.blocking import screen
from uniagent_tools_swe.shell import parse_commands

CORPUS: dict[str, list[dict[str, Any]]] = yaml.safe_load(
    (Path(__file__).parent / "data" / "screen_corpus.yaml").read_text(encoding="utf-8")
)
ALLOWED = CORPUS["allowed"]
REFUSED = CORPUS["refused"]


def _id(entry: dict[str, Any]) -> str:
    return entry["command"].splitlines()[0][:60]


def test_the_corpus_is_large_and_mostly_real() -> None:
    from_trajectories = [e for e in ALLOWED if e["from"] != "constructed"]
    assert len(from_trajectories) >= 200
    assert all(e.get("file") for e in from_trajectories)
    assert len(REFUSED) >= 40
    assert {e["rule"] for e in REFUSED} == {rule.name for rule in DEFAULT_BLOCKED}


@pytest.mark.parametrize("entry", ALLOWED, ids=_id)
def test_agent_commands_run(entry: dict[str, Any]) -> None:
    verdict = screen(entry["command"])
    assert verdict is None, f"refused by {verdict.rule.name}: {verdict.simple_command}"


@pytest.mark.parametrize("entry", REFUSED, ids=_id)
def test_blocking_commands_are_refused(entry: dict[str, Any]) -> None:
    verdict = screen(entry["command"])
    assert verdict is not None, "not refused"
    assert verdict.rule.name == entry["rule"]


def test_real_commands_are_parsed_not_skipped() -> None:
    # The screen runs an unparsable command unscreened, so nearly every real command
    # must parse (heredocs with a quoted delimiter are a quarter of them).
    real = [e["command"] for e in ALLOWED if e["from"] != "constructed"]
    unparsed = [c for c in real if parse_commands(c) is None]
    assert unparsed == []
