"""The verl adapter: run uniagent episodes inside verl's agent loop for RL training.

Register the loop in verl's agent-loop YAML
(``actor_rollout_ref.rollout.agent.agent_loop_config_path``)::

    - name: uniagent
      _target_: uniagent.verl.agent_loop.UniAgentLoop
      agent_config: agent.yaml

Importing this package does not import verl (an optional extra:
``pip install 'uniagent[verl]'``); ``UniAgentLoop`` is loaded on first access. The other
verl-facing parts are modules of their own, named in the recipes:

- ``uniagent.verl.advantage``: the ``uniagent_grpo`` advantage estimator (GRPO whose group
  statistics ignore masked samples) and ``uniagent_tree`` (tree rollouts' per-segment
  advantages, ``tree_advantage: tree``: :mod:`uniagent.verl.tree_advantage`), registered
  through verl's ``verl.plugins`` entry point;
- ``uniagent.verl.metrics`` / ``uniagent.verl.replay_buffer`` / ``uniagent.verl.fully_async``:
  ``agent/...`` metrics in verl's per-step metrics (classic, v1 and fully async trainers;
  the last is an entry point, ``python -m uniagent.verl.fully_async``);
- ``uniagent.verl.dumps``: episode dumps (``trajectory_dir``) in ``uniagent run``'s layout.

See ``docs/training.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from uniagent.verl.output import (
    EXTRA_FIELD_KEYS,
    UNIAGENT_FIELDS,
    UNIAGENT_KEY,
    LoopFields,
    episode_fields,
    extras_record,
    placeholder_fields,
)
from uniagent.verl.settings import (
    LoopSettings,
    row_messages,
    row_overrides,
    row_task,
)

if TYPE_CHECKING:  # pragma: no cover
    from uniagent.verl.agent_loop import UniAgentLoop

__all__ = [
    "EXTRA_FIELD_KEYS",
    "UNIAGENT_FIELDS",
    "UNIAGENT_KEY",
    "LoopFields",
    "LoopSettings",
    "UniAgentLoop",
    "episode_fields",
    "extras_record",
    "placeholder_fields",
    "row_messages",
    "row_overrides",
    "row_task",
]


def __getattr__(name: str) -> Any:
    """Load ``UniAgentLoop`` (and with it verl) only when it is asked for."""
    if name == "UniAgentLoop":
        from uniagent.verl.agent_loop import UniAgentLoop

        return UniAgentLoop
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
