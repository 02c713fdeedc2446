"""verl's fully async trainer with the agent metrics (``agent/...``) in its step metrics,
and the turn scores of ``reward.credit`` in its batches' ``rm_scores``.

verl 0.9.1's fully async trainer (``verl.experimental.fully_async_policy``) builds its
rollouter, loop manager and trainer itself, with no extension point for metrics. Its
trainer takes each step's batch from the message queue and copies some of the batch's
``meta_info`` into the step's metrics (``_collect_metrics_from_samples``);
:class:`AgentMetricsTrainer` adds :func:`uniagent.verl.metrics.batch_agent_metrics` of
the same batch there (the ``extras`` column holds every sample's uniagent record). The
step's metrics go through verl's ``MetricsAggregator`` (a sync cycle of
``async_training.trigger_parameter_sync_step`` steps is logged once), so the names are
the plain ``agent/...`` ones (a ``timing_s/`` key would be summed over the cycle), and
the keys the aggregator would reduce wrongly by their name (``exit_reason/max_step_limit``
by max, ``samples`` by mean) get explicit rules: shares are averaged, samples summed.

Run it in place of verl's entry point, with the same Hydra config and overrides::

    python -m uniagent.verl.fully_async  ...   # instead of
    python -m verl.experimental.fully_async_policy.fully_async_main  ...

This module imports verl and Ray.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import hydra
import ray
from verl.experimental.fully_async_policy import fully_async_main as verl_main
from verl.experimental.fully_async_policy.fully_async_trainer import FullyAsyncTrainer
from verl.protocol import DataProto

from uniagent.exit import ExitReason
from uniagent.verl.metrics import PREFIX, batch_agent_metrics, place_token_scores

#: verl's Hydra config of the fully async trainer: the folder beside its main, as it uses.
CONFIG_PATH = str(Path(verl_main.__file__).parent / "config")
CONFIG_NAME = "fully_async_ppo_trainer"


def add_agent_rules(aggregator: Any) -> None:
    """Explicit ``MetricsAggregator`` rules for the agent metrics whose names mislead it."""
    rules = aggregator.aggregation_rules
    shares = [f"{PREFIX}/exit_reason/{reason.value}" for reason in ExitReason]
    for kind, names in (("avg", shares), ("sum", [f"{PREFIX}/samples"])):
        listed = rules.setdefault(kind, [])
        listed.extend(name for name in names if name not in listed)


_Trainer: Any = FullyAsyncTrainer.__ray_actor_class__  # the class under verl's @ray.remote
_TaskRunner: Any = verl_main.FullyAsyncTaskRunner.__ray_actor_class__


class AgentMetricsTrainer(_Trainer):
    """verl's ``FullyAsyncTrainer`` whose step metrics also hold the batch's agent metrics,
    and whose batches get each turn's credit (``reward.credit``) in ``rm_scores``."""

    def _collect_metrics_from_samples(self, batch: DataProto, metrics: dict[str, Any]) -> None:
        """The batch's turn scores into its ``rm_scores`` (the trainer's reward step reads
        them next: verl calls this as it takes the step's batch from the queue, before
        ``_fit_compute_reward``), then verl's metrics of the batch and its ``agent/...``."""
        place_token_scores(batch)
        super()._collect_metrics_from_samples(batch, metrics)
        add_agent_rules(self.metrics_aggregator)
        metrics.update(batch_agent_metrics(batch))


#: The Ray actor of :class:`AgentMetricsTrainer`, with verl's actor options.
UniAgentFullyAsyncTrainer = ray.remote(**FullyAsyncTrainer._default_options)(AgentMetricsTrainer)


class AgentMetricsTaskRunner(_TaskRunner):
    """verl's ``FullyAsyncTaskRunner`` that starts :data:`UniAgentFullyAsyncTrainer`."""

    def _create_trainer(self, config: Any) -> None:
        """verl's ``_create_trainer``, starting :data:`UniAgentFullyAsyncTrainer` instead.

        verl's method starts the trainer class its module names; that name is swapped for
        the call (in this task runner's own process), so the rest stays verl's code.
        """
        original = verl_main.FullyAsyncTrainer
        verl_main.FullyAsyncTrainer = UniAgentFullyAsyncTrainer
        try:
            super()._create_trainer(config)
        finally:
            verl_main.FullyAsyncTrainer = original


#: The Ray actor of :class:`AgentMetricsTaskRunner`, with verl's actor options.
UniAgentFullyAsyncTaskRunner = ray.remote(**verl_main.FullyAsyncTaskRunner._default_options)(
    AgentMetricsTaskRunner
)


def run(config: Any) -> None:
    """What verl's ``fully_async_main.main`` does with the composed config, our runner in."""
    from verl.experimental.reward_loop import migrate_legacy_reward_impl
    from verl.trainer.main_ppo import run_ppo
    from verl.utils.device import auto_set_device

    if not hasattr(config, "async_training"):
        raise RuntimeError("must set async_training config")
    auto_set_device(config)
    config.actor_rollout_ref.rollout.nnodes = config.rollout.nnodes
    config.actor_rollout_ref.rollout.n_gpus_per_node = config.rollout.n_gpus_per_node
    config = migrate_legacy_reward_impl(config)
    run_ppo(config, task_runner_class=UniAgentFullyAsyncTaskRunner)


@hydra.main(config_path=CONFIG_PATH, config_name=CONFIG_NAME, version_base=None)
def main(config: Any) -> None:
    """``python -m uniagent.verl.fully_async``: verl's fully async training, agent metrics on."""
    run(config)


if __name__ == "__main__":  # pragma: no cover
    main()
