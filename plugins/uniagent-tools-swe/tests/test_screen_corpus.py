"""The screen on a corpus of real agent commands (which must run) and blocking ones.

The corpus is ``data/screen_corpus.yaml``; its header says where each command
comes from.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import hypothesis
import pytest
import yaml
from hypothesis import strategies as st

from uniagent_tools_swe import DEFAULT_BLOCKED, BlockRule
from uniagent_tools_swe.blocking import _screen_parsed, may_block, screen
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


# -- the pre-check that spares the parse (may_block) -------------------------------------
# Spellings bash reads as a blocking program (or a background job) that a plain text
# search would miss: quotes, backslashes, line continuations, ANSI-C quoting, an `&` that
# a quote or a backslash turns into the background operator.
SPELLINGS = [
    'v""im setup.py',
    "\\vim setup.py",
    "le\\\nss log.txt",
    "$'\\x76im' setup.py",
    "'vi'm x",
    '"/usr/bin/vim" x',
    "a '&'& b",
    "echo \\>&1",
    "echo x\\&& b",
    "sleep 9&",
    "ls&>f&less x",
    'bash -c "bash -c \\"less f\\""',
    "env X=1 nohup vim",
    "x=$(python)",
    "sudo -i",
    "e\\x\\i\\t",
    "git commit",
    "ls 2>&1 | less",
    "cd /repo && vim a.py",
]


def _verdict(found: object) -> tuple[str, str] | None:
    return None if found is None else (found.rule.name, found.simple_command)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "command", [e["command"] for e in ALLOWED + REFUSED] + SPELLINGS, ids=lambda c: c[:60]
)
def test_the_pre_check_never_changes_a_verdict(command: str) -> None:
    assert _verdict(screen(command)) == _verdict(_screen_parsed(command, DEFAULT_BLOCKED))


def test_blocking_spellings_are_still_refused() -> None:
    let_through = [c for c in SPELLINGS if screen(c) is None]
    assert let_through == ["$'\\x76im' setup.py"]  # bashlex leaves $'\x76' as it is


def test_most_real_commands_need_no_parse() -> None:
    # What the pre-check is for: a plain command is answered without bashlex (milliseconds
    # of pure Python per command line, on every command of every episode).
    for command in ("ls -la", "cat README.md | head -n 20", "grep -c root /etc/passwd",
                    "cd /repo && git status", "make 2>&1 | tail -n 5"):  # fmt: skip
        assert may_block(command) is (("git" in command) or ("tail" in command)), command
    real = [e["command"] for e in ALLOWED if e["from"] != "constructed"]
    spared = [c for c in real if not may_block(c)]
    assert len(spared) >= len(real) // 4


def test_a_rule_from_the_config_always_parses() -> None:
    rules = (*DEFAULT_BLOCKED, BlockRule(name="rm", label="rm", pattern=r"^rm ", reason="no"))
    assert may_block("ls -la", rules)
    verdict = screen("ls; rm -rf x", rules)
    assert verdict is not None and verdict.rule.name == "rm"


# Fragments bash gives meaning to, and names the rules catch: random lines of them must
# get the same verdict with the pre-check as with every line parsed.
_FRAGMENTS = [
    "vim", "less", "python3", "bash", "exit", "set -e", "tail -f", "git commit", "top",
    "ls", "x", "f", " ", " ", "\n", "\\\n", "\\", "'", '"', "$'", "&", "&&", " && ", ">&1",
    "2>&1", "&>", "|", ";", "(", ")", "$(", "`", "-c ", "sudo ", "env A=1 ", "timeout 5 ",
    "<<EOF\n", "EOF", "#", "v", "im", "le", "ss", "=", "{", "}", "'&'", "\\&", "\\>", "'>'",
]  # fmt: skip


_NAMES = ["vim", "less", "python3", "bash", "exit", "top", "watch", "tail", "git", "node"]
_BREAKS = ['""', "''", "\\", "\\\n", '"', "'"]


@st.composite
def _spelled(draw: st.DrawFn) -> str:
    """A name the rules catch with quoting or a continuation inside it, between fragments
    (``v''im -f``, ``gi\\t commit``)."""
    name = draw(st.sampled_from(_NAMES))
    cut = draw(st.integers(0, len(name)))
    spelled = name[:cut] + draw(st.sampled_from(_BREAKS)) + name[cut:]
    before = draw(st.lists(st.sampled_from(_FRAGMENTS), max_size=4))
    after = draw(st.lists(st.sampled_from(_FRAGMENTS), max_size=4))
    return "".join(before) + spelled + "".join(after)


_LINES = st.lists(st.sampled_from(_FRAGMENTS), max_size=12).map("".join) | _spelled()


@hypothesis.settings(max_examples=1500, deadline=None, derandomize=True)
@hypothesis.given(_LINES)
def test_random_lines_get_the_parsed_verdict(command: str) -> None:
    assert _verdict(screen(command)) == _verdict(_screen_parsed(command, DEFAULT_BLOCKED))
