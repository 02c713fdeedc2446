"""A sandbox opened in a Ray worker, where verl's agent-loop workers open theirs.

Ray starts its workers with SIGINT blocked, and a blocked signal stays blocked across
``exec``: a sandbox's shell that inherited it never received the interrupt of a timed-out
command, and the whole session was killed instead (every command timeout of a verl rollout
lost its sandbox, while ``uniagent run`` was fine).
"""

from __future__ import annotations

from typing import Any

import pytest


def _status(text: str, field: str) -> str:
    return next(line.split()[1] for line in text.splitlines() if line.startswith(field))


@pytest.mark.parametrize("isolation", ["none", "bwrap"])
def test_a_timed_out_command_in_a_ray_worker_is_interrupted_and_the_shell_goes_on(
    ray_cluster: None, isolation: str
) -> None:
    import ray

    @ray.remote
    def episode(isolation: str) -> dict[str, Any]:
        import asyncio
        from pathlib import Path

        from uniagent import open_env

        async def main() -> dict[str, Any]:
            async with open_env({"type": "host", "isolation": isolation}) as env:
                await env.run_action("cd /tmp && X=kept")
                (slow,) = await asyncio.gather(
                    env.run_action("echo before; sleep 1000", timeout=1), return_exceptions=True
                )
                after = await env.run_action("echo $PWD $X; grep '^SigBlk:' /proc/self/status")
            return {
                "worker": Path("/proc/self/status").read_text(),
                "slow": type(slow).__name__,
                "after": after.output,
            }

        return asyncio.run(main())

    result = ray.get(episode.remote(isolation), timeout=600)
    # The worker blocks SIGINT (what this test is about; bit 2 of the mask: 0x2).
    assert int(_status(result["worker"], "SigBlk:"), 16) & 0x2, result["worker"]
    assert result["slow"] == "ActionTimeoutError", result
    # The same shell answers (its directory and variables kept), its commands block nothing.
    assert result["after"].split() == ["/tmp", "kept", "SigBlk:", "0" * 16], result
