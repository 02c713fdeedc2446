"""Work in a worker thread that stops when its caller is cancelled (in-process generation).

``asyncio.to_thread`` returns to a cancelled caller at once and leaves the thread
running: an in-process model would go on generating up to ``max_tokens`` after Ctrl-C,
and the interpreter would wait for it at exit (or abort, if it exits under it).
:func:`run_stoppable` hands the work a :class:`threading.Event` instead, sets it when
the caller is cancelled and waits for the work to return before the cancellation goes
on, so no generation outlives its episode; :func:`stop_criteria` makes ``transformers``'
``generate()`` end at the next token once the event is set.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


async def run_stoppable(work: Callable[[threading.Event], T]) -> T:
    """``work(stop)`` in a worker thread (with this context); on cancellation, set ``stop``,
    wait for ``work`` to return, then let the cancellation go on (its result is dropped)."""
    stop = threading.Event()
    context = contextvars.copy_context()  # e.g. the guided turn of this generation
    future = asyncio.get_running_loop().run_in_executor(None, context.run, work, stop)
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        stop.set()
        while not future.done():  # at most a token away; a repeated cancel waits too
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.shield(future)
        if not future.cancelled():
            future.exception()  # retrieved: the caller is gone, so is the outcome
        raise


def stop_criteria(stop: threading.Event) -> Any:
    """A ``transformers`` stopping criterion: generation ends at the next token once
    ``stop`` is set."""
    import torch
    from transformers import StoppingCriteria

    class StopWhenSet(StoppingCriteria):
        def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
            return torch.full(
                (input_ids.shape[0],), stop.is_set(), dtype=torch.bool, device=input_ids.device
            )

    return StopWhenSet()
