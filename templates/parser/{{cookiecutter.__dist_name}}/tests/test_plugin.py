"""The plugin is found once installed, and its parser reads and writes its format."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, Field
from uniagent import (
    CallReader,
    ToolCall,
    ToolCallFormatError,
    ToolCallParser,
    ToolSpec,
    get_parser,
    get_registry,
)

PARSER = "{{ cookiecutter.__record_name }}"


class GreetArguments(BaseModel):
    """Arguments of the tool the tests call."""

    who: str = Field(description="whom to greet")


TOOLS = [ToolSpec(name="greet", description="Greet someone.", arguments=GreetArguments)]


def test_plugin_is_discovered() -> None:
    """After ``pip install``, uniagent lists the parser as this distribution's."""
    assert get_registry().tool_parsers()[PARSER].distribution == "{{ cookiecutter.__dist_name }}"


def test_parser_follows_the_protocol() -> None:
    """What the factory returns is a ``ToolCallParser`` named after the record."""
    parser = get_parser(PARSER)
    assert isinstance(parser, ToolCallParser)
    assert parser.name == PARSER


def test_a_reply_becomes_a_validated_call_and_its_thought() -> None:
    """The text before the first ``Action`` is the content; the call is validated."""
    reply = 'Thought: say hi.\nAction: greet\nAction Input: {"who": "world"}'
    result = get_parser(PARSER).parse(reply, TOOLS)
    assert result.content == "Thought: say hi."
    assert result.tool_calls == [ToolCall(name="greet", arguments={"who": "world"})]


def test_a_formatted_call_parses_back_to_itself() -> None:
    """``format_tool_call`` writes exactly what ``parse`` reads."""
    parser = get_parser(PARSER)
    call = ToolCall(name="greet", arguments={"who": "wörld"})
    assert parser.parse(parser.format_tool_call(call), TOOLS).tool_calls == [call]


def test_bad_json_is_explained_to_the_model_with_an_example() -> None:
    """The error names the problem and shows the format with the tool's parameters."""
    with pytest.raises(ToolCallFormatError) as error:
        get_parser(PARSER).parse("Action: greet\nAction Input: {who: world}", TOOLS)
    assert error.value.kind == "invalid_json"
    assert 'Action: greet\nAction Input: {"who": "..."}' in str(error.value)


def test_the_gateway_reads_its_calls_for_a_harness() -> None:
    """``read_calls``: a harness agent can use this format through uniagent's gateway."""
    parser = get_parser(PARSER)
    assert isinstance(parser, CallReader)
    reply = 'Thought: say hi.\nAction: greet\nAction Input: {"who": "world"}'
    assert parser.read_calls(reply, None) == ("Thought: say hi.", [("greet", {"who": "world"})])
    with pytest.raises(ToolCallFormatError) as error:
        parser.read_calls("Action: greet\nAction Input: [1]", None)
    assert error.value.kind == "malformed"
