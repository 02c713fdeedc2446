"""The built-in ReAct loop as an episode's agent (``agent: {name: react}``): the
configured tools and parser in the agent's sandbox, the model called directly."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from uniagent.agent_run import AgentRun, EpisodeContext
from uniagent.env.errors import EnvStartError
from uniagent.interaction.loop import AgentInteraction, InteractionResult
from uniagent.interaction.prompts import describe_tools, first_messages, tool_instructions
from uniagent.interaction.tree import TreeRollout

if TYPE_CHECKING:  # pragma: no cover - imports for type checkers only
    from uniagent.env.agent_env import AgentEnv
    from uniagent.interaction.metrics import EpisodeMetrics
    from uniagent.resolver import ResolvedAgent
    from uniagent.rollout import Rollout


class ReactAgent:
    """:class:`~uniagent.agent_run.EpisodeAgent` of the built-in loop
    (:class:`~uniagent.interaction.loop.AgentInteraction`). Made per episode: the first
    messages are rendered here, so a task missing a field of ``instance_template`` fails
    before any sandbox starts."""

    def __init__(self, context: EpisodeContext) -> None:
        self.context = context
        agent = context.agent
        self.tools: list[Any] = list(agent.tools)
        self.parser = agent.new_parser()
        self.prompt = (
            [dict(m) for m in context.messages]
            if context.messages
            else first_messages(agent, context.task)
        )

    async def new_env(self) -> AgentEnv:
        return self.context.agent.new_env()

    async def setup(self, env: AgentEnv) -> None:
        """The tools installed; the MCP servers' tools listed, in the sandbox."""
        agent = self.context.agent
        await env.install_tools(self.tools)
        if agent.mcp_servers:  # their tools are known once the servers answer
            self.tools += await _mcp_tools(agent, env, self.tools)

    async def run(self, env: AgentEnv, metrics: EpisodeMetrics) -> AgentRun:
        context, tools = self.context, self.tools
        model = context.model
        if not model.renders_tools():  # the chat template would silently drop the tool schemas
            describe_tools(self.prompt, tool_instructions(tools, self.parser))
        cache = model.start_cache(self.prompt, [t.openai_schema() for t in tools])
        interaction = AgentInteraction(
            model,
            env,
            tools,
            self.parser,
            context.agent.config.interaction,
            logger=context.logger,
            observer=context.observer,
        )
        servers = {  # the MCP tools' (uniagent.mcp.tools.McpToolSpec.server)
            t.name: f"mcp:{server}"
            for t in tools
            if isinstance(server := getattr(t, "server", None), str)
        }
        branching = context.agent.config.interaction.branching
        if branching is None or not branching.enabled:
            outcome = await interaction.run(cache, metrics)
            return _agent_run(outcome, cache, servers)
        # Forks of a layered sandbox copy what the agent wrote, not the repository: the
        # episode's sandbox is frozen under it (the grader's baseline stays valid there).
        layered = await env.layered()
        if layered is not None:
            context.logger.info("tree rollout: forks copy only what the agent writes (layers)")
            interaction.env = env = layered
        tree = TreeRollout(branching, context.logger)
        leaves = await tree.run(interaction, env, cache, metrics)
        runs = []
        for leaf in leaves:
            assert leaf.outcome is not None
            run = _agent_run(leaf.outcome, leaf.cache, servers)
            run.branch, run.env, run.metrics = leaf.branch, leaf.env, leaf.metrics
            run.lost_processes, run.moved = leaf.lost_processes, leaf.moved
            runs.append(run)
        # The episode's own run is its root branch's, with every leaf's.
        splits = [s.to_dict() for s in tree.splits]
        return replace(runs[0], leaves=runs, env=env, metrics=metrics, splits=splits)


def _agent_run(outcome: InteractionResult, cache: Rollout, servers: dict[str, str]) -> AgentRun:
    return AgentRun(
        exit_reason=outcome.exit_reason,
        cache=cache,
        submission=outcome.submission,
        error=outcome.error,
        notes=outcome.notes,
        turn_scores=dict(outcome.turn_scores),
        tool_servers=servers,
    )


async def _mcp_tools(agent: ResolvedAgent, env: AgentEnv, tools: list[Any]) -> list[Any]:
    """The MCP servers' tools, listed in the sandbox; a clash of names fails the set-up."""
    from uniagent.mcp.tools import list_mcp_tools

    listed = await list_mcp_tools(env, agent.mcp_servers, timeout=agent.env.setup_timeout)
    taken = {t.name for t in tools}
    for tool in listed:
        if tool.name in taken:
            raise EnvStartError(
                f"tool {tool.name!r} of MCP server {tool.server!r} has the name of another "
                f"tool; leave one out (`exclude: [{tool.name}]`)"
            )
        taken.add(tool.name)
    return list(listed)
