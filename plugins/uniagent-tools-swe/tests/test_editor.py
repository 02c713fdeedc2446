"""str_replace_editor, installed in a real host sandbox and called as the loop calls it."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from conftest import Sandbox

pytestmark = pytest.mark.asyncio

SAMPLE = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n"


def write(path: Path, text: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return path


# -- view --------------------------------------------------------------------------------
async def test_view_numbers_lines_like_cat_n(sandbox: Sandbox) -> None:
    path = write(sandbox.workdir / "m.py", SAMPLE)
    obs = await sandbox.call("str_replace_editor", command="view", path=str(path))
    assert obs.exit_code == 0
    assert obs.output.splitlines() == [
        f"Here's the result of running `cat -n` on {path}:",
        "     1\tdef add(a, b):",
        "     2\t    return a + b",
        "     3\t",
        "     4\t",
        "     5\tdef sub(a, b):",
        "     6\t    return a - b",
    ]


async def test_view_range_shows_the_given_lines(sandbox: Sandbox) -> None:
    path = write(sandbox.workdir / "m.py", SAMPLE)
    obs = await sandbox.call(
        "str_replace_editor", command="view", path=str(path), view_range=[2, 3]
    )
    assert obs.exit_code == 0
    assert obs.output.splitlines()[1:] == ["     2\t    return a + b", "     3\t"]


async def test_view_range_minus_one_reads_to_the_end(sandbox: Sandbox) -> None:
    path = write(sandbox.workdir / "m.py", SAMPLE)
    obs = await sandbox.call(
        "str_replace_editor", command="view", path=str(path), view_range=[5, -1]
    )
    assert obs.exit_code == 0
    assert obs.output.splitlines()[1:] == ["     5\tdef sub(a, b):", "     6\t    return a - b"]


@pytest.mark.parametrize("view_range", [[1, 1], [6, 6], [1, 6], [6, -1]])
async def test_view_range_accepts_the_edges_of_the_file(
    sandbox: Sandbox, view_range: list[int]
) -> None:
    path = write(sandbox.workdir / "m.py", SAMPLE)
    obs = await sandbox.call(
        "str_replace_editor", command="view", path=str(path), view_range=view_range
    )
    assert obs.exit_code == 0, obs.output
    end = 6 if view_range[1] == -1 else view_range[1]
    assert len(obs.output.splitlines()) == 1 + end - view_range[0] + 1


@pytest.mark.parametrize(
    ("view_range", "expected"),
    [
        ([0, 3], "its first element `0` should be within the range of lines of the file: [1, 6]"),
        ([7, -1], "its first element `7` should be within the range of lines of the file: [1, 6]"),
        ([2, 7], "its second element `7` is beyond the end of the file, which has 6 lines"),
        ([4, 2], "its second element `2` should be -1 (the end of the file) or at least"),
        ([2, -2], "its second element `-2` should be -1"),
    ],
)
async def test_view_range_out_of_bounds_is_an_error(
    sandbox: Sandbox, view_range: list[int], expected: str
) -> None:
    path = write(sandbox.workdir / "m.py", SAMPLE)
    obs = await sandbox.call(
        "str_replace_editor", command="view", path=str(path), view_range=view_range
    )
    assert obs.exit_code == 1
    assert f"Invalid `view_range` {view_range}" in obs.output
    assert expected in obs.output


@pytest.mark.parametrize("raw", ["[1]", "[1, 2, 3]", "[1.5, 2]", "lines 1 to 2", '["a", "b"]'])
async def test_malformed_view_range_is_a_usage_error(sandbox: Sandbox, raw: str) -> None:
    # The argument model already refuses these; the script checks on its own as well.
    path = write(sandbox.workdir / "m.py", SAMPLE)
    obs = await sandbox.run(f"str_replace_editor --command view --path {path} --view_range '{raw}'")
    assert obs.exit_code == 2
    assert "should be a list of two integers [start_line, end_line]" in obs.output


async def test_view_of_an_empty_file_says_it_is_empty(sandbox: Sandbox) -> None:
    path = write(sandbox.workdir / "empty.txt", "")
    obs = await sandbox.call("str_replace_editor", command="view", path=str(path))
    assert obs.exit_code == 0
    assert "(the file is empty)" in obs.output
    obs = await sandbox.call(
        "str_replace_editor", command="view", path=str(path), view_range=[1, 1]
    )
    assert obs.exit_code == 1
    assert "is empty" in obs.output


async def test_view_of_a_directory_lists_two_levels_without_hidden_items(
    sandbox: Sandbox,
) -> None:
    root = sandbox.workdir / "proj"
    for rel in ["a.py", "pkg/b.py", "pkg/deep/c.py", ".git/config", "pkg/.hidden", "docs/x.md"]:
        write(root / rel, "x\n")
    obs = await sandbox.call("str_replace_editor", command="view", path=str(root))
    assert obs.exit_code == 0
    lines = obs.output.splitlines()
    assert lines[0] == (
        f"Here's the files and directories up to 2 levels deep in {root}, excluding hidden items:"
    )
    assert lines[1:] == [
        f"{root}/",
        f"{root}/a.py",
        f"{root}/docs/",
        f"{root}/docs/x.md",
        f"{root}/pkg/",
        f"{root}/pkg/b.py",
        f"{root}/pkg/deep/",
    ]


async def test_view_range_on_a_directory_is_an_error(sandbox: Sandbox) -> None:
    obs = await sandbox.call(
        "str_replace_editor", command="view", path=str(sandbox.workdir), view_range=[1, 2]
    )
    assert obs.exit_code == 1
    assert "`view_range` parameter is not allowed when `path` points to a directory" in obs.output


async def test_long_output_is_clipped_with_a_note(sandbox: Sandbox) -> None:
    path = write(sandbox.workdir / "long.txt", "".join(f"line {i}\n" for i in range(1, 201)))
    await sandbox.export(UNIAGENT_EDITOR_MAX_OUTPUT="300")
    obs = await sandbox.call("str_replace_editor", command="view", path=str(path))
    assert obs.exit_code == 0
    assert "<response clipped>" in obs.output
    assert "     1\tline 1" in obs.output
    assert "line 200" not in obs.output
    assert "were left out. View them with `view_range`" in obs.output
    assert len(obs.output) < 800


async def test_a_single_huge_line_is_cut_too(sandbox: Sandbox) -> None:
    path = write(sandbox.workdir / "min.js", "x" * 5000 + "\n")
    await sandbox.export(UNIAGENT_EDITOR_MAX_OUTPUT="300")
    obs = await sandbox.call("str_replace_editor", command="view", path=str(path))
    assert obs.exit_code == 0
    assert "Line 1 is 5000 characters long and was cut" in obs.output
    assert len(obs.output) < 800


async def test_view_of_a_binary_file_is_an_error(sandbox: Sandbox) -> None:
    path = write(sandbox.workdir / "blob.bin", b"\x7fELF\x00\x01\x02binary")
    obs = await sandbox.call("str_replace_editor", command="view", path=str(path))
    assert obs.exit_code == 1
    assert f"The file {path} appears to be binary" in obs.output


async def test_view_of_a_missing_path_is_an_error(sandbox: Sandbox) -> None:
    path = sandbox.workdir / "nope.py"
    obs = await sandbox.call("str_replace_editor", command="view", path=str(path))
    assert obs.exit_code == 1
    assert f"The path {path} does not exist. Please provide a valid path." in obs.output


async def test_relative_paths_are_rejected_with_a_suggestion(sandbox: Sandbox) -> None:
    write(sandbox.workdir / "m.py", SAMPLE)
    obs = await sandbox.call("str_replace_editor", command="view", path="m.py")
    assert obs.exit_code == 1
    assert "The path m.py is not an absolute path, it should start with `/`." in obs.output
    assert f"Maybe you meant {sandbox.workdir / 'm.py'}?" in obs.output


# -- create ------------------------------------------------------------------------------
async def test_create_writes_the_file_and_its_parent_directories(sandbox: Sandbox) -> None:
    path = sandbox.workdir / "new" / "pkg" / "mod.py"
    obs = await sandbox.call(
        "str_replace_editor", command="create", path=str(path), file_text="x = 1\n"
    )
    assert obs.exit_code == 0
    assert obs.output.strip() == f"File created successfully at: {path}"
    assert path.read_bytes() == b"x = 1\n"


async def test_create_refuses_to_overwrite_a_file(sandbox: Sandbox) -> None:
    path = write(sandbox.workdir / "m.py", SAMPLE)
    obs = await sandbox.call(
        "str_replace_editor", command="create", path=str(path), file_text="gone"
    )
    assert obs.exit_code == 1
    assert f"A file already exists at: {path}. Cannot overwrite files using command `create`" in (
        obs.output
    )
    assert path.read_text() == SAMPLE


async def test_create_refuses_an_existing_directory(sandbox: Sandbox) -> None:
    obs = await sandbox.call(
        "str_replace_editor", command="create", path=str(sandbox.workdir), file_text="x"
    )
    assert obs.exit_code == 1
    assert f"A directory already exists at: {sandbox.workdir}" in obs.output


async def test_create_without_file_text_is_an_error(sandbox: Sandbox) -> None:
    path = sandbox.workdir / "m.py"
    obs = await sandbox.call("str_replace_editor", command="create", path=str(path))
    assert obs.exit_code == 1
    assert "Parameter `file_text` is required for command: create" in obs.output
    assert not path.exists()


async def test_undo_of_create_removes_the_file(sandbox: Sandbox) -> None:
    path = sandbox.workdir / "m.py"
    await sandbox.call("str_replace_editor", command="create", path=str(path), file_text="x\n")
    obs = await sandbox.call("str_replace_editor", command="undo_edit", path=str(path))
    assert obs.exit_code == 0
    assert "it was removed" in obs.output
    assert not path.exists()


# -- str_replace -------------------------------------------------------------------------
async def test_str_replace_edits_and_shows_a_numbered_snippet(sandbox: Sandbox) -> None:
    path = write(sandbox.workdir / "m.py", SAMPLE)
    obs = await sandbox.call(
        "str_replace_editor",
        command="str_replace",
        path=str(path),
        old_str="    return a - b",
        new_str="    result = a - b\n    return result",
    )
    assert obs.exit_code == 0, obs.output
    assert path.read_text() == SAMPLE.replace(
        "    return a - b", "    result = a - b\n    return result"
    )
    lines = obs.output.splitlines()
    assert lines[0] == (
        f"The file {path} has been edited. Here's the result of running `cat -n` on a "
        f"snippet of {path}:"
    )
    assert lines[1:-1] == [
        "     2\t    return a + b",
        "     3\t",
        "     4\t",
        "     5\tdef sub(a, b):",
        "     6\t    result = a - b",
        "     7\t    return result",
    ]
    assert lines[-1].startswith("Review the changes and make sure they are as expected.")


async def test_str_replace_without_a_match_is_an_error_and_changes_nothing(
    sandbox: Sandbox,
) -> None:
    path = write(sandbox.workdir / "m.py", SAMPLE)
    obs = await sandbox.call(
        "str_replace_editor", command="str_replace", path=str(path), old_str="mul", new_str="x"
    )
    assert obs.exit_code == 1
    assert f"No replacement was performed, old_str `mul` did not appear verbatim in {path}." in (
        obs.output
    )
    assert path.read_text() == SAMPLE


async def test_str_replace_points_at_a_match_that_differs_in_whitespace(
    sandbox: Sandbox,
) -> None:
    path = write(sandbox.workdir / "m.py", SAMPLE)
    obs = await sandbox.call(
        "str_replace_editor",
        command="str_replace",
        path=str(path),
        old_str="def sub(a, b):\n  return a - b",
        new_str="x",
    )
    assert obs.exit_code == 1
    assert "It does appear at line 5 when whitespace is ignored" in obs.output


async def test_str_replace_with_several_matches_names_count_and_lines(sandbox: Sandbox) -> None:
    path = write(sandbox.workdir / "m.py", SAMPLE)
    obs = await sandbox.call(
        "str_replace_editor", command="str_replace", path=str(path), old_str="(a, b)", new_str="()"
    )
    assert obs.exit_code == 1
    assert "Multiple occurrences of old_str `(a, b)` in lines [1, 5]" in obs.output
    assert path.read_text() == SAMPLE


async def test_str_replace_without_new_str_deletes_old_str(sandbox: Sandbox) -> None:
    path = write(sandbox.workdir / "m.py", SAMPLE)
    obs = await sandbox.call(
        "str_replace_editor",
        command="str_replace",
        path=str(path),
        old_str="\n\ndef sub(a, b):\n    return a - b\n",
    )
    assert obs.exit_code == 0, obs.output
    assert path.read_text() == "def add(a, b):\n    return a + b\n"


async def test_str_replace_with_identical_strings_is_an_error(sandbox: Sandbox) -> None:
    path = write(sandbox.workdir / "m.py", SAMPLE)
    obs = await sandbox.call(
        "str_replace_editor", command="str_replace", path=str(path), old_str="add", new_str="add"
    )
    assert obs.exit_code == 1
    assert "is the same as new_str" in obs.output


async def test_str_replace_needs_a_non_empty_old_str(sandbox: Sandbox) -> None:
    path = write(sandbox.workdir / "m.py", SAMPLE)
    missing = await sandbox.call("str_replace_editor", command="str_replace", path=str(path))
    assert missing.exit_code == 1
    assert "Parameter `old_str` is required for command: str_replace" in missing.output
    empty = await sandbox.call(
        "str_replace_editor", command="str_replace", path=str(path), old_str="", new_str="x"
    )
    assert empty.exit_code == 1
    assert "`old_str` is empty" in empty.output


async def test_editing_a_directory_is_an_error(sandbox: Sandbox) -> None:
    obs = await sandbox.call(
        "str_replace_editor", command="str_replace", path=str(sandbox.workdir), old_str="a"
    )
    assert obs.exit_code == 1
    assert "is a directory and only the `view` command can be used on directories" in obs.output


async def test_editing_a_binary_file_is_an_error(sandbox: Sandbox) -> None:
    data = b"\x00\x01\x02abc"
    path = write(sandbox.workdir / "blob.bin", data)
    obs = await sandbox.call(
        "str_replace_editor", command="str_replace", path=str(path), old_str="abc", new_str="x"
    )
    assert obs.exit_code == 1
    assert "appears to be binary" in obs.output
    assert path.read_bytes() == data


async def test_arguments_with_shell_and_option_characters_arrive_verbatim(
    sandbox: Sandbox,
) -> None:
    path = write(sandbox.workdir / "m.sh", "echo old\n")
    new = "--flag -x 'single' \"double\" $HOME `id` \\n $(rm -rf /) ; | &&\n"
    obs = await sandbox.call(
        "str_replace_editor",
        command="str_replace",
        path=str(path),
        old_str="echo old\n",
        new_str=new,
    )
    assert obs.exit_code == 0, obs.output
    assert path.read_text() == new


# -- insert ------------------------------------------------------------------------------
async def test_insert_at_zero_puts_text_at_the_top(sandbox: Sandbox) -> None:
    path = write(sandbox.workdir / "m.py", SAMPLE)
    obs = await sandbox.call(
        "str_replace_editor",
        command="insert",
        path=str(path),
        insert_line=0,
        new_str="import os\n",
    )
    assert obs.exit_code == 0, obs.output
    assert path.read_text() == "import os\n" + SAMPLE
    assert "     1\timport os" in obs.output
    assert "a snippet of the edited file" in obs.output


async def test_insert_after_a_middle_line(sandbox: Sandbox) -> None:
    path = write(sandbox.workdir / "m.py", SAMPLE)
    obs = await sandbox.call(
        "str_replace_editor",
        command="insert",
        path=str(path),
        insert_line=2,
        new_str="\n# helpers\n# more",
    )
    assert obs.exit_code == 0, obs.output
    lines = path.read_text().split("\n")
    assert lines[:6] == ["def add(a, b):", "    return a + b", "", "# helpers", "# more", ""]
    assert "     4\t# helpers" in obs.output


async def test_insert_at_the_end(sandbox: Sandbox) -> None:
    path = write(sandbox.workdir / "m.py", SAMPLE)
    obs = await sandbox.call(
        "str_replace_editor", command="insert", path=str(path), insert_line=6, new_str="# end"
    )
    assert obs.exit_code == 0, obs.output
    assert path.read_text() == SAMPLE + "# end\n"


async def test_insert_keeps_a_missing_final_newline_missing(sandbox: Sandbox) -> None:
    path = write(sandbox.workdir / "m.txt", "a\nb")
    await sandbox.call(
        "str_replace_editor", command="insert", path=str(path), insert_line=2, new_str="c"
    )
    assert path.read_text() == "a\nb\nc"
    await sandbox.call(
        "str_replace_editor", command="insert", path=str(path), insert_line=1, new_str="x"
    )
    assert path.read_text() == "a\nx\nb\nc"


async def test_insert_into_an_empty_file(sandbox: Sandbox) -> None:
    path = write(sandbox.workdir / "m.txt", "")
    obs = await sandbox.call(
        "str_replace_editor", command="insert", path=str(path), insert_line=0, new_str="first"
    )
    assert obs.exit_code == 0, obs.output
    assert path.read_text() == "first\n"


@pytest.mark.parametrize("line", [7, 100])
async def test_insert_beyond_the_end_is_an_error(sandbox: Sandbox, line: int) -> None:
    path = write(sandbox.workdir / "m.py", SAMPLE)
    obs = await sandbox.call(
        "str_replace_editor", command="insert", path=str(path), insert_line=line, new_str="x"
    )
    assert obs.exit_code == 1
    assert (
        f"Invalid `insert_line` parameter: {line}. It should be within the range of lines of "
        "the file: [0, 6]" in obs.output
    )


async def test_insert_needs_insert_line_and_new_str(sandbox: Sandbox) -> None:
    path = write(sandbox.workdir / "m.py", SAMPLE)
    no_line = await sandbox.call(
        "str_replace_editor", command="insert", path=str(path), new_str="x"
    )
    assert no_line.exit_code == 1
    assert "Parameter `insert_line` is required for command: insert" in no_line.output
    no_text = await sandbox.call(
        "str_replace_editor", command="insert", path=str(path), insert_line=1
    )
    assert no_text.exit_code == 1
    assert "Parameter `new_str` is required for command: insert" in no_text.output
    bad = await sandbox.run(
        f"str_replace_editor --command insert --path {path} --insert_line two --new_str x"
    )
    assert bad.exit_code == 2
    assert "`insert_line` must be an integer" in bad.output


# -- undo_edit ---------------------------------------------------------------------------
async def test_undo_reverts_several_edits_one_at_a_time(sandbox: Sandbox) -> None:
    path = write(sandbox.workdir / "m.py", SAMPLE)
    versions = [path.read_bytes()]
    edits = [
        {"command": "str_replace", "old_str": "add", "new_str": "plus"},
        {"command": "insert", "insert_line": 0, "new_str": "import os"},
        {"command": "str_replace", "old_str": "sub", "new_str": "minus"},
    ]
    for edit in edits:
        obs = await sandbox.call("str_replace_editor", path=str(path), **edit)
        assert obs.exit_code == 0, obs.output
        versions.append(path.read_bytes())
    for expected in reversed(versions[:-1]):
        obs = await sandbox.call("str_replace_editor", command="undo_edit", path=str(path))
        assert obs.exit_code == 0, obs.output
        assert obs.output.startswith(f"Last edit to {path} undone successfully.")
        assert path.read_bytes() == expected
    obs = await sandbox.call("str_replace_editor", command="undo_edit", path=str(path))
    assert obs.exit_code == 1
    assert f"No edit history found for {path}." in obs.output


async def test_undo_history_is_kept_per_file(sandbox: Sandbox) -> None:
    first = write(sandbox.workdir / "a.py", "a = 1\n")
    second = write(sandbox.workdir / "b.py", "b = 1\n")
    await sandbox.call(
        "str_replace_editor", command="str_replace", path=str(first), old_str="1", new_str="2"
    )
    await sandbox.call(
        "str_replace_editor", command="str_replace", path=str(second), old_str="1", new_str="2"
    )
    obs = await sandbox.call("str_replace_editor", command="undo_edit", path=str(first))
    assert obs.exit_code == 0
    assert first.read_text() == "a = 1\n"
    assert second.read_text() == "b = 2\n"


async def test_undo_history_lives_in_the_configured_state_dir(sandbox: Sandbox) -> None:
    state = sandbox.workdir.parent / "state"
    await sandbox.export(UNIAGENT_EDITOR_STATE_DIR=str(state))
    path = write(sandbox.workdir / "a.py", "a = 1\n")
    await sandbox.call(
        "str_replace_editor", command="str_replace", path=str(path), old_str="1", new_str="2"
    )
    assert len([p for p in state.iterdir() if p.is_dir()]) == 1
    obs = await sandbox.call("str_replace_editor", command="undo_edit", path=str(path))
    assert obs.exit_code == 0
    assert path.read_text() == "a = 1\n"


async def test_undo_history_is_bounded_by_max_history(sandbox: Sandbox) -> None:
    await sandbox.export(UNIAGENT_EDITOR_MAX_HISTORY="2")
    path = write(sandbox.workdir / "a.py", "v0\n")
    for i in range(1, 4):
        await sandbox.call(
            "str_replace_editor",
            command="str_replace",
            path=str(path),
            old_str=f"v{i - 1}",
            new_str=f"v{i}",
        )
    for expected in ("v2\n", "v1\n"):
        obs = await sandbox.call("str_replace_editor", command="undo_edit", path=str(path))
        assert obs.exit_code == 0, obs.output
        assert path.read_text() == expected
    obs = await sandbox.call("str_replace_editor", command="undo_edit", path=str(path))
    assert obs.exit_code == 1
    assert "No edit history found" in obs.output


async def test_undo_of_a_missing_path_is_an_error(sandbox: Sandbox) -> None:
    path = sandbox.workdir / "never.py"
    obs = await sandbox.call("str_replace_editor", command="undo_edit", path=str(path))
    assert obs.exit_code == 1
    assert f"The path {path} does not exist." in obs.output


# -- encodings and line ends -------------------------------------------------------------
async def test_unicode_content_is_edited_and_kept_utf8(sandbox: Sandbox) -> None:
    text = "# 中文注释\ngreeting = 'héllo'\nemoji = '🙂'\n"
    path = write(sandbox.workdir / "u.py", text)
    view = await sandbox.call("str_replace_editor", command="view", path=str(path))
    assert "     1\t# 中文注释" in view.output
    obs = await sandbox.call(
        "str_replace_editor",
        command="str_replace",
        path=str(path),
        old_str="'héllo'",
        new_str="'grüß dich 🌍'",
    )
    assert obs.exit_code == 0, obs.output
    assert "grüß dich 🌍" in obs.output
    assert path.read_bytes() == text.replace("'héllo'", "'grüß dich 🌍'").encode("utf-8")


async def test_a_utf8_bom_is_preserved(sandbox: Sandbox) -> None:
    path = write(sandbox.workdir / "bom.txt", "\ufeffname = 1\n".encode())
    await sandbox.call(
        "str_replace_editor", command="str_replace", path=str(path), old_str="1", new_str="2"
    )
    assert path.read_bytes() == b"\xef\xbb\xbfname = 2\n"


async def test_a_latin1_file_stays_latin1(sandbox: Sandbox) -> None:
    path = write(sandbox.workdir / "l1.txt", "caf\xe9 = 1\n".encode("latin-1"))
    obs = await sandbox.call(
        "str_replace_editor", command="str_replace", path=str(path), old_str="1", new_str="2"
    )
    assert obs.exit_code == 0, obs.output
    assert path.read_bytes() == "caf\xe9 = 2\n".encode("latin-1")


async def test_crlf_files_stay_crlf_after_str_replace(sandbox: Sandbox) -> None:
    path = write(sandbox.workdir / "w.txt", b"one\r\ntwo\r\nthree\r\n")
    view = await sandbox.call("str_replace_editor", command="view", path=str(path))
    assert "\r" not in view.output
    obs = await sandbox.call(
        "str_replace_editor",
        command="str_replace",
        path=str(path),
        old_str="one\ntwo",
        new_str="1\n2\n2.5",
    )
    assert obs.exit_code == 0, obs.output
    assert path.read_bytes() == b"1\r\n2\r\n2.5\r\nthree\r\n"


async def test_crlf_files_stay_crlf_after_insert(sandbox: Sandbox) -> None:
    path = write(sandbox.workdir / "w.txt", b"one\r\ntwo\r\n")
    obs = await sandbox.call(
        "str_replace_editor",
        command="insert",
        path=str(path),
        insert_line=1,
        new_str="a\nb",
    )
    assert obs.exit_code == 0, obs.output
    assert path.read_bytes() == b"one\r\na\r\nb\r\ntwo\r\n"
    await sandbox.call("str_replace_editor", command="undo_edit", path=str(path))
    assert path.read_bytes() == b"one\r\ntwo\r\n"


# -- the root ----------------------------------------------------------------------------
async def test_paths_inside_the_root_are_allowed(sandbox: Sandbox) -> None:
    path = write(sandbox.workdir / "m.py", SAMPLE)
    await sandbox.export(UNIAGENT_EDITOR_ROOT=str(sandbox.workdir))
    obs = await sandbox.call("str_replace_editor", command="view", path=str(path))
    assert obs.exit_code == 0, obs.output


@pytest.mark.parametrize("how", ["absolute", "dotdot", "symlink", "create"])
async def test_paths_escaping_the_root_are_rejected(sandbox: Sandbox, how: str) -> None:
    root = sandbox.workdir / "repo"
    root.mkdir()
    outside = write(sandbox.workdir / "secret.txt", "secret\n")
    (root / "link").symlink_to(sandbox.workdir)
    path = {
        "absolute": str(outside),
        "dotdot": f"{root}/../secret.txt",
        "symlink": f"{root}/link/secret.txt",
        "create": f"{root}/link/new.txt",
    }[how]
    await sandbox.export(UNIAGENT_EDITOR_ROOT=str(root))
    if how == "create":
        obs = await sandbox.call("str_replace_editor", command="create", path=path, file_text="x")
        assert not Path(path).exists()
    else:
        obs = await sandbox.call(
            "str_replace_editor",
            command="str_replace",
            path=path,
            old_str="secret",
            new_str="leaked",
        )
    assert obs.exit_code == 1
    assert f"The path {path}" in obs.output
    assert f"is outside {root}, the directory this editor works in" in obs.output
    assert outside.read_text() == "secret\n"


# -- usage -------------------------------------------------------------------------------
async def test_an_unknown_command_is_a_usage_error(sandbox: Sandbox) -> None:
    obs = await sandbox.run(f"str_replace_editor --command delete --path {sandbox.workdir}")
    assert obs.exit_code == 2
    assert "unknown command 'delete'; the allowed commands are: view, create" in obs.output


async def test_swe_agent_style_positional_arguments_work(sandbox: Sandbox) -> None:
    path = write(sandbox.workdir / "m.py", SAMPLE)
    obs = await sandbox.run(f"str_replace_editor view {path} --view_range '[1, 1]'")
    assert obs.exit_code == 0, obs.output
    assert obs.output.splitlines()[1:] == ["     1\tdef add(a, b):"]
