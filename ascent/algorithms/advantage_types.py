"""The advantage estimators' input and output records and the helpers that broadcast outcomes to tokens.

Advantages run on the controller in the padded layout: row b is trajectory b, column t its t-th response
token, `mask [B, T]` is 1 for tokens the policy produced and 0 for padding and for tool/environment tokens
spliced into a multi-turn response. Outputs are 0 wherever the mask is 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class AdvantageInputs:
    """rewards [B] (outcome reward per trajectory), mask [B, T], group_ids [B] (trajectories of one prompt
    share an id), values [B, T] (critic, for gae), token_rewards [B, T] (per-token rewards such as the KL
    penalty), baseline_rewards [B] (reward of the greedy response of the same prompt, for remax)."""

    rewards: Tensor
    mask: Tensor
    group_ids: Tensor
    values: Tensor | None = None
    token_rewards: Tensor | None = None
    baseline_rewards: Tensor | None = None

    def float_mask(self) -> Tensor:
        """mask as float32 (0/1)."""
        return (self.mask != 0).to(torch.float32)

    def float_rewards(self) -> Tensor:
        """rewards as float32 [B]."""
        return self.rewards.to(torch.float32)


@dataclass
class AdvantageOutputs:
    """advantages [B, T] (what the policy loss multiplies) and returns [B, T] (the critic's regression target;
    equal to the advantages for critic-free estimators). Both 0 on masked positions."""

    advantages: Tensor
    returns: Tensor


def broadcast(per_trajectory: Tensor, mask: Tensor) -> Tensor:
    """per_trajectory [B], mask [B, T] float -> [B, T]: the value on every unmasked token of its row, 0 elsewhere."""
    return per_trajectory.unsqueeze(-1) * mask


def outcome_outputs(per_trajectory: Tensor, mask: Tensor) -> AdvantageOutputs:
    """Broadcast a per-trajectory advantage; returns = advantages (no critic uses them)."""
    adv = broadcast(per_trajectory, mask)
    return AdvantageOutputs(advantages=adv, returns=adv.clone())


def last_token_index(mask: Tensor) -> Tensor:
    """mask [B, T] -> [B]: index of each row's last unmasked token (0 for a fully masked row)."""
    t = torch.arange(1, mask.shape[-1] + 1, device=mask.device, dtype=torch.float32)
    return ((mask != 0).to(torch.float32) * t).argmax(-1)


def token_level_rewards(outcome: Tensor, mask: Tensor, token_rewards: Tensor | None) -> Tensor:
    """outcome [B], mask [B, T] float, token_rewards [B, T] | None -> [B, T]:
    token_rewards on unmasked tokens plus the outcome reward on each row's last unmasked token."""
    if token_rewards is None:
        out = torch.zeros_like(mask)
    else:
        out = torch.where(mask > 0, token_rewards.to(mask.dtype), torch.zeros_like(mask))
    last = last_token_index(mask)
    rows = torch.arange(mask.shape[0], device=mask.device)
    out[rows, last] += outcome.to(mask.dtype) * mask[rows, last]
    return out
