"""verl v1's replay buffer with the batch's agent metrics (``agent/...``) in its step metrics.

verl 0.9.1's v1 trainer (``trainer.use_v1=True``, the default of ``main_ppo``) takes each
update's batch from a replay buffer over TransferQueue; the metrics its ``sample()``
returns are added to the step's metrics (and reduced by verl's ``MetricsAggregator`` when
a step holds several updates). Select this buffer in the recipe::

    trainer.v1.sampler.custom_sampler.path=pkg://uniagent.verl.replay_buffer
    trainer.v1.sampler.custom_sampler.name=UniAgentReplayBuffer

:func:`UniAgentReplayBuffer` builds verl's own buffer for the trainer mode (``ReplayBuffer``
for ``sync``, ``ReplayBufferAsync`` otherwise) with :class:`AgentMetricsMixin` on top. verl
gives custom samplers only its base arguments, so its DAPO group filtering
(``algorithm.filter_groups``) and ``sync_refill_failed_groups`` are not applied by this
buffer; a custom buffer of your own gets the metrics by adding :class:`AgentMetricsMixin`.

This module imports TransferQueue (``pip install 'verl[verl-core]'``).
"""

from __future__ import annotations

from typing import Any

import transfer_queue as tq
from transfer_queue import KVBatchMeta
from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer, ReplayBufferAsync

from uniagent.verl.metrics import agent_metrics


def kv_agent_metrics(batch: KVBatchMeta) -> dict[str, float]:
    """The ``agent/...`` metrics of a TransferQueue batch (its rows' ``extra_fields``)."""
    if not batch.keys:
        return {}
    data = tq.kv_batch_get(
        keys=batch.keys, partition_id=batch.partition_id, select_fields=["extra_fields"]
    )
    extras = []
    for value in data["extra_fields"]:
        fields = getattr(value, "data", value)  # NonTensorData wraps each row's dict
        extras.append(fields.get("extras") if isinstance(fields, dict) else None)
    return agent_metrics(extras)


class AgentMetricsMixin:
    """Adds :func:`kv_agent_metrics` of each sampled batch to the metrics ``sample()`` returns."""

    def sample(
        self, global_steps: int, partition_id: str, batch_size: int
    ) -> tuple[KVBatchMeta, dict[str, Any]]:
        """The parent's sample, with the batch's agent metrics added."""
        batch, metrics = super().sample(global_steps, partition_id, batch_size)  # type: ignore[misc]
        return batch, {**metrics, **kv_agent_metrics(batch)}


class UniAgentSyncReplayBuffer(AgentMetricsMixin, ReplayBuffer):
    """verl's sync replay buffer with agent metrics."""


class UniAgentAsyncReplayBuffer(AgentMetricsMixin, ReplayBufferAsync):
    """verl's async replay buffer (colocate/separate async modes) with agent metrics."""


def UniAgentReplayBuffer(**kwargs: Any) -> ReplayBuffer:  # named like a class: verl calls it
    """verl's replay buffer for ``kwargs["trainer_mode"]``, with agent metrics."""
    if kwargs.get("trainer_mode") == "sync":
        return UniAgentSyncReplayBuffer(**kwargs)
    return UniAgentAsyncReplayBuffer(**kwargs)
