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
    penalty), baseline_rewards [B] (reward of the greedy response of the same prompt, for remax),
    turn_rewards [B, T] (multi-turn episodes: the rewards of turns before the last, each on the last token
    its turn sampled; already part of `rewards`, so token-level estimators move them there from the end),
    teacher_logprobs [B, T] and sampler_logprobs [B, T] (on-policy distillation: a frozen teacher's and the
    sampler's logprob of each sampled token), old_logprobs [B, T] and sum_pi_squared [B, T] (the optimal-token
    baseline: the trainer's logprob of each sampled token and Σ_v π_v² over the vocabulary, one forward)."""

    rewards: Tensor
    mask: Tensor
    group_ids: Tensor
    values: Tensor | None = None
    token_rewards: Tensor | None = None
    baseline_rewards: Tensor | None = None
    turn_rewards: Tensor | None = None
    teacher_logprobs: Tensor | None = None
    sampler_logprobs: Tensor | None = None
    old_logprobs: Tensor | None = None
    sum_pi_squared: Tensor | None = None

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
    """per_trajectory [B], mask [B, T] float -> [B, T]: the value on every unmasked token of its row, 0
    elsewhere."""
    return per_trajectory.unsqueeze(-1) * mask


def outcome_outputs(per_trajectory: Tensor, mask: Tensor) -> AdvantageOutputs:
    """Broadcast a per-trajectory advantage; returns = advantages (no critic uses them)."""
    adv = broadcast(per_trajectory, mask)
    return AdvantageOutputs(advantages=adv, returns=adv.clone())


def last_token_index(mask: Tensor) -> Tensor:
    """mask [B, T] -> [B]: index of each row's last unmasked token (0 for a fully masked row)."""
    t = torch.arange(1, mask.shape[-1] + 1, device=mask.device, dtype=torch.float32)
    return ((mask != 0).to(torch.float32) * t).argmax(-1)


def token_level_rewards(
    outcome: Tensor, mask: Tensor, token_rewards: Tensor | None, turn_rewards: Tensor | None = None
) -> Tensor:
    """outcome [B], mask [B, T] float, token_rewards [B, T] | None, turn_rewards [B, T] | None -> [B, T]:
    token_rewards on unmasked tokens, turn_rewards where they sit, and the rest of the outcome
    (outcome - the row's turn rewards) on each row's last unmasked token. Each row sums to its outcome plus
    its token rewards."""
    if token_rewards is None:
        out = torch.zeros_like(mask)
    else:
        out = torch.where(mask > 0, token_rewards.to(mask.dtype), torch.zeros_like(mask))
    outcome = outcome.to(mask.dtype)
    if turn_rewards is not None:
        turns = turn_rewards.to(mask.dtype) * mask
        out = out + turns
        outcome = outcome - turns.sum(-1)
    last = last_token_index(mask)
    rows = torch.arange(mask.shape[0], device=mask.device)
    out[rows, last] += outcome * mask[rows, last]
    return out


def turn_end_rewards(turn_rewards: list[float], loss_mask: list[int]) -> list[float] | None:
    """One episode: its turns' rewards and its response mask (runs of 1 are the model's turns, 0 the
    observations between them) -> a per-token list with reward k on the last token of turn k, except the
    last turn's (it stays with the outcome on the final token); None when the turns and runs do not pair up
    (a turn that sampled nothing) or no earlier turn was rewarded."""
    ends = [i for i, m in enumerate(loss_mask) if m and (i + 1 == len(loss_mask) or not loss_mask[i + 1])]
    if len(ends) < len(turn_rewards):
        return None
    out = [0.0] * len(loss_mask)
    for end, reward in zip(ends[: len(turn_rewards)], turn_rewards, strict=True):
        if end != ends[-1]:
            out[end] = float(reward)
    return out if any(out) else None
