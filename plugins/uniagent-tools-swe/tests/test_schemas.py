"""Each tool's schema is a valid OpenAI function and survives both built-in parsers."""

from __future__ import annotations

import re
from typing import Any

import pytest
from uniagent import ToolSpec

from uniagent_tools_swe import make_tools

TOOL_NAMES = ["execute_bash", "str_replace_editor", "submit", "finish"]

#: Representative calls per tool, including every optional argument and awkward text.
CALLS: list[tuple[str, dict[str, Any]]] = [
    ("execute_bash", {"command": 'cd /testbed && grep -rn "def main" . | head -n 5'}),
    ("execute_bash", {"command": "cat > t.py <<'EOF'\nprint('</tool_call>?')\nEOF"}),
    ("str_replace_editor", {"command": "view", "path": "/testbed/a.py", "view_range": [3, -1]}),
    ("str_replace_editor", {"command": "create", "path": "/t/b.py", "file_text": "x = '中'\n"}),
    (
        "str_replace_editor",
        {
            "command": "str_replace",
            "path": "/t/a.py",
            "old_str": "  a = {1: 2}\n",
            "new_str": '  a = {1: 3}  # <changed> & "quoted"\n',
        },
    ),
    ("str_replace_editor", {"command": "str_replace", "path": "/t/a.py", "old_str": "del me"}),
    (
        "str_replace_editor",
        {"command": "insert", "path": "/t/a.py", "insert_line": 0, "new_str": "import os"},
    ),
    ("str_replace_editor", {"command": "undo_edit", "path": "/t/a.py"}),
    ("submit", {}),
    ("finish", {"answer": "The answer is 42.\nSee `main.py`."}),
]


def specs() -> dict[str, ToolSpec]:
    return {spec.name: spec for spec in make_tools()}


def jsonschema() -> Any:
    """The jsonschema package (a test extra: ``pip install 'uniagent-tools-swe[test]'``)."""
    import jsonschema as module

    return module


def test_the_plugin_provides_the_four_tools() -> None:
    assert list(specs()) == TOOL_NAMES


@pytest.mark.parametrize("name", TOOL_NAMES)
def test_schema_is_an_openai_function(name: str) -> None:
    schema = specs()[name].openai_schema()
    assert set(schema) == {"type", "function"}
    assert schema["type"] == "function"
    function = schema["function"]
    assert set(function) == {"name", "description", "parameters"}
    assert re.fullmatch(r"[a-zA-Z0-9_-]{1,64}", function["name"])
    assert isinstance(function["description"], str) and function["description"].strip()
    parameters = function["parameters"]
    jsonschema().Draft202012Validator.check_schema(parameters)
    assert parameters["type"] == "object"
    assert isinstance(parameters["properties"], dict)
    assert set(parameters["required"]) <= set(parameters["properties"])
    assert parameters.get("additionalProperties") is False
    assert "description" not in parameters  # the argument model's docstring is not for the LLM


@pytest.mark.parametrize("name", TOOL_NAMES)
def test_every_parameter_is_described_and_plainly_typed(name: str) -> None:
    parameters = specs()[name].parameters_schema()
    for prop_name, prop in parameters["properties"].items():
        assert prop.get("description", "").strip(), f"{name}.{prop_name} has no description"
        assert "anyOf" not in prop and prop.get("type") != "null", f"{name}.{prop_name}: {prop}"
        assert "default" not in prop, f"{name}.{prop_name}: {prop}"


def test_required_parameters() -> None:
    required = {name: spec.parameters_schema()["required"] for name, spec in specs().items()}
    assert required == {
        "execute_bash": ["command"],
        "str_replace_editor": ["command", "path"],
        "submit": [],
        "finish": ["answer"],
    }


def test_editor_schema_constrains_command_and_view_range() -> None:
    props = specs()["str_replace_editor"].parameters_schema()["properties"]
    assert props["command"]["enum"] == ["view", "create", "str_replace", "insert", "undo_edit"]
    assert props["view_range"] == {
        "type": "array",
        "items": {"type": "integer"},
        "minItems": 2,
        "maxItems": 2,
        "description": props["view_range"]["description"],
    }
    assert props["insert_line"]["type"] == "integer"


@pytest.mark.parametrize(("name", "arguments"), CALLS)
def test_calls_validate_against_the_json_schema(name: str, arguments: dict[str, Any]) -> None:
    jsonschema().validate(arguments, specs()[name].parameters_schema())
    specs()[name].validate_arguments(arguments)


@pytest.mark.parametrize("parser_name", ["hermes", "qwen3_coder"])
@pytest.mark.parametrize(("name", "arguments"), CALLS)
def test_calls_round_trip_through_the_builtin_parsers(
    parser_name: str, name: str, arguments: dict[str, Any]
) -> None:
    from uniagent import ToolCall, get_registry

    parser = get_registry().tool_parsers()[parser_name].factory()
    tools = list(specs().values())
    text = parser.format_tool_call(ToolCall(name=name, arguments=arguments))
    result = parser.parse(f"Let me do that.\n{text}", tools)
    assert [(c.name, c.arguments) for c in result.tool_calls] == [(name, arguments)]
