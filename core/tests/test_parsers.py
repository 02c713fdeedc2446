"""Tool-call parsers: every error kind and message, round trips, fuzzing."""

from __future__ import annotations

import contextlib
import json
import math
from typing import Any, Literal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict, Field

from uniagent import ToolSpec, get_parser
from uniagent.parsers import (
    HermesParser,
    ParseResult,
    Qwen3CoderParser,
    ToolCall,
    ToolCallFormatError,
    ToolCallParser,
    tool_calls_from_openai,
)
from uniagent.parsers.base import ErrorKind


class BashArgs(BaseModel):
    command: str = Field(description="the command")
    timeout: int | None = Field(default=None, description="seconds")


class EditArgs(BaseModel):
    command: Literal["view", "create", "str_replace"]
    path: str
    view_range: list[int] | None = None
    flag: bool = False
    ratio: float | None = None
    options: dict[str, int] | None = None


class NoArgs(BaseModel):
    pass


class StrictArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: str


TOOLS = [
    ToolSpec(name="execute_bash", description="Run bash.", arguments=BashArgs),
    ToolSpec(name="str_replace_editor", description="Edit files.", arguments=EditArgs),
    ToolSpec(name="submit", description="Submit.", arguments=NoArgs, ends_episode=True),
    ToolSpec(name="strict", description="Strict.", arguments=StrictArgs),
]
PARSERS: list[ToolCallParser] = [HermesParser(), Qwen3CoderParser()]
KINDS = set(ErrorKind.__args__)  # type: ignore[attr-defined]


def q3(name: str, **params: str) -> str:
    """A Qwen3-Coder call with raw (text) parameter values."""
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


def hj(obj: Any) -> str:
    """A hermes call from a JSON-serialisable object."""
    return f"<tool_call>\n{json.dumps(obj)}\n</tool_call>"


def test_builtin_parsers_are_registered(uniagent_registry: Any) -> None:
    parsers = uniagent_registry.tool_parsers()
    assert {"hermes", "qwen3_coder"} <= set(parsers)
    assert isinstance(get_parser("hermes"), HermesParser)
    assert isinstance(get_parser("qwen3_coder"), Qwen3CoderParser)
    for parser in PARSERS:
        assert isinstance(parser, ToolCallParser)
        assert parser.stop_sequences == ()


# -- successful parses ----------------------------------------------------------------
def test_hermes_qwen3_template_output() -> None:
    text = (
        "<think>\nI should look. <tool_call> is how I call.\n</think>\n\nLet me list.\n"
        '<tool_call>\n{"name": "execute_bash", "arguments": {"command": "ls -la"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "execute_bash", "arguments": "{\\"command\\": \\"pwd\\", '
        '\\"timeout\\": 5}"}\n</tool_call>'
    )
    result = HermesParser().parse(text, TOOLS)
    assert result.tool_calls == [
        ToolCall("execute_bash", {"command": "ls -la"}),
        ToolCall("execute_bash", {"command": "pwd", "timeout": 5}),
    ]
    assert result.content == (
        "<think>\nI should look. <tool_call> is how I call.\n</think>\nLet me list."
    )


def test_hermes_values_may_contain_the_tags() -> None:
    call = ToolCall("execute_bash", {"command": "echo '</tool_call><tool_call></think>'"})
    text = HermesParser().format_tool_call(call)
    assert HermesParser().parse(text, TOOLS).tool_calls == [call]


def test_hermes_arguments_optional_and_lax_values_normalised() -> None:
    parser = HermesParser()
    assert parser.parse(hj({"name": "submit"}), TOOLS).tool_calls == [ToolCall("submit", {})]
    text = hj({"name": "execute_bash", "arguments": {"command": "ls", "timeout": "7"}})
    assert parser.parse(text, TOOLS).tool_calls[0].arguments == {"command": "ls", "timeout": 7}


def test_qwen3_coder_types_values_from_schema() -> None:
    text = "I will view it.\n" + q3(
        "str_replace_editor",
        command="view",
        path="  /repo/a.py ",
        view_range="[1, 20]",
        flag="True",
        ratio="0.5",
        options='{"a": 1}',
    )
    result = Qwen3CoderParser().parse(text, TOOLS)
    assert result.content == "I will view it."
    assert result.tool_calls == [
        ToolCall(
            "str_replace_editor",
            {
                "command": "view",
                "path": "  /repo/a.py ",
                "view_range": [1, 20],
                "flag": True,
                "ratio": 0.5,
                "options": {"a": 1},
            },
        )
    ]


def test_qwen3_coder_strings_are_verbatim_but_one_newline() -> None:
    body = "\n\ndef f():\n    return '<tool_call>'\n\n"
    text = (
        "<tool_call>\n<function=execute_bash>\n<parameter=command>\n"
        f"{body}\n</parameter>\n<parameter=timeout>\nnull\n</parameter>\n</function>\n</tool_call>"
    )
    [call] = Qwen3CoderParser().parse(text, TOOLS).tool_calls
    assert call.arguments == {"command": body, "timeout": None}
    inline = "<tool_call><function=submit></function></tool_call>"
    assert Qwen3CoderParser().parse(inline, TOOLS).tool_calls == [ToolCall("submit", {})]


def test_reasoning_opened_in_the_prompt_is_not_scanned() -> None:
    text = "the closing tag is </tool_call>, I recall.</think>\n" + hj({"name": "submit"})
    result = HermesParser().parse(text, TOOLS)
    assert result.tool_calls == [ToolCall("submit", {})]
    off = HermesParser(think_tags=None)
    with pytest.raises(ToolCallFormatError) as info:
        off.parse(text, TOOLS)
    assert info.value.kind == "malformed"


# -- every error kind -----------------------------------------------------------------
HERMES_CASES: list[tuple[str, str, ErrorKind, list[str]]] = [
    ("no call", "Just text.", "no_tool_call", ["no tool call found"]),
    ("empty", "", "no_tool_call", ["no tool call found"]),
    (
        "unclosed",
        hj({"name": "submit"})[: -len("</tool_call>")],
        "unclosed_tag",
        ["<tool_call> is not closed with </tool_call>"],
    ),
    (
        "truncated json",
        '<tool_call>\n{"name": "execute_bash", "argu',
        "unclosed_tag",
        ["not closed"],
    ),
    (
        "unclosed think",
        "<think>\nhmm " + hj({"name": "submit"}),
        "unclosed_tag",
        ["<think> block is not closed with </think>"],
    ),
    ("stray close", "done </tool_call>", "malformed", ["</tool_call> without a matching"]),
    ("empty block", "<tool_call>\n</tool_call>", "malformed", ["block is empty"]),
    (
        "not an object",
        "<tool_call>[1, 2]</tool_call>",
        "malformed",
        ['"name" and "arguments"', "[1, 2]"],
    ),
    (
        "wrong keys",
        hj({"name": "submit", "parameters": {}}),
        "malformed",
        ['found the keys "name", "parameters"'],
    ),
    ("name not str", hj({"name": 3}), "malformed", ["tool name must be a non-empty string"]),
    (
        "invalid json",
        "<tool_call>{'name': 'submit'}</tool_call>",
        "invalid_json",
        ["not valid JSON", "Expecting property name enclosed in double quotes"],
    ),
    (
        "extra brace",
        '<tool_call>{"name": "submit", "arguments": {}}}</tool_call>',
        "invalid_json",
        ["unexpected text after the JSON object", '"}"'],
    ),
    (
        "string args not json",
        hj({"name": "execute_bash", "arguments": "{command: ls}"}),
        "invalid_json",
        ['"arguments" is a string that is not valid JSON'],
    ),
    (
        "unknown tool",
        hj({"name": "rm_rf", "arguments": {}}),
        "unknown_tool",
        ['no tool named "rm_rf"'],
    ),
    (
        "missing",
        hj({"name": "execute_bash", "arguments": {"timeout": 3}}),
        "missing_parameter",
        [
            'missing required parameter "command" of execute_bash',
            "Parameters of execute_bash: command (string, required), timeout (integer, optional)",
        ],
    ),
    (
        "unknown param",
        hj({"name": "execute_bash", "arguments": {"command": "ls", "cwd": "/"}}),
        "unknown_parameter",
        ['execute_bash has no parameter "cwd"', "Parameters of execute_bash"],
    ),
    (
        "unknown param forbid",
        hj({"name": "strict", "arguments": {"text": "a", "x": 1}}),
        "unknown_parameter",
        ['strict has no parameter "x"'],
    ),
    (
        "bad type",
        hj({"name": "execute_bash", "arguments": {"command": "ls", "timeout": "soon"}}),
        "invalid_value",
        ['parameter "timeout"', "valid integer", '"soon"'],
    ),
    (
        "bad enum",
        hj({"name": "str_replace_editor", "arguments": {"command": "rm", "path": "/"}}),
        "invalid_value",
        ['parameter "command"', 'command (one of "view", "create", "str_replace", required)'],
    ),
    (
        "args not object",
        hj({"name": "execute_bash", "arguments": [1]}),
        "invalid_value",
        ["arguments of execute_bash must be an object"],
    ),
    (
        "too many",
        hj({"name": "submit"}) + "\n" + hj({"name": "submit"}),
        "too_many_calls",
        ["you made 2 tool calls", "at most 1 tool call"],
    ),
]

QWEN_CASES: list[tuple[str, str, ErrorKind, list[str]]] = [
    ("no call", "Thinking only.", "no_tool_call", ["no tool call found. Every reply"]),
    (
        "bare function",
        "<function=submit>\n</function>",
        "no_tool_call",
        ["wrap each call in <tool_call> ... </tool_call>"],
    ),
    (
        "unclosed call",
        "<tool_call>\n<function=submit>\n</function>\n",
        "unclosed_tag",
        ["<tool_call> is not closed with </tool_call>"],
    ),
    ("unclosed empty", "<tool_call>\n", "unclosed_tag", ["<tool_call> is not closed"]),
    (
        "unclosed function",
        "<tool_call>\n<function=submit>\n",
        "unclosed_tag",
        ["<function=submit> is not closed with </function>"],
    ),
    (
        "unclosed param",
        "<tool_call>\n<function=execute_bash>\n<parameter=command>\nls\n",
        "unclosed_tag",
        ["<parameter=command> is not closed with </parameter>"],
    ),
    (
        "param runs into next",
        "<tool_call>\n<function=execute_bash>\n<parameter=command>\nls\n"
        "<parameter=timeout>\n3\n</parameter>\n</function>\n</tool_call>",
        "unclosed_tag",
        ["<parameter=command> is not closed with </parameter> before the next <parameter="],
    ),
    (
        "unclosed tag bracket",
        "<tool_call>\n<function=submit",
        "unclosed_tag",
        ["<function=NAME> is not closed with '>'"],
    ),
    (
        "json inside",
        hj({"name": "submit"}),
        "malformed",
        ["expected <function=NAME> right after <tool_call>"],
    ),
    (
        "empty name",
        "<tool_call>\n<function=>\n</function>\n</tool_call>",
        "malformed",
        ["expected a tag of the form <function=NAME> on one line"],
    ),
    (
        "missing function end",
        "<tool_call>\n<function=submit>\n</tool_call>",
        "malformed",
        ["found </tool_call> before </function>"],
    ),
    (
        "text in function",
        "<tool_call>\n<function=submit>\nhello\n</function>\n</tool_call>",
        "malformed",
        ["expected <parameter=NAME> or </function> inside <function=submit>"],
    ),
    (
        "two functions",
        "<tool_call>\n<function=submit>\n</function>\n<function=submit>\n</function>\n</tool_call>",
        "malformed",
        ["in its own <tool_call> block"],
    ),
    (
        "garbage after function",
        "<tool_call>\n<function=submit>\n</function>\nxx</tool_call>",
        "malformed",
        ["expected </tool_call> after </function>"],
    ),
    (
        "duplicate param",
        q3("execute_bash", command="ls").replace(
            "</function>", "<parameter=command>\npwd\n</parameter>\n</function>"
        ),
        "malformed",
        ["parameter 'command' is given twice"],
    ),
    ("stray close", "x </tool_call>", "malformed", ["without a matching <tool_call>"]),
    (
        "unknown tool",
        q3("grep", pattern="x"),
        "unknown_tool",
        ['no tool named "grep"', "Available tools: execute_bash, str_replace_editor, submit"],
    ),
    (
        "missing",
        q3("str_replace_editor", command="view"),
        "missing_parameter",
        ['missing required parameter "path"', "<parameter=path>\n...\n</parameter>"],
    ),
    (
        "unknown param",
        q3("execute_bash", command="ls", shell="zsh"),
        "unknown_parameter",
        ['execute_bash has no parameter "shell"'],
    ),
    (
        "bad int",
        q3("execute_bash", command="ls", timeout="ten"),
        "invalid_value",
        ['parameter "timeout"', "valid integer"],
    ),
    (
        "bad list",
        q3("str_replace_editor", command="view", path="/a", view_range="1-3"),
        "invalid_value",
        ['parameter "view_range"', "valid list"],
    ),
    (
        "bad list item",
        q3("str_replace_editor", command="view", path="/a", view_range='["a"]'),
        "invalid_value",
        ['parameter "view_range.0"'],
    ),
    (
        "bad bool",
        q3("str_replace_editor", command="view", path="/a", flag="maybe"),
        "invalid_value",
        ['parameter "flag"', "valid boolean"],
    ),
    ("too many", q3("submit") + q3("submit"), "too_many_calls", ["you made 2 tool calls"]),
]


def _check_error(parser: ToolCallParser, text: str, kind: str, fragments: list[str]) -> None:
    with pytest.raises(ToolCallFormatError) as info:
        parser.parse(text, TOOLS, max_calls=1)
    err = info.value
    message = str(err)
    assert err.kind == kind, message
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    # Every message says what was wrong, lists the tools and shows the format.
    assert message.startswith("Invalid tool call: ")
    assert "Available tools: execute_bash, str_replace_editor, submit, strict." in message
    assert "for example:\n<tool_call>\n" in message
    example = message.split("for example:\n", 1)[1]
    assert parser.parse(example, TOOLS).tool_calls  # the example itself parses


@pytest.mark.parametrize(
    ("text", "kind", "fragments"),
    [case[1:] for case in HERMES_CASES],
    ids=[case[0] for case in HERMES_CASES],
)
def test_hermes_errors(text: str, kind: str, fragments: list[str]) -> None:
    _check_error(HermesParser(), text, kind, fragments)


@pytest.mark.parametrize(
    ("text", "kind", "fragments"),
    [case[1:] for case in QWEN_CASES],
    ids=[case[0] for case in QWEN_CASES],
)
def test_qwen3_coder_errors(text: str, kind: str, fragments: list[str]) -> None:
    _check_error(Qwen3CoderParser(), text, kind, fragments)


def test_every_kind_is_covered() -> None:
    covered = {case[2] for case in HERMES_CASES} | {case[2] for case in QWEN_CASES}
    assert covered == KINDS


def test_error_keeps_content_and_tool() -> None:
    with pytest.raises(ToolCallFormatError) as info:
        HermesParser().parse("The answer is 4.", TOOLS)
    assert info.value.content == "The answer is 4."
    with pytest.raises(ToolCallFormatError) as info:
        HermesParser().parse("ok " + hj({"name": "execute_bash", "arguments": {}}), TOOLS)
    assert (info.value.tool, info.value.content) == ("execute_bash", "ok")


def test_example_uses_the_tool_in_question() -> None:
    with pytest.raises(ToolCallFormatError) as info:
        HermesParser().parse(hj({"name": "str_replace_editor", "arguments": {}}), TOOLS)
    assert '{"name": "str_replace_editor", "arguments": {"command": "view", "path": "..."}}' in (
        str(info.value)
    )


def test_no_tools_at_all() -> None:
    with pytest.raises(ToolCallFormatError) as info:
        HermesParser().parse(hj({"name": "submit"}), [])
    assert info.value.kind == "unknown_tool"
    assert "Available tools: none." in str(info.value)


# -- structured calls from a chat API ---------------------------------------------------
def test_tool_calls_from_openai() -> None:
    raw = [
        {
            "id": "c1",
            "type": "function",
            "function": {"name": "execute_bash", "arguments": '{"command": "ls"}'},
        },
        {"id": "c2", "type": "function", "function": {"name": "submit", "arguments": ""}},
    ]
    assert tool_calls_from_openai(raw, TOOLS) == [
        ToolCall("execute_bash", {"command": "ls"}, id="c1"),
        ToolCall("submit", {}, id="c2"),
    ]


@pytest.mark.parametrize(
    ("calls", "kind", "fragment"),
    [
        ([], "no_tool_call", "no tool call found"),
        ([{"function": {"name": "ls", "arguments": "{}"}}], "unknown_tool", '"ls"'),
        (
            [{"function": {"name": "execute_bash", "arguments": "{bad"}}],
            "invalid_json",
            "arguments of execute_bash are not valid JSON",
        ),
        (
            [{"function": {"name": "execute_bash", "arguments": "{}"}}],
            "missing_parameter",
            '"command"',
        ),
        ([{"function": {"name": "submit", "arguments": "{}"}}] * 2, "too_many_calls", "at most 1"),
    ],
)
def test_tool_calls_from_openai_errors(calls: list[Any], kind: str, fragment: str) -> None:
    with pytest.raises(ToolCallFormatError) as info:
        tool_calls_from_openai(calls, TOOLS, max_calls=1)
    assert info.value.kind == kind
    assert fragment in str(info.value)
    assert "Available tools:" in str(info.value)


def test_tool_calls_from_openai_sdk_objects() -> None:
    from openai.types import chat as openai_types

    call = openai_types.ChatCompletionMessageToolCall(
        id="x", type="function", function={"name": "submit", "arguments": "{}"}
    )
    assert tool_calls_from_openai([call], TOOLS) == [ToolCall("submit", {}, id="x")]


# -- round trips and fuzzing -----------------------------------------------------------
_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=30)
_safe_text = _text.filter(lambda s: "</parameter>" not in s and "<parameter=" not in s)
_floats = st.floats(allow_nan=False, allow_infinity=False, width=32).filter(math.isfinite)


def _calls(text: st.SearchStrategy[str]) -> st.SearchStrategy[ToolCall]:
    def bash_call(command: str, timeout: int | None) -> ToolCall:
        extra = {} if timeout is None else {"timeout": timeout}
        return ToolCall("execute_bash", {"command": command, **extra})

    bash = st.builds(
        bash_call,
        text,
        st.none() | st.integers(-(10**6), 10**6),
    )
    edit = st.fixed_dictionaries(
        {"command": st.sampled_from(["view", "create"]), "path": text},
        optional={
            "view_range": st.lists(st.integers(-100, 100), max_size=3),
            "flag": st.booleans(),
            "ratio": _floats,
            "options": st.dictionaries(_text, st.integers(), max_size=2),
        },
    ).map(lambda a: ToolCall("str_replace_editor", a))
    return st.one_of(bash, edit, st.just(ToolCall("submit", {})))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(calls=st.lists(_calls(_text), min_size=1, max_size=3), content=_text)
def test_hermes_round_trip(calls: list[ToolCall], content: str) -> None:
    _round_trip(HermesParser(), calls, content)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(calls=st.lists(_calls(_safe_text), min_size=1, max_size=3), content=_text)
def test_qwen3_coder_round_trip(calls: list[ToolCall], content: str) -> None:
    _round_trip(Qwen3CoderParser(), calls, content)


def _round_trip(parser: Any, calls: list[ToolCall], content: str) -> None:
    for call in calls:
        assert parser.parse(parser.format_tool_call(call), TOOLS).tool_calls == [call]
    clean = content.strip()
    if any(tag in clean for tag in ("<tool_call>", "</tool_call>", "<think>", "</think>")):
        clean = ""
    result = parser.parse(parser.format_message(clean, calls), TOOLS)
    assert result == ParseResult(content=clean, tool_calls=calls)


FRAGMENTS = [
    "<tool_call>",
    "</tool_call>",
    "<think>",
    "</think>",
    "<function=",
    "</function>",
    "<parameter=",
    "</parameter>",
    ">",
    "<",
    "{",
    "}",
    "[",
    "]",
    '"name"',
    '"arguments"',
    ":",
    ",",
    '"execute_bash"',
    "execute_bash",
    "submit",
    "command",
    "timeout",
    "view_range",
    '"',
    "\\",
    "\n",
    " ",
    "1",
    "-1e999",
    "9" * 5000,
    "[" * 3000,
    "true",
    "null",
    '"{}"',
]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    parts=st.lists(st.sampled_from(FRAGMENTS) | st.text(max_size=4), max_size=40),
    which=st.sampled_from(PARSERS),
    max_calls=st.none() | st.integers(0, 3),
)
def test_fuzz_only_format_errors(parts: list[str], which: Any, max_calls: int | None) -> None:
    text = "".join(parts)
    try:
        result = which.parse(text, TOOLS, max_calls=max_calls)
    except ToolCallFormatError as err:
        assert err.kind in KINDS
        assert str(err).startswith("Invalid tool call: ")
    else:
        assert result.tool_calls
        assert max_calls is None or len(result.tool_calls) <= max_calls
        names = {t.name for t in TOOLS}
        assert all(c.name in names for c in result.tool_calls)


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=200))
def test_fuzz_arbitrary_text(text: str) -> None:
    for parser in PARSERS:
        with contextlib.suppress(ToolCallFormatError):
            parser.parse(text, TOOLS)


def test_qwen3_coder_values_too_deep_for_json_stay_text_for_the_gateway() -> None:
    """A value the client's schema types is read as JSON; one nested past the JSON reader's
    recursion limit (the policy's text) stays text instead of failing the request."""
    deep = "[" * 100_000 + "]" * 100_000
    text = (
        "<tool_call>\n<function=f>\n<parameter=x>\n"
        f"{deep}\n</parameter>\n<parameter=n>\n3\n</parameter>\n</function>\n</tool_call>"
    )
    props = {"x": {"type": "array"}, "n": {"type": "integer"}}
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"properties": props}}}]
    content, calls = Qwen3CoderParser().read_calls(text, tools)
    assert content == "" and calls == [("f", {"x": deep, "n": 3})]
