"""Output cleaning and truncation, the syntax check's fast path (against real ``bash -n``),
fatal-signal messages, and the control protocol's pieces."""

from __future__ import annotations

import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from uniagent.env import output
from uniagent.env.bash_protocol import (
    MarkerParser,
    OutputBuffer,
    command_prefix,
    new_nonce,
    quote,
    resync_line,
    trailer,
)
from uniagent.env.output import (
    RAW_WINDOW,
    RUNTIME_DROP_NOTE,
    clean_output,
    fit_output,
    render_output,
    signal_messages,
    truncate_output,
)
from uniagent.env.syntax import MAX_CHARS, obviously_valid


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


def erase_pairs_until_nothing_changes(text: str) -> str:
    """Backspaces as a terminal applies them, the obvious way (quadratic in a run of them)."""
    import re

    pair = re.compile(r"[^\n\x08]\x08")
    previous = None
    while previous != text:
        previous, text = text, pair.sub("", text)
    return text.replace("\x08", "")


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="ab\x08\n\t", max_size=60))
def test_backspaces_erase_as_a_terminal_does(raw: str) -> None:
    assert clean_output(raw) == erase_pairs_until_nothing_changes(raw)


def test_a_long_run_of_backspaces_is_cleaned_in_one_pass() -> None:
    # The agent prints these bytes: 400k characters erased by 400k backspaces, then a
    # line whose backspaces outnumber its characters (the extra ones erase nothing).
    n = 400_000
    raw = "x" * n + "\x08" * n + "kept\n" + "ab" + "\x08" * 5 + "c"
    assert clean_output(raw) == "kept\nc"


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


def test_fit_output_is_clean_then_truncate_within_its_window() -> None:
    text = "\x1b[31mred\x1b[0m\r\nline\r bar\rdone\n" + "ab\x08c" * 500
    for limit in (0, 300, 100_000):  # 2 * RAW_WINDOW * 300 > len(text)
        assert fit_output(text, limit) == truncate_output(clean_output(text), limit)[0]


def test_fit_output_cleans_a_bounded_window_of_a_huge_output(monkeypatch) -> None:
    # What the agent prints: megabytes of backspaces, carriage returns, escapes, a long line.
    chunk = "x" * 1000 + "\x08" * 900 + "\r" * 50 + "\x1b[2K\x1b]0;t\x07" + "y" * 3000 + "\n"
    raw = "HEAD\n" + chunk * 1200 + "z" * 2_000_000 + "\nTAIL"
    cleaned: list[int] = []
    clean = output.clean_output

    def counted(text: str) -> str:
        cleaned.append(len(text))
        return clean(text)

    monkeypatch.setattr(output, "clean_output", counted)
    limit = 10_000
    fitted = fit_output(raw, limit)
    assert sum(cleaned) == 2 * RAW_WINDOW * limit  # the ends only, however much was printed
    assert fitted.startswith("HEAD\n") and fitted.endswith("z\nTAIL")
    assert len(fitted) < limit + 200
    omitted = int(fitted.split("[... ")[1].split(" characters")[0])
    # Everything not shown is counted: what went before cleaning and what cleaning kept but
    # the limit did not.
    assert omitted > len(raw) - 2 * RAW_WINDOW * limit


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


def test_obviously_valid_leaves_long_commands_to_bash() -> None:
    assert obviously_valid("echo " + "x" * 100)
    assert not obviously_valid("echo " + "x" * MAX_CHARS)


# -- what a terminal shows for fatal signals ----------------------------------------------------
NOTE = "bash: [42: 1 (255)] tcsetattr: Inappropriate ioctl for device\n"


@pytest.mark.parametrize(
    ("text", "code", "shown"),
    [
        (f"out\n{NOTE}", 137, "out\nKilled\n"),
        (f"{NOTE}", 139, "Segmentation fault\n"),
        (f"{NOTE}", 134, "Aborted\n"),
        (f"{NOTE}", 130, ""),  # Ctrl-C: a terminal shows no message
        (f"{NOTE}", 141, ""),  # SIGPIPE (yes | head): neither
        (f"a\n{NOTE}b\n{NOTE}", 143, "a\nb\nTerminated\n"),  # only the last is known
        (f"{NOTE}done\n", 0, "done\n"),  # not the line's status: no guess
        ("plain\n", 137, "plain\n"),  # a status of 137 without a death is an exit(137)
    ],
)
def test_signal_messages(text: str, code: int, shown: str) -> None:
    assert signal_messages(text, code) == shown


def test_render_output_keeps_its_limit_with_escapes() -> None:
    head, tail = b"\xff" * 600, b"\xfe" * 600  # each byte becomes 4 characters
    text = render_output(head, 5000, tail, 1024, None)
    assert len(text) <= 1024 + len(RUNTIME_DROP_NOTE) + 20
    assert text.startswith("\\xff") and text.endswith("\\xfe")
    assert render_output(b"", 0, b"ok\n", 1024, 0) == "ok\n"


# -- the control protocol -----------------------------------------------------------------------
def test_markers_are_found_across_reads_and_junk_is_kept() -> None:
    parser = MarkerParser()
    stream = b"bash: no job control\n\x1eS\x1e\x1eE0123456789abcdef|0 1 7\x1e$ "
    markers = [m for i in range(len(stream)) for m in parser.feed(stream[i : i + 1])]
    assert [m.kind for m in markers] == ["S", "E"]
    end = markers[1]
    assert (end.nonce, end.exit_code, end.ran, end.generation) == ("0123456789abcdef", 0, True, "7")
    assert parser.take_junk() == "bash: no job control\n$ "
    forged = MarkerParser().feed(b"\x1eEnot-a-nonce|0 1 1\x1e")[0]
    assert forged.kind == "E" and forged.nonce == ""
    resync = MarkerParser().feed(b"\x1eE0123456789abcdef|130 1 9 4  8\x1e")[0]
    assert resync.previous == (4, False, "8")


def test_output_buffer_memory_is_bounded() -> None:
    buffer = OutputBuffer(1 << 20)
    chunk = bytes(range(256)) * 1024  # 256 KiB
    for _ in range(400):  # 100 MiB
        buffer.feed(chunk)
        assert len(buffer) <= (1 << 20) + len(chunk)
    head, dropped, tail = buffer.take()
    assert len(head) == len(tail) == 1 << 19
    assert dropped == 400 * len(chunk) - (1 << 20)
    assert head == (chunk * 2)[: 1 << 19] and tail == (chunk * 2)[-(1 << 19) :]


@settings(max_examples=150, deadline=None)
@given(st.lists(TOKENS, min_size=1, max_size=8).map("".join), st.booleans())
def test_every_line_the_session_sends_parses(command: str, check: bool) -> None:
    before, after = command_prefix(check=check, pty_fd=11, interactive=False)
    line = before + quote(command) + after + trailer(new_nonce(), "3")
    assert _bash_n(line), line
    assert _bash_n(resync_line(new_nonce(), "4"))
