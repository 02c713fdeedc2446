"""SIGINT and SIGTERM: stop the run, close every sandbox, then exit 130 / 143.

The first signal cancels the run: running episodes stop, every open sandbox of
this process is closed (whatever backend it is on) and the command exits with
128 + the signal number after one line. A second signal says that sandboxes
are still closing; a third exits at once and leaves them to ``uniagent clean``
(and to the next run in the same folder, which removes them at start).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Callable

from uniagent.errors import UniAgentError

SIGNALS = (signal.SIGINT, signal.SIGTERM)


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
    """Installs the run's SIGINT/SIGTERM handlers on the running loop for a ``with`` block."""

    def __init__(self, task: asyncio.Task, *, say: Callable[[str], None] | None = None) -> None:
        self.task = task
        self.signum: int | None = None
        self.count = 0
        self.say = say or (lambda text: print(text, file=sys.stderr, flush=True))
        self._loop = asyncio.get_running_loop()

    def __enter__(self) -> SignalGuard:
        for signum in SIGNALS:
            self._loop.add_signal_handler(signum, self._on_signal, signum)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum in SIGNALS:
            self._loop.remove_signal_handler(signum)

    def _on_signal(self, signum: int) -> None:
        self.count += 1
        if self.count == 1:
            self.signum = signum
            self.task.cancel()
        elif self.count == 2:
            self.say("uniagent: still closing sandboxes; signal again to exit now and leave "
                     "them to `uniagent clean`")
        else:
            os._exit(128 + (self.signum or signum))
