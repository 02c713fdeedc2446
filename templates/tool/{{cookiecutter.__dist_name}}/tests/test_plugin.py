"""The plugin is found once installed, and its tool works in a real sandbox."""

from __future__ import annotations

from uniagent import get_registry, open_env

TOOL = "{{ cookiecutter.__record_name }}"


def test_plugin_is_discovered() -> None:
    """After ``pip install``, uniagent lists the tool as this distribution's."""
    assert get_registry().tools()[TOOL].distribution == "{{ cookiecutter.__dist_name }}"


def test_a_call_becomes_the_command_that_runs_the_script() -> None:
    """Arguments become ``--name value`` options; omitted optional ones are left out."""
    assert get_registry().tools()[TOOL].to_command({"who": "world"}) == f"{TOOL} --who world"


async def test_the_tool_greets_inside_a_host_sandbox() -> None:
    """Installed into a real sandbox, the script prints the greeting."""
    tool = get_registry().tools()[TOOL]
    env = open_env({"type": "host"})
    await env.start()
    try:
        await env.install_tools([tool])
        observation = await env.run_action(
            tool.to_command({"who": "world", "greeting": "Hi"}), timeout=30
        )
    finally:
        await env.close()
    assert observation.exit_code == 0, observation.output
    assert observation.output.strip() == "Hi, world!"
