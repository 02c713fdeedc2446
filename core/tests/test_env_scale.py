"""Many host sandboxes in one event loop: all commands succeed and the loop never stalls."""

from __future__ import annotations

import asyncio
import resource
import threading
import time

from uniagent.env import AgentEnv, use_pidfd_child_watcher
from uniagent.registry import get_registry

ENVS = 200
COMMANDS = 20


async def test_200_host_envs_share_one_event_loop() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 6 * ENVS + 100:  # a session holds 5 descriptors (2 sockets, a pipe, a pty, a pidfd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 8 * ENVS + 100), hard))
    assert use_pidfd_child_watcher()
    get_registry().deployments()  # plugin imports happen once, before the clock starts
    threads_before = threading.active_count()
    gaps: list[float] = []
    stop = asyncio.Event()

    async def ticker() -> None:
        last = time.perf_counter()
        while not stop.is_set():
            await asyncio.sleep(0.01)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    async def episode(i: int) -> list[str]:
        async with AgentEnv.from_config({"type": "host"}) as env:
            await env.run_action(f"export EPISODE={i}")
            outputs = []
            for j in range(COMMANDS):
                obs = await env.run_action(f"echo {i}-{j}", timeout=60)
                assert obs.exit_code == 0
                outputs.append(obs.output)
            assert (await env.run_action('echo "$EPISODE"')).output == f"{i}\n"
            peak_threads.append(threading.active_count())
            return outputs

    peak_threads: list[int] = []
    tick = asyncio.create_task(ticker())
    try:
        results = await asyncio.gather(*(episode(i) for i in range(ENVS)))
    finally:
        stop.set()
        await tick
    for i, outputs in enumerate(results):
        assert outputs == [f"{i}-{j}\n" for j in range(COMMANDS)]
    assert len(gaps) > 10
    print(f"max tick gap {max(gaps) * 1000:.0f} ms, peak threads {max(peak_threads)}")
    # Generous: a blocked loop shows as multi-second gaps; 2 noisy cores show tens of ms.
    assert max(gaps) < 1.0, f"the event loop stalled for {max(gaps):.2f} s"
    # No thread per child process (bash's exit is watched through a pidfd).
    assert max(peak_threads) < threads_before + 40
