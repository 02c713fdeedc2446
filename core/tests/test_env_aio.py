"""Event-loop helpers: a timeout that never loses a cancellation."""

from __future__ import annotations

import asyncio
import sys

import pytest

from uniagent.env.aio import wait_for


async def cancelled_as_the_result_comes(wait) -> asyncio.Task[int]:
    """A task waiting (with ``wait``) for a future that gets its result in the same loop
    iteration as the task is cancelled: what a signal's cancellation meets when a sandbox's
    set-up command ends at that moment."""
    done: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    task = asyncio.ensure_future(wait(asyncio.shield(done), 60))
    await asyncio.sleep(0)  # the task waits
    done.set_result(1)
    task.cancel()
    await asyncio.wait({task})
    return task


async def test_a_cancellation_that_meets_the_result_is_raised():
    task = await cancelled_as_the_result_comes(wait_for)
    assert task.cancelled()


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="3.12's wait_for keeps it")
async def test_python_3_11s_wait_for_loses_it():
    """Why the helper exists: the same race, through ``asyncio.wait_for``."""
    task = await cancelled_as_the_result_comes(asyncio.wait_for)
    assert not task.cancelled() and task.result() == 1


async def test_a_timeout_is_a_timeout_error_and_none_waits():
    never: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    with pytest.raises(asyncio.TimeoutError):
        await wait_for(never, 0.01)
    assert never.cancelled()
    assert await wait_for(asyncio.sleep(0, "x"), None) == "x"
    assert await wait_for(asyncio.sleep(0, "y"), 60) == "y"
