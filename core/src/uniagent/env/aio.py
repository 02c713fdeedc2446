"""Event-loop helpers: cheap child-process watching for thousands of sandboxes."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import sys
import threading
from collections.abc import Awaitable, Iterator
from typing import Any, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")

_lock = threading.Lock()
_checked = False


class PidfdChildWatcher(asyncio.AbstractChildWatcher):
    """Python 3.12's loop-agnostic pidfd watcher, backported to 3.10/3.11.

    3.11's ``asyncio.PidfdChildWatcher`` is bound to one loop (``attach_loop``);
    this one registers each child with whichever loop is running, so loops in
    other threads (Ray actors, test runners) keep working.
    """

    def __enter__(self) -> PidfdChildWatcher:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def is_active(self) -> bool:
        """Always ready: nothing to attach."""
        return True

    def close(self) -> None:
        """Nothing to release."""

    def attach_loop(self, loop: asyncio.AbstractEventLoop | None) -> None:
        """Loops are found when a child starts; nothing to attach."""

    def add_child_handler(self, pid: int, callback: Any, *args: Any) -> None:  # type: ignore[override]
        """Call ``callback(pid, returncode, *args)`` on the running loop when ``pid`` exits."""
        loop = asyncio.get_running_loop()
        pidfd = os.pidfd_open(pid)
        loop._add_reader(pidfd, self._do_wait, pid, pidfd, callback, args)  # type: ignore[attr-defined]

    def remove_child_handler(self, pid: int) -> bool:
        """Not supported by pidfd watching (as in 3.12); the handler stays."""
        return True

    def _do_wait(self, pid: int, pidfd: int, callback: Any, args: tuple[Any, ...]) -> None:
        loop = asyncio.get_running_loop()
        loop._remove_reader(pidfd)  # type: ignore[attr-defined]
        try:
            _, status = os.waitpid(pid, 0)
        except ChildProcessError:  # reaped elsewhere
            returncode = 255
            log.warning("child process pid %d exit status already read: reporting 255", pid)
        else:
            returncode = os.waitstatus_to_exitcode(status)
        os.close(pidfd)
        callback(pid, returncode, *args)


def pidfd_supported() -> bool:
    """Whether this kernel and Python offer ``pidfd_open`` (Linux 5.3+, Python 3.9+)."""
    if not hasattr(os, "pidfd_open"):
        return False
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError:
        return False
    return True


def use_pidfd_child_watcher() -> bool:
    """Make asyncio watch child processes with pidfds instead of one thread per child.

    Python 3.11's default ``ThreadedChildWatcher`` starts a thread for every
    subprocess, so 1000 sandboxes cost 1000 threads. ``PidfdChildWatcher`` uses
    the running loop's selector; the backport here registers each child with
    whichever loop is running, so installing it process-wide is safe. Python
    3.12+ already picks pidfds by itself, and a watcher the application
    installed itself is left alone. Returns whether
    pidfd watching is in effect. Runners call this once at start-up; sandboxes
    call it too, so forgetting it only costs threads, never correctness.
    """
    global _checked
    if sys.version_info >= (3, 12):
        return pidfd_supported()
    with _lock:
        if not pidfd_supported():
            return False
        try:
            policy = asyncio.get_event_loop_policy()
            current = policy.get_child_watcher()
        except (AttributeError, NotImplementedError):  # a policy without watchers (uvloop)
            return False
        if isinstance(current, PidfdChildWatcher):
            return True
        if type(current) is not asyncio.ThreadedChildWatcher:
            if not _checked:
                log.info("keeping the application's child watcher %s", type(current).__name__)
            _checked = True
            return False
        policy.set_child_watcher(PidfdChildWatcher())
        _checked = True
        return True


#: The young generation's garbage-collection threshold while a process drives many
#: sandboxes (CPython's default is 700 allocations).
GC_THRESHOLD = 20_000


@contextlib.contextmanager
def many_sandboxes_gc(threshold: int = GC_THRESHOLD) -> Iterator[None]:
    """Collect the young generation every ``threshold`` allocations instead of every 700
    while the block runs (never lower than the application set it); the older generations'
    thresholds are kept, and the setting is put back on exit.

    Each sandbox command allocates futures, handles, timers and buffers, and every young
    collection also walks whatever survived into the middle generation: with a thousand
    sessions on one loop the collector ran about 1,100 times over one of
    ``bench/sandbox.py``'s thousand-session rows (30 times at 20,000). Measured there
    (four alternated runs, a quiet 2-core machine): commands/s +6%, the runner's CPU per
    command -7%, the worst event-loop lag while commands run -15%; nothing at 64 sessions.
    What a collection finds is the same: only when it runs changes (a few MB more of young
    objects between runs)."""
    old = gc.get_threshold()
    gc.set_threshold(max(old[0], threshold), *old[1:])
    try:
        yield
    finally:
        gc.set_threshold(*old)


async def wait_for(awaitable: Awaitable[T], timeout: float | None) -> T:
    """``asyncio.wait_for`` that never loses a cancellation.

    On Python 3.11, ``asyncio.wait_for`` returns the awaitable's result when the caller is
    cancelled in the same loop iteration as that result comes (gh-86296): the caller goes
    on as if never cancelled. A sandbox set-up that went on so into its next command
    (waiting for a FIFO nobody would write) held an interrupted run for ever. This awaits
    in the caller's task under ``asyncio.timeout`` (what 3.12's ``wait_for`` does): a
    cancellation from outside is raised, the timeout is :class:`asyncio.TimeoutError`.
    """
    if timeout is None:
        return await awaitable
    async with asyncio.timeout(timeout):
        return await awaitable


async def wait_through_cancellation(awaitable: Any) -> Any:
    """Await ``awaitable`` to the end even if the caller is cancelled meanwhile (cleanup).

    ``asyncio.shield`` alone returns to a cancelled caller at once; anyio's cancel
    scopes (httpx, openai) cancel their host task again and again. This keeps
    waiting; the caller's cancellation is delivered by its next await.
    """
    future = asyncio.ensure_future(awaitable)
    cancelled = False
    while not future.done():
        try:
            await asyncio.shield(future)
        except asyncio.CancelledError:
            cancelled = True
    if cancelled:
        task = asyncio.current_task()
        if task is not None:  # keep the cancellation pending for the caller's next await
            task.cancel()
    return future.result()
