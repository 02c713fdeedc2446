"""Prompt text the framework adds itself."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from uniagent.config import DEFAULT_SYSTEM_PROMPT
from uniagent.errors import ConfigError
from uniagent.parsers import ToolCallParser
from uniagent.specs import ToolSpec

if TYPE_CHECKING:  # pragma: no cover - imports for type checkers only
    from uniagent.resolver import ResolvedAgent


def tool_instructions(tools: Sequence[ToolSpec], parser: ToolCallParser) -> str:
    """The tool schemas and the call format, for models whose chat template drops tools."""
    schemas = "\n".join(
        json.dumps(t.openai_schema()["function"], ensure_ascii=False) for t in tools
    )
    return (
        "# Tools\n\nYou can call the following functions:\n<tools>\n"
        f"{schemas}\n</tools>\n\nTo call a function, write it exactly like this:\n"
        f"{parser.format_example(tools)}"
    )


def system_prompt(agent: ResolvedAgent) -> str:
    """The config's system prompt, or the default one naming the configured finishing tools."""
    if agent.config.system_prompt is not None:
        return agent.config.system_prompt
    finishing = [t.name for t in agent.tools if t.ends_episode]
    if not finishing:
        return DEFAULT_SYSTEM_PROMPT
    names = " or ".join(f"the {n} tool" for n in finishing)
    return f"{DEFAULT_SYSTEM_PROMPT} When the task is done, call {names}."


def first_messages(agent: ResolvedAgent, task: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The system prompt and the task rendered through ``instance_template``."""
    try:
        user = agent.config.instance_template.format_map(task)
    except KeyError as exc:
        raise ConfigError(
            f"task has no field {exc.args[0]!r}, which instance_template needs; "
            f"task fields: {', '.join(sorted(task))}"
        ) from None
    return [{"role": "system", "content": system_prompt(agent)}, {"role": "user", "content": user}]


def describe_tools(prompt: list[dict[str, Any]], instructions: str) -> None:
    """Put the tool instructions into the system message (made if missing), once."""
    if prompt and prompt[0].get("role") == "system":
        if instructions not in str(prompt[0].get("content") or ""):
            prompt[0]["content"] = f"{prompt[0].get('content') or ''}\n\n{instructions}".lstrip()
    else:
        prompt.insert(0, {"role": "system", "content": instructions})


def instruction_of(
    agent: ResolvedAgent,
    task: Mapping[str, Any],
    messages: Sequence[Mapping[str, Any]] | None,
) -> str:
    """The task's instruction for a harness: the first user message's text."""
    prompt = [dict(m) for m in messages] if messages else first_messages(agent, task)
    for message in prompt:
        if message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, list):  # content parts
                return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
            return str(content or "")
    return ""
