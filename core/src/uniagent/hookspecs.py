"""The plugin contract: six hooks, each returning typed records.

A plugin is a module with functions decorated by :data:`uniagent.hookimpl`,
exposed through an entry point in the ``uniagent`` group whose name equals the
distribution name::

    # pyproject.toml of uniagent-tools-hello
    [project.entry-points.uniagent]
    uniagent-tools-hello = "uniagent_tools_hello.plugin"

Every hook is optional; implement only what the plugin contributes. Hooks are
called through pluggy, with arguments by name, so a later version may give a
hook an argument without breaking plugins that do not take it. What may change
between versions is in docs/plugins.md ("Compatibility").
"""

from __future__ import annotations

from collections.abc import Iterable

import pluggy

from uniagent.specs import (
    AgentSpec,
    DeploymentSpec,
    ParserSpec,
    RewardSpec,
    ServiceSpec,
    ToolSpec,
)

PROJECT = "uniagent"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def uniagent_tools() -> Iterable[ToolSpec]:
    """Tools the agent can call, run as commands in the sandbox.

    Example::

        class HelloArgs(BaseModel):
            who: str = Field(description="whom to greet")

        @hookimpl
        def uniagent_tools():
            yield ToolSpec(name="hello", description="Greet someone.",
                           arguments=HelloArgs, scripts=(HERE / "bin" / "hello",))

    .. versionadded:: 0.1
    .. versionchanged:: 0.2 ``ToolSpec.settings`` / ``configure``: settings from the config.
    """
    raise NotImplementedError  # a specification: plugins implement it


@hookspec
def uniagent_deployments() -> Iterable[DeploymentSpec]:
    """Sandbox backends, each with a pydantic config whose ``type`` names it.

    Example::

        class MyCloudConfig(BaseModel):
            type: Literal["mycloud"] = "mycloud"
            image: str

        @hookimpl
        def uniagent_deployments():
            yield DeploymentSpec(name="mycloud", config=MyCloudConfig,
                                 factory=MyCloudDeployment)

    .. versionadded:: 0.1
    .. versionchanged:: 0.2 the :class:`uniagent.sandbox.Deployment` protocol gained
       ``sandbox_alive``, ``kill_processes``, ``workdir`` and ``tools_dir``.
    .. versionchanged:: 0.3 ``DeploymentSpec.cleanup``; the protocols moved to
       :mod:`uniagent.sandbox`, and ``Runtime`` is typed with its request models.
    """
    raise NotImplementedError  # a specification: plugins implement it


@hookspec
def uniagent_tool_parsers() -> Iterable[ParserSpec]:
    """Parsers that turn model text into tool calls.

    Example::

        @hookimpl
        def uniagent_tool_parsers():
            yield ParserSpec(name="json_lines", factory=JsonLinesParser)

    .. versionadded:: 0.1
    .. versionchanged:: 0.2 parsers gained ``format_tool_response``.
    """
    raise NotImplementedError  # a specification: plugins implement it


@hookspec
def uniagent_rewards() -> Iterable[RewardSpec]:
    """Rewards computed when an episode ends, in a grading sandbox the agent cannot reach.

    Example::

        async def tests_pass(ctx):
            done = await ctx.require_sandbox().run("pytest -q", timeout=600)
            return 1.0 if done.exit_code == 0 else 0.0

        @hookimpl
        def uniagent_rewards():
            yield RewardSpec(name="tests_pass", fn=tests_pass)

    .. versionadded:: 0.1
    .. versionchanged:: 0.2 rewards get a grading ``sandbox``, never the agent's session;
       ``RewardSpec.uses_sandbox`` and ``integrity``.
    .. versionchanged:: 0.3 ``RewardSpec.settings`` and ``RewardContext.settings``
       (``config``, their old name, is deprecated until 0.4); ``RewardSpec.task_fields``.
    """
    raise NotImplementedError  # a specification: plugins implement it


@hookspec
def uniagent_services() -> Iterable[ServiceSpec]:
    """Process-wide services the tools use, started once per process when a config names them.

    ``services: {retriever: {port: 8000}}`` in an agent config starts ``retriever``
    before the first episode of ``uniagent run`` (stopped at its end) or of a verl
    worker (it ends with the worker). Tools reach it through settings in the
    sandbox's environment (``env: {env: {...}}``).

    Example::

        class RetrieverSettings(BaseModel):
            port: int = 8000

        async def start_retriever(settings):
            proc = await asyncio.create_subprocess_exec("my-retriever", str(settings.port))
            return ProcessHandle(proc)  # has `async def stop(self)`

        @hookimpl
        def uniagent_services():
            yield ServiceSpec(name="retriever", start=start_retriever,
                              settings=RetrieverSettings)

    .. versionadded:: 0.2
    .. versionchanged:: 0.3 ``ServiceSpec.settings`` (``config`` is deprecated until 0.4).
    """
    raise NotImplementedError  # a specification: plugins implement it


@hookspec
def uniagent_agents() -> Iterable[AgentSpec]:
    """Agents: the built-in ReAct loop (``react``), harnesses run inside the sandbox, and
    any other :class:`~uniagent.agent_run.EpisodeAgent`.

    ``agent: {name: NAME, settings: {...}}`` in an agent config picks one. A harness is
    installed pinned (pip, npm or a binary), started in the episode's sandbox as the agent
    with a gateway session's base URL and key, and its trajectory is the session's tree.
    An agent of another kind gives ``runner``: a callable that makes its
    :class:`~uniagent.agent_run.EpisodeAgent` for each episode (``new_env``, ``setup``,
    ``run``), run by the same episode body as the built-in loop (baseline, grading, close).

    Example::

        class MySettings(BaseModel):
            step_limit: int = 30

        def launch(run: AgentLaunch, settings: MySettings) -> AgentCommand:
            return AgentCommand(
                f"{run.bin}/my-agent --steps {settings.step_limit} "
                f"--task {shlex.quote(run.instruction)}",
                env={"OPENAI_BASE_URL": run.base_url + "/v1", "OPENAI_API_KEY": run.api_key},
            )

        @hookimpl
        def uniagent_agents():
            yield AgentSpec(name="my-agent", install=AgentInstall("pip", "my-agent", "1.2.0",
                            "my-agent"), wire="chat", launch=launch,
                            settings=MySettings)

    .. versionadded:: 0.3
    """
    raise NotImplementedError  # a specification: plugins implement it
