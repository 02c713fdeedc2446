"""verl's classic ``AgentLoopWorker`` taking several outputs from one ``run`` (one per branch).

verl 0.9.1's v1 worker (``AgentLoopWorkerTQ``, ``main_ppo``'s default) takes a list of
outputs from an agent loop's ``run`` and stores each as a sample of the row's ``uid``. Its
classic ``AgentLoopWorker`` postprocesses exactly one output per row.
:class:`TreeAgentLoopWorker` is that worker with the narrowest change that lifts this:
each output of a ``run`` is postprocessed by verl's own code, and the batch gets one row
per output, each with its dataset row's other columns (``uid`` included) repeated, so a
branching episode's samples stay in their prompt's GRPO group.

Where it fits: a consumer that takes the worker's batch as its rows (verl's fully async
rollouter replaces a sample's batch by the worker's). verl's classic ``ray_trainer``
does not: it joins the worker's batch to the prompts it repeated ``n`` times, row by
row (``DataProto.union``), so there a branching episode must give one sample
(``branches: last``, which the classic worker gets anyway).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

from uniagent.verl.branches import TAKES_LISTS


class TreeAgentLoopWorker(AgentLoopWorker):
    """verl's ``AgentLoopWorker``; a ``run`` may return a list of outputs."""

    async def _run_agent_loop(self, *args: Any, **kwargs: Any) -> Any:
        """verl's, with :data:`~uniagent.verl.branches.TAKES_LISTS` set for the loop's ``run``."""
        token = TAKES_LISTS.set(True)
        try:
            return await super()._run_agent_loop(*args, **kwargs)
        finally:
            TAKES_LISTS.reset(token)

    async def _agent_loop_postprocess(self, output: Any, validate: Any, **kwargs: Any) -> Any:
        """verl's postprocessing of each output (a list for a list)."""
        base = super()._agent_loop_postprocess
        if isinstance(output, list):
            return [await base(o, validate, **kwargs) for o in output]
        return await base(output, validate, **kwargs)

    def _postprocess(
        self,
        inputs: list[Any],
        input_non_tensor_batch: dict[str, Any] | None = None,
        validate: bool = False,
    ) -> Any:
        """One row per output: a row's inputs repeated for each output of its ``run``."""
        counts = [len(x) if isinstance(x, list) else 1 for x in inputs]
        flat = [o for x in inputs for o in (x if isinstance(x, list) else [x])]
        if input_non_tensor_batch and any(c != 1 for c in counts):
            rows = np.repeat(np.arange(len(inputs)), counts)
            input_non_tensor_batch = {k: v[rows] for k, v in input_non_tensor_batch.items()}
        return super()._postprocess(
            flat, input_non_tensor_batch=input_non_tensor_batch, validate=validate
        )
