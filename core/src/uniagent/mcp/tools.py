"""An MCP server's tools as :class:`~uniagent.specs.ToolSpec` records, listed in the sandbox.

At episode start :func:`list_mcp_tools` uploads the client helper and each server's
settings into the sandbox's tools dir and runs ``helper list`` there once per server
(a server that does not start fails the episode's set-up: ``env_error``). Each listed
tool becomes a :class:`McpToolSpec`: the server's JSON schema is what the model sees and
what arguments are validated against (``jsonschema``), and a call is a bash command
(``python3 helper call TOOL ARGS``) run in the agent's session like every other tool, so
it gets the same output limits, timeouts and errors. A ``scope: process`` server is
started (once) by this process instead and the helper reaches it through its socket
(:mod:`uniagent.mcp.process`).
"""

from __future__ import annotations

import copy
import json
import posixpath
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError

from uniagent.env.agent_env import AgentEnv
from uniagent.env.errors import EnvStartError
from uniagent.mcp.config import McpServerConfig
from uniagent.mcp.process import ensure_mcp_server
from uniagent.specs import ToolSpec

HELPER = Path(__file__).with_name("helper.py")
HELPER_NAME = "uniagent_mcp_helper.py"


class _Open(BaseModel):
    """The arguments of a tool whose schema allows keys it does not name."""

    model_config = ConfigDict(extra="allow")


class _Closed(BaseModel):
    """The arguments of a tool whose schema names every key (unknown ones are refused)."""

    model_config = ConfigDict(extra="forbid")


@dataclass(frozen=True, kw_only=True)
class McpToolSpec(ToolSpec):
    """A tool of an MCP server: its JSON schema, called through the helper in the sandbox."""

    server: str
    input_schema: Mapping[str, Any] = field(default_factory=dict, compare=False)
    #: ``scope: process``: the server this process runs (:class:`~uniagent.mcp.process.McpProcess`).
    process: Any = field(default=None, compare=False)

    def parameters_schema(self) -> dict[str, Any]:
        """The server's input schema (a copy, without its title), as OpenAI ``parameters``."""
        schema = copy.deepcopy(dict(self.input_schema))
        schema.pop("title", None)
        schema.setdefault("type", "object")
        schema.setdefault("properties", {})
        schema.setdefault("required", [])
        return schema

    def validate_arguments(self, arguments: Mapping[str, Any]) -> BaseModel:
        """Check the arguments against the server's JSON schema (``pydantic.ValidationError``)."""
        validator_class = jsonschema.validators.validator_for(self.input_schema)
        validator = validator_class(dict(self.input_schema))
        details: list[InitErrorDetails] = []
        for error in sorted(validator.iter_errors(dict(arguments)), key=lambda e: e.path):
            loc = tuple(error.absolute_path)
            if error.validator == "required" and isinstance(error.instance, Mapping):
                required: list[Any] = error.validator_value  # type: ignore[assignment]
                for key in required:
                    if key not in error.instance:
                        details.append({"type": "missing", "loc": (*loc, key), "input": None})
            elif error.validator == "additionalProperties" and not loc:
                continue  # the parser names unknown top-level parameters itself
            else:
                details.append(
                    InitErrorDetails(
                        type=PydanticCustomError(
                            "mcp_schema", "{reason}", {"reason": error.message}
                        ),
                        loc=loc,
                        input=error.instance,
                    )
                )
        if details:
            raise ValidationError.from_exception_data(self.name, details)
        return _Open.model_validate(dict(arguments))


def _spec(
    server: McpServerConfig, listed: Mapping[str, Any], command: list[str], process: Any
) -> McpToolSpec:
    name = str(listed.get("name", ""))
    schema = listed.get("input_schema") or {"type": "object"}
    if not isinstance(schema, Mapping):
        raise EnvStartError(f"MCP server {server.name!r}: tool {name!r} has no JSON schema")
    try:
        jsonschema.validators.validator_for(schema).check_schema(dict(schema))
    except jsonschema.SchemaError as exc:
        raise EnvStartError(
            f"MCP server {server.name!r}: tool {name!r} has an invalid JSON schema: "
            f"{exc.message}; leave it out with `exclude: [{name}]`"
        ) from None
    closed = schema.get("additionalProperties", True) is False or (
        "additionalProperties" not in schema and schema.get("properties") is not None
    )
    prefix = " ".join(map(shlex.quote, command))

    def render(arguments: Mapping[str, Any]) -> str:
        payload = json.dumps(dict(arguments), ensure_ascii=False)
        return f"{prefix} call {shlex.quote(name)} {shlex.quote(payload)}"

    try:
        return McpToolSpec(
            name=name,
            description=str(listed.get("description") or f"{name} (MCP server {server.name})"),
            arguments=_Closed if closed else _Open,
            render=render,
            server=server.name,
            input_schema=dict(schema),
            process=process,
        )
    except ValueError as exc:
        raise EnvStartError(
            f"MCP server {server.name!r}: {exc}; leave the tool out with `exclude: [{name}]`"
        ) from None


async def list_mcp_tools(
    env: AgentEnv, servers: Sequence[McpServerConfig], *, timeout: float
) -> list[McpToolSpec]:
    """Every configured server's tools (filtered by include/exclude), listed in ``env``.

    Raises :class:`~uniagent.env.errors.EnvStartError` (the episode's ``env_error``)
    when a server does not start, answer, or list what its ``include`` names.
    """
    if not servers:
        return []
    tools_dir = env.tools_dir
    helper = posixpath.join(tools_dir, HELPER_NAME)
    await env.write_file(helper, HELPER.read_text())
    specs: list[McpToolSpec] = []
    for server in servers:
        settings = posixpath.join(tools_dir, f"uniagent-mcp-{server.name}.json")
        process = None
        if server.scope == "process":  # started once in this process; reached by its socket
            process = await ensure_mcp_server(server)
            reach = {"name": server.name, "socket": str(process.socket), "timeout": server.timeout}
            await env.write_file(settings, json.dumps(reach))
        else:
            await env.write_file(settings, server.model_dump_json())
        command = [server.python, helper, settings]
        response = await env.execute([*command, "list"], env=None, cwd=env.workdir, timeout=timeout)
        output = (response.stdout or "").strip()
        if response.exit_code != 0:
            raise EnvStartError(
                f"MCP server {server.name!r} did not list its tools (exit {response.exit_code}):"
                f"\n{output[-4000:]}"
            )
        try:
            listed = json.loads(output.splitlines()[-1])["tools"]
        except (IndexError, KeyError, TypeError, ValueError):
            raise EnvStartError(
                f"MCP server {server.name!r}: the helper printed no tool list:\n{output[-4000:]}"
            ) from None
        names = {str(t.get("name")) for t in listed}
        missing = sorted(set(server.include or ()) - names)
        if missing:
            raise EnvStartError(
                f"MCP server {server.name!r} has no tool {', '.join(map(repr, missing))} "
                f"(its include); it has: {', '.join(sorted(names)) or 'none'}"
            )
        specs += [
            _spec(server, t, command, process) for t in listed if server.keeps(str(t.get("name")))
        ]
    return specs
