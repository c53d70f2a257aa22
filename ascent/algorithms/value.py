"""The critic's loss (PPO with a value model, used with the `gae` estimator).

`value_loss(values [N], old_values [N], returns [N], clip_range) -> per-token loss [N]`; it does not look at
the mask: the trainer aggregates it with a `LOSS_AGGREGATIONS` rule like the policy loss.
"""

from __future__ import annotations

import torch
from torch import Tensor


def value_loss(values: Tensor, old_values: Tensor, returns: Tensor, clip_range: float | None = 0.2) -> Tensor:
    """values [N] (with grad), old_values [N] (critic at rollout time), returns [N] -> loss [N].

    Clipped value loss of PPO (Schulman et al. 2017; OpenAI baselines):
    v_clip = old + clip(v - old, -c, c);  L = 0.5 * max((v - R)^2, (v_clip - R)^2).
    clip_range=None gives the plain 0.5 * (v - R)^2.
    """
    unclipped = (values - returns) ** 2
    if clip_range is None:
        return 0.5 * unclipped
    v_clip = old_values + (values - old_values).clamp(-clip_range, clip_range)
    return 0.5 * torch.maximum(unclipped, (v_clip - returns) ** 2)


def value_clipfrac(values: Tensor, old_values: Tensor, returns: Tensor, clip_range: float | None) -> Tensor:
    """[N] -> [N] 0/1 (detached): where the clipped branch of value_loss is the larger one (a metric)."""
    if clip_range is None:
        return torch.zeros_like(values).detach()
    v_clip = old_values + (values - old_values).clamp(-clip_range, clip_range)
    return ((v_clip - returns) ** 2 > (values - returns) ** 2).to(values.dtype).detach()
