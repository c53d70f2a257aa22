"""Advantage estimators (`ADVANTAGE_ESTIMATORS`): outcome rewards in, per-token advantages out.

Contract: `ADVANTAGE_ESTIMATORS[name](inp: AdvantageInputs, **opts) -> AdvantageOutputs` in the padded layout
(`advantages [B, T]`, `returns [B, T]`, both 0 where `mask` is 0). `opts` are the settings the estimator names
as keyword parameters (its member's fields of `algorithm.advantage`: gamma, lam, scale_by_std, ...; the shared
adv_eps), picked by `options_for`, no others.
The group estimators here (grpo, rloo, opo, gpg, grpo_passk, passk) compare the trajectories of one prompt and broadcast one number
per trajectory over its policy tokens; they ignore `token_rewards` (put the KL in the loss instead). The
token-level ones (gae, reinforce_pp, reinforce_pp_baseline, remax) live in `returns.py`, on-policy distillation
(a teacher's per-token logprobs as the signal) in `distill.py`, the optimal-token baseline (a per-token group
baseline weighted by the trainer's Σπ²) in `otb.py`.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from ascent.algorithms.advantage_types import AdvantageInputs, AdvantageOutputs, outcome_outputs
from ascent.algorithms.distill import distill
from ascent.algorithms.otb import optimal_token_baseline
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


def gpg(inp: AdvantageInputs, *, gpg_alpha: bool = True) -> AdvantageOutputs:
    """GPG, Group Policy Gradient (Chu et al. 2025): A_i = alpha * (r_i - mean_g), no std (F_norm = 1).

    alpha = B / (B - M) rescales the batch's gradient to its valid trajectories: M counts the trajectories
    whose group has no reward spread (a group of one, or equal rewards), whose advantage is 0 (gpg_alpha=False:
    alpha = 1). Pair it with policy_loss=reinforce (the paper's plain -A log p) and token-mean, as the paper
    does. verl's `gpg` counts nonzero rewards instead of valid trajectories for alpha, and gives a group of one
    A = alpha r_i; the two agree when every group has a spread and every reward is nonzero or 0/1 with B - M
    nonzero rewards.
    """
    rewards = inp.float_rewards()
    mean, std, size = group_stats(rewards, inp.group_ids)
    valid = (size > 1) & (std > 0)
    adv = torch.where(valid, rewards - mean, torch.zeros_like(rewards))
    if gpg_alpha:
        adv = adv * rewards.numel() / valid.sum().clamp(min=1)
    return outcome_outputs(adv, inp.float_mask())


def grpo_passk(inp: AdvantageInputs, *, scale_by_std: bool = True, adv_eps: float = 1e-6) -> AdvantageOutputs:
    """Pass@k as a best-of-group objective (Tang et al. 2025, "Optimizing language models for inference time
    objectives"; verl's `grpo_passk`): only the group's best trajectory learns.

    A_best = r_max - r_second (the gain of the max over the group without it), over (std_g + eps) with
    scale_by_std; every other trajectory gets 0. With several best, one of them (torch.topk's pick) gets 0.
    A group of one gets 0 (verl refuses it).
    """
    rewards = inp.float_rewards()
    _mean, std, _size = group_stats(rewards, inp.group_ids)
    idx, g = group_index(inp.group_ids)
    adv = torch.zeros_like(rewards)
    for k in range(g):
        members = (idx == k).nonzero().squeeze(-1)
        if members.numel() < 2:
            continue
        top, pos = torch.topk(rewards[members], 2)
        best = members[pos[0]]
        gain = top[0] - top[1]
        adv[best] = gain / (std[best] + adv_eps) if scale_by_std else gain
    return outcome_outputs(adv, inp.float_mask())


def passk(inp: AdvantageInputs, *, pass_k: int = 4, adv_eps: float = 1e-6) -> AdvantageOutputs:
    """Pass@k training with the analytical advantage (Chen et al. 2025, "Pass@k Training for Adaptively
    Balancing Exploration and Exploitation"): the group advantage of pass@k over all k-subsets of the group.

    Binary rewards (a trajectory is correct when its reward is > 0). A group of n with n_neg wrong:
    R = 1 - C(n_neg, k) / C(n, k) (the group's pass@k), sigma = sqrt(R (1 - R));
    correct: A = (1 - R) / (sigma + eps);  wrong: A = (1 - R - C(n_neg - 1, k - 1) / C(n - 1, k - 1)) /
    (sigma + eps).  k = pass_k, capped at the group's size (the paper's k <= n); k = 1 is GRPO on 0/1 rewards
    (with the biased std). A group that always or never passes gets 0.
    """
    correct = inp.float_rewards() > 0
    idx, g = group_index(inp.group_ids)
    adv = torch.zeros(correct.shape, dtype=torch.float32, device=correct.device)
    for j in range(g):
        members = (idx == j).nonzero().squeeze(-1)
        pos, neg = _passk_group(int(members.numel()), int((~correct[members]).sum()), pass_k, adv_eps)
        adv[members] = torch.where(correct[members], pos, neg)
    return outcome_outputs(adv, inp.float_mask())


def _passk_group(n: int, n_neg: int, k: int, eps: float) -> tuple[float, float]:
    """(advantage of a correct, of a wrong trajectory) in a group of n with n_neg wrong (Chen et al. 2025)."""
    k = min(k, n)
    r = 1.0 - math.comb(n_neg, k) / math.comb(n, k)
    sigma = math.sqrt(max(r * (1.0 - r), 0.0))
    if sigma == 0.0:
        return 0.0, 0.0
    miss = math.comb(n_neg - 1, k - 1) / math.comb(n - 1, k - 1) if n_neg > 0 else 0.0
    return (1.0 - r) / (sigma + eps), (1.0 - r - miss) / (sigma + eps)


ADVANTAGE_ESTIMATORS: dict[str, Callable[..., AdvantageOutputs]] = {
    "grpo": grpo,
    "rloo": rloo,
    "opo": opo,
    "gpg": gpg,
    "grpo_passk": grpo_passk,
    "passk": passk,
    "reinforce_pp": reinforce_pp,
    "reinforce_pp_baseline": reinforce_pp_baseline,
    "remax": remax,
    "gae": gae,
    "distill": distill,
    "optimal_token_baseline": optimal_token_baseline,
}

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "AdvantageInputs",
    "AdvantageOutputs",
    "gpg",
    "grpo",
    "grpo_passk",
    "opo",
    "passk",
    "rloo",
]
