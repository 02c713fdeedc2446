"""The ``mcp:`` block of a ``tools`` entry: one MCP server whose tools the agent gets.

Plain, strict data (pydantic only): :mod:`uniagent.config` takes it in ``ToolRef``; the
resolver checks it before any sandbox starts, and :mod:`uniagent.mcp.tools` turns the
server's listed tools into :class:`~uniagent.specs.ToolSpec` records at episode start.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Transport = Literal["stdio", "streamable-http"]
Scope = Literal["sandbox", "process"]


class McpServerConfig(BaseModel):
    """One MCP server: how to reach it, and which of its tools the agent sees."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(
        pattern=r"^[A-Za-z0-9_-]+$",
        description="the server's name (its tools keep their own names; it names errors)",
    )
    transport: Transport = Field("stdio", description="stdio: `command`; streamable-http: `url`")
    command: tuple[str, ...] = Field(
        (), description="stdio: the server's argv, run inside the episode's sandbox"
    )
    env: dict[str, str] = Field(
        default_factory=dict, description="stdio: variables of the server's process"
    )
    url: str | None = Field(None, description="streamable-http: the server's endpoint")
    scope: Scope = Field(
        "sandbox",
        description="stdio: where the server runs. sandbox (default): in each episode's sandbox, "
        "acting there; process: once in the run's process, shared by its episodes through a "
        "Unix socket (for read-only servers: it acts on this machine, not in the sandbox)",
    )
    include: tuple[str, ...] | None = Field(
        None, description="only these tools of the server (default: all)"
    )
    exclude: tuple[str, ...] = Field((), description="tools of the server left out")
    python: str = Field(
        "python3",
        description="the interpreter (with the `mcp` package) that runs the client helper "
        "inside the sandbox",
    )
    timeout: float | None = Field(
        None, gt=0, description="seconds one call may take (default: interaction.action_timeout)"
    )

    @model_validator(mode="after")
    def _reachable(self) -> McpServerConfig:
        if self.transport == "stdio":
            if not self.command:
                raise ValueError("a stdio server needs `command` (its argv)")
            if self.url is not None:
                raise ValueError("`url` is for transport streamable-http; stdio uses `command`")
        else:
            if not self.url:
                raise ValueError("a streamable-http server needs `url`")
            if self.command or self.env:
                raise ValueError("`command` and `env` are for transport stdio")
            if self.scope != "sandbox":
                raise ValueError("`scope` is for transport stdio (an HTTP server runs elsewhere)")
        overlap = set(self.include or ()) & set(self.exclude)
        if overlap:
            raise ValueError(f"tools both included and excluded: {', '.join(sorted(overlap))}")
        return self

    def keeps(self, tool: str) -> bool:
        """Whether the server's tool ``tool`` is given to the agent."""
        return (self.include is None or tool in self.include) and tool not in self.exclude
