"""Policy-gradient losses on the trainer's flat token layout (`POLICY_LOSSES`).

Contract (docs/contracts.md): `POLICY_LOSSES[name](logprobs [N], old_logprobs [N], advantages [N], mask [N],
seq_ids [N], **opts) -> (per_token_loss [N], metrics)`. `logprobs` carries the gradient; `old_logprobs` are
the trainer's logprobs under the policy that sampled the batch (no gradient); `advantages` are per token.
`metrics` maps names to per-token tensors [N] (detached, 0 on masked tokens) that the trainer averages over
the mask. Loss and metrics are 0 on masked tokens. A loss names its options as parameters with defaults
(the field names of its member of `algorithm.policy_loss`, ascent/config/choices.py); the trainer hands it
those and no others (`options_for`).

The per-token loss then goes through a `LOSS_AGGREGATIONS` rule; a rollout-correction weight
(`ascent.algorithms.correction`) multiplies it first when enabled. Ratios are
`exp(clamp(logp - old, -20, 20))` so log-ratios of +-50 stay finite.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from ascent.algorithms.cov_losses import clip_cov_loss, kl_cov_loss
from ascent.algorithms.utils import (
    clamp_log_ratio,
    clean_masked,
    masked,
    ratio_metrics,
    safe_ratio,
    segment_mean_broadcast,
)

LossOutput = tuple[Tensor, dict[str, Tensor]]


def ppo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    seq_ids: Tensor,
    *,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    dual_clip_c: float | None = None,
) -> LossOutput:
    """PPO clipped surrogate (Schulman et al. 2017), asymmetric clip (DAPO "clip-higher", Yu et al. 2025),
    dual clip for negative advantages (Ye et al. 2020).

    r = exp(logp - old);  L = max(-A r, -A clip(r, 1 - clip_ratio_low, 1 + clip_ratio_high));
    with dual_clip_c = c > 1 and A < 0: L = min(L, -c A).  Shapes: all [N] -> loss [N].
    Metrics: clipfrac (token was clipped, either clip), approx_kl, ratio.
    """
    logprobs, old_logprobs, advantages = clean_masked(mask, logprobs, old_logprobs, advantages)
    log_ratio = logprobs - old_logprobs
    ratio = safe_ratio(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    loss = torch.maximum(unclipped, clipped)
    was_clipped = clipped > unclipped
    if dual_clip_c is not None:
        if dual_clip_c <= 1:
            raise ValueError(
                f"ppo_loss: dual_clip_c={dual_clip_c} must be > 1 (it caps the loss of negative advantages "
                "at -c * A, above the clipped loss only for c > 1); use 3.0 as in Ye et al. 2020, or None."
            )
        cap = -advantages * dual_clip_c
        dual = (advantages < 0) & (loss > cap)
        loss = torch.where(dual, cap, loss)
        was_clipped = was_clipped | dual
    return masked(loss, mask), ratio_metrics(log_ratio, ratio, was_clipped, mask)


def gspo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    seq_ids: Tensor,
    *,
    gspo_clip_low: float = 3e-4,
    gspo_clip_high: float = 4e-4,
) -> LossOutput:
    """GSPO, Group Sequence Policy Optimization (Zheng et al. 2025, Qwen).

    Sequence ratio s_i = exp(mean_{t in i, mask}(logp_t - old_t)), clipped per sequence with the small
    ranges [1 - gspo_clip_low, 1 + gspo_clip_high]. Token form with the paper's stop-gradient trick:
    s_{i,t} = sg(s_i) * exp(logp_t - sg(logp_t)), whose value is s_i and whose gradient is
    s_i * grad(logp_t), so grad J = E[s_i A_i mean_t grad logp_t] (under seq-mean-token-mean aggregation,
    as in the paper). L_t = max(-A s_{i,t}, -A clip(s_{i,t}, 1 - low, 1 + high)).  Shapes: [N] -> [N].
    Metrics: clipfrac (the sequence was clipped), approx_kl (token-level), ratio (the sequence ratio).
    """
    logprobs, old_logprobs, advantages = clean_masked(mask, logprobs, old_logprobs, advantages)
    log_ratio = logprobs - old_logprobs
    seq_log_ratio = clamp_log_ratio(segment_mean_broadcast(log_ratio, seq_ids, mask))
    log_s = seq_log_ratio.detach() + logprobs - logprobs.detach()
    ratio = torch.exp(log_s)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - gspo_clip_low, 1.0 + gspo_clip_high)
    loss = torch.maximum(unclipped, clipped)
    metrics = ratio_metrics(log_ratio, safe_ratio(log_ratio), clipped > unclipped, mask)
    metrics["ratio"] = masked(ratio.detach(), mask)
    return masked(loss, mask), metrics


def cispo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    seq_ids: Tensor,
    *,
    cispo_eps_low: float = 1.0,
    cispo_eps_high: float = 0.28,
) -> LossOutput:
    """CISPO, clipped importance-sampling-weight policy optimisation (MiniMax-M1, MiniMax 2025).

    L_t = -sg(clip(r_t, 1 - eps_low, 1 + eps_high)) * A_t * logp_t, r_t = exp(logp_t - old_t).
    The weight is clipped, never the gradient: every token keeps a REINFORCE-style gradient (unlike PPO, which
    drops clipped tokens). The default eps_low = 1 leaves no lower bound, as the paper does; eps_high is
    tuned per task (our default 0.28).  Shapes: [N] -> [N]. Metrics: clipfrac (weight clipped), approx_kl,
    ratio.
    """
    logprobs, old_logprobs, advantages = clean_masked(mask, logprobs, old_logprobs, advantages)
    log_ratio = logprobs - old_logprobs
    ratio = safe_ratio(log_ratio)
    weight = ratio.detach().clamp(1.0 - cispo_eps_low, 1.0 + cispo_eps_high)
    loss = -weight * advantages * logprobs
    was_clipped = weight != ratio.detach()
    return masked(loss, mask), ratio_metrics(log_ratio, ratio, was_clipped, mask)


def sapo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    seq_ids: Tensor,
    *,
    sapo_tau_pos: float = 1.0,
    sapo_tau_neg: float = 1.05,
) -> LossOutput:
    """SAPO, Soft Adaptive Policy Optimization (Gao et al. 2025, Qwen): a sigmoid gate instead of a hard clip.

    f(r) = (4 / tau) * sigmoid(tau * (r - 1)),  tau = sapo_tau_pos if A > 0 else sapo_tau_neg;
    L_t = -f(r_t) * A_t, r_t = exp(logp_t - old_t).  The gradient is
    grad L = -w(r) * A * r * grad logp with w(r) = 4 sigmoid(tau (r-1)) (1 - sigmoid(tau (r-1))): w(1) = 1
    (the plain policy gradient on-policy) and w decays smoothly as r leaves 1, faster for negative advantages
    (tau_neg > tau_pos). The loss value at r = 1 is -2A/tau (a constant offset, no gradient).
    Shapes: [N] -> [N]. Metrics: gate (w(r)), approx_kl, ratio; clipfrac counts tokens with w < 0.5.
    """
    logprobs, old_logprobs, advantages = clean_masked(mask, logprobs, old_logprobs, advantages)
    log_ratio = logprobs - old_logprobs
    ratio = safe_ratio(log_ratio)
    tau = torch.where(advantages > 0, sapo_tau_pos, sapo_tau_neg).to(ratio.dtype)
    gate = torch.sigmoid(tau * (ratio - 1.0))
    loss = -(4.0 / tau) * gate * advantages
    w = (4.0 * gate * (1.0 - gate)).detach()
    metrics = ratio_metrics(log_ratio, ratio, w < 0.5, mask)
    metrics["gate"] = masked(w, mask)
    return masked(loss, mask), metrics


def reinforce_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    seq_ids: Tensor,
) -> LossOutput:
    """REINFORCE (Williams 1992): L_t = -A_t * logp_t, no ratio and no clip (strictly on-policy).

    Shapes: [N] -> [N]. Metrics: approx_kl and ratio against old_logprobs (monitoring only), clipfrac = 0.
    """
    logprobs, old_logprobs, advantages = clean_masked(mask, logprobs, old_logprobs, advantages)
    log_ratio = logprobs - old_logprobs
    loss = -advantages * logprobs
    ratio = safe_ratio(log_ratio)
    return masked(loss, mask), ratio_metrics(log_ratio, ratio, torch.zeros_like(mask, dtype=torch.bool), mask)


def gmpo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    seq_ids: Tensor,
    *,
    gmpo_clip_low: float = 0.4,
    gmpo_clip_high: float = 0.4,
) -> LossOutput:
    """GMPO, Geometric-Mean Policy Optimization (Zhao et al. 2025): the geometric mean of the token ratios.

    Token log-ratios are clipped in log space on the side that would grow the objective (PPO's rule, per
    token): l_t = min(A l_t, A clip(l_t, -gmpo_clip_low, gmpo_clip_high)) / A  (0 where A = 0), with
    l_t = logp_t - old_t. s_i = exp(mean_{t in i} l_t) (the geometric mean of the clipped ratios) and
    A_i = the mean of sequence i's advantages (the paper's advantages are per sequence). Every token of i
    carries L_t = -A_i s_i, so seq-mean-token-mean gives the paper's mean_i(-A_i s_i) exactly (verl's
    `geo_mean`, which always takes that mean); other aggregations weigh the same per-sequence term by length.
    The paper's range is (e^-0.4, e^0.4): gmpo_clip_low = gmpo_clip_high = 0.4.  Shapes: [N] -> [N].
    Metrics: clipfrac (token log-ratio clipped), approx_kl (token-level), ratio (the sequence's s_i).
    """
    logprobs, old_logprobs, advantages = clean_masked(mask, logprobs, old_logprobs, advantages)
    log_ratio = logprobs - old_logprobs
    sign = torch.sign(advantages)
    clamped = log_ratio.clamp(-gmpo_clip_low, gmpo_clip_high)
    clipped_log_ratio = sign * torch.minimum(sign * log_ratio, sign * clamped)
    ratio = torch.exp(clamp_log_ratio(segment_mean_broadcast(clipped_log_ratio, seq_ids, mask)))
    seq_adv = segment_mean_broadcast(advantages, seq_ids, mask)
    loss = -seq_adv * ratio
    was_clipped = (clipped_log_ratio != log_ratio) & (advantages != 0)
    metrics = ratio_metrics(log_ratio, safe_ratio(log_ratio), was_clipped, mask)
    metrics["ratio"] = masked(ratio.detach(), mask)
    return masked(loss, mask), metrics


def dro_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    seq_ids: Tensor,
    *,
    dro_beta: float = 0.05,
) -> LossOutput:
    """DRO, Direct Reward Optimisation (Richemond et al. 2024; Kimi k1.5, 2025; Tinker's `dro` loss): a
    policy gradient held near the sampling policy by a quadratic penalty instead of a clip.

    L_t = -(A_t logp_t - dro_beta / 2 (logp_t - old_t)^2).  Off-policy (even offline) data is fine: the
    penalty, not a ratio, bounds the step. Tinker sums it over tokens (`loss_aggregation: token-sum`);
    dro_beta = 0.05 is the value Tinker's documentation shows.  Shapes: [N] -> [N]. Metrics: approx_kl,
    ratio (monitoring only), clipfrac = 0.
    """
    logprobs, old_logprobs, advantages = clean_masked(mask, logprobs, old_logprobs, advantages)
    log_ratio = logprobs - old_logprobs
    loss = -(advantages * logprobs - 0.5 * dro_beta * log_ratio**2)
    none = torch.zeros_like(mask, dtype=torch.bool)
    return masked(loss, mask), ratio_metrics(log_ratio, safe_ratio(log_ratio), none, mask)


POLICY_LOSSES: dict[str, Callable[..., LossOutput]] = {
    "ppo": ppo_loss,
    "gspo": gspo_loss,
    "cispo": cispo_loss,
    "sapo": sapo_loss,
    "reinforce": reinforce_loss,
    "gmpo": gmpo_loss,
    "dro": dro_loss,
    "clip_cov": clip_cov_loss,
    "kl_cov": kl_cov_loss,
}
