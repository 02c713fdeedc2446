"""SIGINT and SIGTERM: stop the run, close its sandboxes, then exit 130 / 143.

One :class:`SignalGuard` covers a whole ``uniagent run``, every phase of it:
loading the config and tasks, the run's set-up (model check, leftovers,
services), the episodes, and the teardown (services stopped, sandboxes closed,
the summary written and printed). The first signal

- while loading or printing (plain code, nothing open): stops it at once;
- while the run's event loop runs: cancels the run, whose clean-up (closing
  every sandbox of the run, stopping its services, writing the summary) then
  finishes, cancelled or not;
- during the event loop's own shutdown: waits for it to finish;

and then the command exits with 128 + the signal number after one line
(:class:`Interrupted`). A first signal that does not stop the command at once
says so at once (``uniagent: stopping``), even while an in-process model is in
the middle of a token. A second signal says that sandboxes are still closing;
a third exits at once and leaves them to ``uniagent clean`` (and to the next
run in the same folder, which removes them at start).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Awaitable, Callable, Iterator
from types import FrameType
from typing import Any, TypeVar

from uniagent.env.open_envs import close_open_envs
from uniagent.errors import UniAgentError

SIGNALS = (signal.SIGINT, signal.SIGTERM)
T = TypeVar("T")


class Interrupted(UniAgentError):
    """The run was stopped by a signal; its sandboxes are closed."""

    def __init__(self, signum: int, message: str) -> None:
        super().__init__(message)
        self.signum = signum

    @property
    def exit_status(self) -> int:
        """128 + the signal number, as shells report it (130 for SIGINT, 143 for SIGTERM)."""
        return 128 + self.signum


class SignalGuard:
    """SIGINT/SIGTERM handlers of a command for a ``with`` block (the main thread's).

    Outside :meth:`run` the first signal raises :class:`Interrupted` where the
    code is; :meth:`run` runs a coroutine under ``asyncio.run`` whose clean-up
    the signal lets finish. ``task`` (deprecated): a task of the running loop to
    cancel on the first signal, as before 0.3.
    """

    def __init__(
        self, task: asyncio.Task[Any] | None = None, *, say: Callable[[str], None] | None = None
    ) -> None:
        self.signum: int | None = None
        self.count = 0
        #: Prints a line (default: to stderr, above the run's live view when it has one).
        self.say = say or self._print
        #: Where the command is: ``loading``, ``running`` or ``finished`` (for the message).
        self.phase = "loading"
        #: Counts episodes for the message (a :class:`~uniagent.run.progress.Progress`).
        self.progress: Any = None
        self._task: asyncio.Task[Any] | None = task
        self._loop = task.get_loop() if task is not None else None
        self._defer = False
        self._previous: dict[int, Any] = {}

    # -- installing -----------------------------------------------------------------------
    def __enter__(self) -> SignalGuard:
        if threading.current_thread() is threading.main_thread():
            for signum in SIGNALS:
                self._previous[signum] = signal.signal(signum, self._on_signal)
        _ACTIVE.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _ACTIVE.remove(self)
        for signum, handler in self._previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        self._previous.clear()

    @staticmethod
    def current() -> SignalGuard | None:
        """The innermost guard in effect in this process, if any."""
        return _ACTIVE[-1] if _ACTIVE else None

    # -- the asynchronous phases ----------------------------------------------------------
    def run(self, main: Callable[[], Awaitable[T]], *, progress: Any = None) -> T:
        """``asyncio.run(main())``: a signal cancels it, its clean-up finishes, then
        :class:`Interrupted` is raised (after every sandbox of the run is closed)."""
        self.progress = progress if progress is not None else self.progress
        self.phase = "running"

        async def guarded() -> T:
            task = asyncio.current_task()
            assert task is not None
            with self._cancelling(task):
                try:
                    return await main()
                finally:
                    if self.signum is not None:
                        await close_open_envs()  # whatever main left open (it should not)

        with self._deferred():  # asyncio's own shutdown (threads, generators) is clean-up
            try:
                result = asyncio.run(guarded())
            except asyncio.CancelledError:
                if self.signum is None:
                    raise
        if self.signum is not None:
            raise self.interrupted()
        self.phase = "finished"
        return result

    @contextlib.contextmanager
    def _cancelling(self, task: asyncio.Task[Any]) -> Iterator[None]:
        previous = self._task, self._loop
        self._task, self._loop = task, task.get_loop()
        try:
            if self.signum is not None:  # a signal came just before the loop started
                task.cancel()
            yield
        finally:
            self._task, self._loop = previous

    @contextlib.contextmanager
    def _deferred(self) -> Iterator[None]:
        previous, self._defer = self._defer, True
        try:
            yield
        finally:
            self._defer = previous

    # -- the signal -----------------------------------------------------------------------
    def _on_signal(self, signum: int, frame: FrameType | None = None) -> None:
        self.count += 1
        if self.count == 1:
            self.signum = signum
            task, loop = self._task, self._loop
            if task is None or loop is None or task.done():
                if not self._defer:
                    raise self.interrupted()  # says it all, at once
                self._stopping(signum)
                return
            # Said now: the clean-up may wait for a generation's next token, or longer.
            self._stopping(signum)
            # Thread-safe, and wakes the loop out of its selector.
            loop.call_soon_threadsafe(task.cancel)
        elif self.count == 2:
            self.say(
                "uniagent: still closing sandboxes; signal again to exit now and leave "
                "them to `uniagent clean`"
            )
        else:
            os._exit(128 + (self.signum or signum))

    def _stopping(self, signum: int) -> None:
        text = (
            f"uniagent: stopping ({signal.Signals(signum).name}): cancelling the running "
            "episodes and closing their sandboxes; signal twice more to exit at once"
        )
        try:
            self.say(text)
        except RuntimeError:  # the signal came inside a write to the same stream
            if self._loop is not None and not self._loop.is_closed():
                self._loop.call_soon_threadsafe(self.say, text)

    def _print(self, text: str) -> None:
        progress = self.progress
        if progress is not None and getattr(progress, "live", False):
            progress.say(text)  # above the live view, which would draw over a plain line
        else:
            print(text, file=sys.stderr, flush=True)

    def interrupted(self) -> Interrupted:
        """The :class:`Interrupted` error for the signal received, saying what was done."""
        signum = self.signum or signal.SIGINT
        name = signal.Signals(signum).name
        progress = self.progress
        done, total = (progress.done, progress.total) if progress is not None else (0, 0)
        if self.phase == "loading":
            what = " while loading the config and tasks: nothing was started; run it again"
        elif total and done >= total:
            what = (
                f" after every episode finished ({done} of {total}): the run's sandboxes and "
                "services are closed, its results and summary written"
            )
        else:
            counts = f"{done} of {total} episodes finished; " if total else ""
            what = (
                f": {counts}running episodes stopped and their sandboxes closed; run the same "
                "command again to resume"
            )
        return Interrupted(signum, f"interrupted by {name}{what}")


_ACTIVE: list[SignalGuard] = []
