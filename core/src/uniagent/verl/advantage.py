"""GRPO whose group statistics ignore masked samples, registered with verl's estimator registry.

A masked trajectory (``traj_masked``: an infrastructure failure, a cut prompt, a failed
adapter) reaches verl with an all-zero ``response_mask`` and reward 0.0. verl's ``grpo``
still counts that 0.0 in its group's mean and standard deviation, so a flaky sandbox
shifts the advantages of the group's other samples. :func:`compute_masked_grpo_advantage`
runs verl's own GRPO (``compute_grpo_outcome_advantage``) on the samples that have at
least one trained token and gives the others advantage 0: a masked sample leaves its
group exactly as if it were absent, and a group with only masked samples contributes
nothing.

verl hands an estimator only tensors (rewards, ``response_mask``, the group ``uid``s), in
both trainers (the classic ``compute_advantage`` and v1's TransferQueue path), so "masked"
is read from the mask itself: a sample with no token under mask 1 is trained on by no
estimator anyway. uniagent never gives a trained episode an all-zero mask (the model's
first reply always starts the response).

Registration: verl imports every ``verl.plugins`` entry point when ``verl`` is imported
(``VERL_USE_EXTERNAL_PLUGINS``, default ``auto``), in every process, driver included;
uniagent's distribution declares this module as one. Without entry points (e.g.
``VERL_USE_EXTERNAL_PLUGINS=none``), ``VERL_USE_EXTERNAL_MODULES=uniagent.verl.advantage``
does the same. Then set ``algorithm.adv_estimator=uniagent_grpo``.

``uniagent_tree`` (:func:`compute_tree_advantage`) is the estimator of tree rollouts under
``tree_advantage: tree`` (:mod:`uniagent.verl.tree_advantage`): the agent loop has put each
trained token's advantage in its token-level score, so the advantage of a token under mask
1 is its token-level reward, and 0 under mask 0.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from verl.trainer.ppo.core_algos import (
    ADV_ESTIMATOR_REGISTRY,
    compute_grpo_outcome_advantage,
    register_adv_est,
)

#: The name to give ``algorithm.adv_estimator``.
ESTIMATOR_NAME = "uniagent_grpo"
#: The estimator of ``tree_advantage: tree`` (tree rollouts' per-segment advantages).
TREE_ESTIMATOR_NAME = "uniagent_tree"


def trained_rows(response_mask: torch.Tensor) -> torch.Tensor:
    """A boolean per sample: does it have a token under mask 1 (is it trained on)?"""
    return response_mask.reshape(response_mask.shape[0], -1).sum(dim=-1) > 0


def compute_masked_grpo_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool | None = None,
    config: Any = None,
    **_: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """verl's GRPO over the trained samples only; masked samples get advantage 0.

    ``norm_adv_by_std_in_grpo`` defaults to the algorithm config's (verl passes only
    ``config`` to registered estimators), else True as in verl's ``grpo``.
    """
    if norm_adv_by_std_in_grpo is None:
        norm_adv_by_std_in_grpo = bool(_config_value(config, "norm_adv_by_std_in_grpo", True))
    keep = trained_rows(response_mask)
    advantages = torch.zeros_like(token_level_rewards)
    if bool(keep.any()):
        rows = torch.nonzero(keep, as_tuple=True)[0]
        subset, _ = compute_grpo_outcome_advantage(
            token_level_rewards=token_level_rewards[rows],
            response_mask=response_mask[rows],
            index=np.asarray(index, dtype=object)[rows.cpu().numpy()],
            epsilon=epsilon,
            norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo,
            config=config,
        )
        advantages[rows] = subset
    return advantages, advantages


def compute_tree_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray | None = None,
    config: Any = None,
    **_: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The advantage of each trained token is its token-level reward (0 under mask 0).

    For rows of a uniagent loop with ``tree_advantage: tree`` only: their token scores are
    the tree's per-segment advantages (:func:`uniagent.verl.tree_advantage.tree_token_scores`),
    the leaf's reward sitting on an untrained token. Under ``algorithm.use_kl_in_reward``
    each token's KL penalty is added to its advantage as it stands (no return is summed).
    No group statistics: the tree's own mean is each tree's baseline.
    """
    advantages = token_level_rewards * response_mask.to(token_level_rewards.dtype)
    return advantages, advantages


def _config_value(config: Any, key: str, default: Any) -> Any:
    if config is None:
        return default
    getter = getattr(config, "get", None)  # DictConfig and verl's dataclass configs have get
    value = getter(key, default) if callable(getter) else getattr(config, key, default)
    return default if value is None else value


def _register() -> None:
    """Register once; importing this module again (entry point and env var) is harmless."""
    for name, function in (
        (ESTIMATOR_NAME, compute_masked_grpo_advantage),
        (TREE_ESTIMATOR_NAME, compute_tree_advantage),
    ):
        current = ADV_ESTIMATOR_REGISTRY.get(name)
        if current is None:
            register_adv_est(name)(function)
        elif getattr(current, "__module__", None) != __name__:
            raise ValueError(
                f"verl advantage estimator {name!r} is already registered by "
                f"{current.__module__}.{current.__qualname__}, not by uniagent"
            )


_register()
