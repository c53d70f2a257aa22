"""Advantage estimators (`ADVANTAGE_ESTIMATORS`): outcome rewards in, per-token advantages out.

Contract: `ADVANTAGE_ESTIMATORS[name](inp: AdvantageInputs, **opts) -> AdvantageOutputs` in the padded layout
(`advantages [B, T]`, `returns [B, T]`, both 0 where `mask` is 0). `opts` are the settings the estimator names
as keyword parameters (its member's fields of `algorithm.advantage`: gamma, lam, scale_by_std, ...; the shared
adv_eps), picked by `options_for`, no others.
The group estimators here (grpo, rloo, opo) compare the trajectories of one prompt and broadcast one number
per trajectory over its policy tokens; they ignore `token_rewards` (put the KL in the loss instead). The
token-level ones (gae, reinforce_pp, reinforce_pp_baseline, remax) live in `returns.py`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ascent.algorithms.advantage_types import AdvantageInputs, AdvantageOutputs, outcome_outputs
from ascent.algorithms.returns import gae, reinforce_pp, reinforce_pp_baseline, remax
from ascent.algorithms.utils import group_index, group_stats, safe_div


def grpo(
    inp: AdvantageInputs,
    *,
    scale_by_std: bool = True,
    std_over_batch: bool = False,
    adv_eps: float = 1e-6,
) -> AdvantageOutputs:
    """GRPO (Shao et al. 2024, DeepSeekMath): A_i = (r_i - mean_g) / (std_g + eps) on every policy token.

    mean_g and std_g (unbiased) are over trajectory i's group. scale_by_std=False drops the division
    (Dr. GRPO, Liu et al. 2025); std_over_batch=True divides by the std of all rewards in the batch instead
    (as in Hu et al. 2025). A group of one, or a group of equal rewards, gets advantage 0.
    """
    rewards = inp.float_rewards()
    mean, std, _size = group_stats(rewards, inp.group_ids)
    adv = rewards - mean
    if scale_by_std:
        if std_over_batch:
            std = rewards.std() if rewards.numel() > 1 else rewards.new_zeros(())
        adv = safe_div(adv, std + adv_eps)
    return outcome_outputs(adv, inp.float_mask())


def rloo(inp: AdvantageInputs) -> AdvantageOutputs:
    """RLOO, REINFORCE leave-one-out (Kool et al. 2019; Ahmadian et al. 2024).

    A_i = r_i - (sum_{j in g, j != i} r_j) / (n_g - 1) = n_g / (n_g - 1) * (r_i - mean_g); 0 for a group of
    one.
    """
    rewards = inp.float_rewards()
    mean, _std, size = group_stats(rewards, inp.group_ids)
    adv = torch.where(
        size > 1, (rewards - mean) * size / (size - 1).clamp(min=1.0), torch.zeros_like(rewards)
    )
    return outcome_outputs(adv, inp.float_mask())


def opo(inp: AdvantageInputs) -> AdvantageOutputs:
    """OPO, On-Policy RL with Optimal reward baseline (Hao et al. 2025): a length-weighted group baseline.

    b_g = sum_{i in g} len_i r_i / sum_{i in g} len_i, len_i = policy tokens of i;  A_i = r_i - b_g.
    A group whose trajectories have no policy tokens falls back to b_g = 0 (its advantages are masked anyway).
    """
    rewards = inp.float_rewards()
    mask = inp.float_mask()
    lengths = mask.sum(-1)
    idx, g = group_index(inp.group_ids)
    zeros = torch.zeros(g, dtype=rewards.dtype, device=rewards.device)
    num = zeros.index_add(0, idx, lengths * rewards)
    den = zeros.index_add(0, idx, lengths)
    baseline = (num / den.clamp(min=1.0))[idx]
    return outcome_outputs(rewards - baseline, mask)


ADVANTAGE_ESTIMATORS: dict[str, Callable[..., AdvantageOutputs]] = {
    "grpo": grpo,
    "rloo": rloo,
    "opo": opo,
    "reinforce_pp": reinforce_pp,
    "reinforce_pp_baseline": reinforce_pp_baseline,
    "remax": remax,
    "gae": gae,
}

__all__ = ["ADVANTAGE_ESTIMATORS", "AdvantageInputs", "AdvantageOutputs", "grpo", "opo", "rloo"]
