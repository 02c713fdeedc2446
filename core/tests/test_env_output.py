"""Output cleaning, truncation and the syntax check's fast path (against real ``bash -n``)."""

from __future__ import annotations

import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from uniagent.env.output import RUNTIME_DROP_NOTE, clean_output, truncate_output
from uniagent.env.syntax import obviously_valid


@pytest.mark.parametrize(
    ("raw", "clean"),
    [
        ("plain\ttext\n", "plain\ttext\n"),
        ("\x1b[1;31mred\x1b[0m\n", "red\n"),
        ("a\r\nb\r\n", "a\nb\n"),
        ("10%\r50%\r100%\n", "100%\n"),
        ("done\r\n", "done\n"),
        ("spinner |\rspinner /\r\x1b[Kfinished\n", "finished\n"),
        ("abc\x08\x08X\n", "aX\n"),
        ("\x1b]0;window title\x07prompt\n", "prompt\n"),
        ("bell\x07 nul\x00 esc\x1b\n", "bell nul esc\n"),
        ("keep trailing cr\r", "keep trailing cr"),
    ],
)
def test_clean_output(raw: str, clean: str) -> None:
    assert clean_output(raw) == clean


def test_truncate_keeps_head_and_tail_and_counts() -> None:
    text = "".join(str(i % 10) for i in range(10_000))
    out, dropped = truncate_output(text, 1000)
    assert dropped == 9000
    assert out.startswith(text[:500]) and out.endswith(text[-500:])
    assert "[... 9000 characters of output omitted" in out
    assert truncate_output("short", 1000) == ("short", 0)
    assert truncate_output("x" * 5000, 0) == ("x" * 5000, 0)


def test_truncate_counts_what_a_runtime_dropped() -> None:
    note = RUNTIME_DROP_NOTE.format(n=1_000_000, limit=2000)
    text = "h" * 1000 + note + "t" * 1000
    _, dropped = truncate_output(text, 200)
    assert dropped == 1_000_000 + 2000 - 200  # every character not kept, none of the note's


@pytest.mark.parametrize(
    "command",
    [
        "ls -la",
        "cd /testbed && python -m pytest tests/test_x.py -q 2>&1 | tail -5",
        "echo hi > out.txt; cat < out.txt >> all.log",
        "make -j4 &> build.log &",
        "grep -rn foo src | head -20 ; echo done ;",
        "ls *.py ?.txt",
        "echo héllo",
        "A=1 B=2 env",
        "grep -rn 'def foo(' src/ | head",
        'git commit -qm "fix: handle (#3) & more"',
        'echo "$HOME/${USER}" $? > "out file.txt"',
    ],
)
def test_obviously_valid_accepts_simple_commands(command: str) -> None:
    assert obviously_valid(command)
    assert _bash_n(command)


@pytest.mark.parametrize(
    "command",
    [
        "",
        "echo it\\'s",
        "if true; then echo x; fi",
        "for f in *; do echo $f; done",
        "ls |",
        "ls &&",
        "; ls",
        "ls ;;",
        "echo >",
        "cat <<EOF",
        "echo $(pwd)",
        'echo "$(pwd)"',
        'echo "unterminated',
        "echo 'unterminated",
        'echo "a\\"b"',
        'echo "!x"',
        "done",
        "echo a\necho b",
        "{ ls; }",
        "ls[",
        "ls ;& x",
        "ls [ab]*.txt",
    ],
)
def test_obviously_valid_defers_everything_else(command: str) -> None:
    assert not obviously_valid(command)


TOKENS = st.sampled_from(
    [
        " ", "  ", "\t", "ls", "echo", "x", "a=b", "if", "then", "fi", "do", "done", "for",
        "in", "time", "{", "}", "[[", "]]", "!", "|", "||", "&&", "&", ";", ";;", "|&", ">",
        ">>", "<", "<>", ">|", "2>", "2>&1", ">&2", "&>", "&>>", "1", "-n", "*", "?", "[",
        "]", "~", "=", "%", "^", "é", "<<", "<&0", ">&-", "case", "esac", "-", ".", ";&",
        ";;&", "'", '"', "'a b'", '"x $y"', "\"'\"", "'\"'",
        '"$?"', "$HOME", "${HOME}", "'(;|)'", '"(;|)"', "$", "${", "$(", '"${x}"', "''",
    ]
)  # fmt: skip


def _bash_n(command: str) -> bool:
    result = subprocess.run(["bash", "-n"], input=command.encode(), capture_output=True)
    return result.returncode == 0


@settings(max_examples=600, deadline=None)
@given(st.lists(TOKENS, min_size=1, max_size=8).map("".join))
def test_obviously_valid_never_accepts_what_bash_rejects(command: str) -> None:
    if obviously_valid(command):
        assert _bash_n(command), command
