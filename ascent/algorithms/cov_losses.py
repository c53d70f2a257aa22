"""Clip-Cov and KL-Cov (Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning
Language Models"): PPO-style losses that hold back the few tokens whose covariance between advantage and
log-probability drives the policy's entropy down, so entropy does not collapse.

Both follow the `POLICY_LOSSES` contract (ascent/algorithms/policy_losses.py) on the trainer's flat layout,
and take the covariance over the micro-batch's policy tokens: cov_t = (A_t - mean A) (logp_t - mean logp),
the means over the unmasked tokens (as verl does per micro-batch).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ascent.algorithms.utils import clean_masked, masked, masked_mean, ratio_metrics, safe_ratio

LossOutput = tuple[Tensor, dict[str, Tensor]]


def token_covariance(advantages: Tensor, logprobs: Tensor, mask: Tensor) -> Tensor:
    """advantages [N], logprobs [N], mask [N] -> cov [N] (detached): (A_t - mean A)(logp_t - mean logp) over
    the unmasked tokens; 0 on masked ones."""
    a, lp = advantages.detach(), logprobs.detach()
    return masked((a - masked_mean(a, mask)) * (lp - masked_mean(lp, mask)), mask)


def clip_cov_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    seq_ids: Tensor,
    *,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_cov_ratio: float = 2e-4,
    clip_cov_lb: float = 1.0,
    clip_cov_ub: float = 5.0,
) -> LossOutput:
    """Clip-Cov: the PPO clipped loss, with the gradient of a few high-covariance tokens cut.

    Among the unmasked tokens PPO did not clip and whose covariance lies in (clip_cov_lb, clip_cov_ub),
    max(1, int(clip_cov_ratio * tokens)) are picked at random (torch's generator, so the run's seed fixes
    them) and their loss is set to 0 (no gradient). The paper's settings: clip_cov_ratio = 2e-4,
    bounds (1, 5), PPO's clip 0.2.  Shapes: [N] -> [N].
    Metrics: clipfrac (PPO clip or covariance cut), cov_clipfrac (covariance cut only), approx_kl, ratio.
    """
    logprobs, old_logprobs, advantages = clean_masked(mask, logprobs, old_logprobs, advantages)
    log_ratio = logprobs - old_logprobs
    ratio = safe_ratio(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    ppo_clipped = (clipped > unclipped) & mask.bool()
    cov = token_covariance(advantages, logprobs, mask)
    band = mask.bool() & ~ppo_clipped & (cov > clip_cov_lb) & (cov < clip_cov_ub)
    candidates = band.nonzero().squeeze(-1)
    count = max(int(clip_cov_ratio * float(mask.to(torch.float32).sum())), 1)
    if candidates.numel() > count:
        candidates = candidates[torch.randperm(candidates.numel(), device=candidates.device)[:count]]
    cut = torch.zeros_like(band)
    cut[candidates] = True
    loss = torch.where(cut, torch.zeros_like(unclipped), torch.maximum(unclipped, clipped))
    metrics = ratio_metrics(log_ratio, ratio, ppo_clipped | cut, mask)
    metrics["cov_clipfrac"] = masked(cut.to(ratio.dtype), mask)
    return masked(loss, mask), metrics


def kl_cov_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    seq_ids: Tensor,
    *,
    kl_cov_ratio: float = 2e-3,
    kl_cov_coef: float = 1.0,
) -> LossOutput:
    """KL-Cov: the unclipped surrogate -A r, plus a KL penalty on the highest-covariance tokens only.

    The max(1, int(kl_cov_ratio * tokens)) unmasked tokens with the largest covariance get
    L_t = -A_t r_t + kl_cov_coef |logp_t - old_t|; every other token L_t = -A_t r_t (no clip).
    The paper's settings: kl_cov_ratio = 2e-3 for Qwen2.5-7B (2e-4 for 32B), kl_cov_coef = 1.
    Shapes: [N] -> [N]. Metrics: clipfrac (the token was penalised), approx_kl, ratio.
    """
    logprobs, old_logprobs, advantages = clean_masked(mask, logprobs, old_logprobs, advantages)
    log_ratio = logprobs - old_logprobs
    ratio = safe_ratio(log_ratio)
    valid = mask.bool().nonzero().squeeze(-1)
    penalised = torch.zeros_like(mask, dtype=torch.bool)
    if valid.numel():
        cov = token_covariance(advantages, logprobs, mask)[valid]
        count = max(1, int(valid.numel() * kl_cov_ratio))
        penalised[valid[torch.topk(cov, count).indices]] = True
    loss = -advantages * ratio + torch.where(penalised, kl_cov_coef * log_ratio.abs(), 0.0)
    return masked(loss, mask), ratio_metrics(log_ratio, ratio, penalised, mask)
