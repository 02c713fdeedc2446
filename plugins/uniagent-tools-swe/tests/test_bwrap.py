"""The tools work inside a bubblewrap-isolated host sandbox (tools dir mounted, no host paths)."""

from __future__ import annotations

import pytest
from uniagent import open_env

from uniagent_tools_swe import make_tools

pytestmark = pytest.mark.asyncio


async def test_edit_undo_and_submit_inside_bubblewrap() -> None:
    tools = {spec.name: spec for spec in make_tools()}
    env = open_env({"type": "host", "isolation": "bwrap"})
    await env.start()  # needs bubblewrap: apt-get install bubblewrap (.ci/run does)
    try:
        await env.install_tools(list(tools.values()))
        editor = tools["str_replace_editor"]

        async def edit(**arguments: object) -> str:
            obs = await env.run_action(editor.to_command(arguments), timeout=30)
            assert obs.exit_code == 0, obs.output
            return obs.output

        path = f"{env.workdir}/x.py"
        await edit(command="create", path=path, file_text="a = 1\n")
        assert "     1\ta = 2" in await edit(
            command="str_replace", path=path, old_str="1", new_str="2"
        )
        assert "     1\ta = 1" in await edit(command="undo_edit", path=path)
        await env.run_action(
            "git init -q . && git add -A && git -c user.email=t@example.com -c user.name=t "
            "commit -qm base && echo 'a = 5' > x.py",
            timeout=30,
        )
        obs = await env.run_action(tools["submit"].to_command({}), timeout=30)
        assert obs.exit_code == 0, obs.output
        assert "-a = 1\n+a = 5" in obs.output
    finally:
        await env.close()
