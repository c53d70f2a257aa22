"""Rollout correction: importance weights for the gap between the sampler and the trainer.

The rollout engine (vLLM-like kernels, bf16, other batch shapes) and the trainer compute slightly different
probabilities for the same weights, and in async mode the sampler may even run an older policy. The policy
loss uses the trainer's `old_logprobs`; the tokens were drawn from the sampler's distribution. The ratio
w = pi_old_trainer / pi_sampler = exp(old_logprobs - sampler_logprobs) corrects for this (Yao et al. 2025,
"Your efficient RL framework secretly brings you off-policy RL training": truncated IS, "TIS"; masked IS,
"MIS", drops the outliers instead of capping them).

How the trainer uses it: compute `weights, metrics = rollout_correction_weights(...)` once per micro-batch
(no gradient), then `per_token_loss = per_token_loss * weights` before `LOSS_AGGREGATIONS[...]`, keeping the
aggregation's denominators unchanged (MIS-masked tokens still count in `total_tokens`, so the weighting is a
pure per-token reweighting). Log the metrics.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from ascent.algorithms.utils import LOG_RATIO_CLAMP, masked, masked_mean, segment_mean_broadcast, segment_sum


def _log_weights(log_w: Tensor, mask: Tensor, seq_ids: Tensor, level: str) -> Tensor:
    """Per-token log weights [N] at the chosen level (token, sequence = sum, geometric = mean over the
    sequence)."""
    if level == "token":
        return log_w
    if level == "sequence":
        ids = torch.where(mask.bool(), seq_ids, torch.zeros_like(seq_ids)).long()
        return segment_sum(log_w, ids, mask)[ids]
    if level == "geometric":
        return segment_mean_broadcast(log_w, seq_ids, mask)
    raise ValueError(f"rollout_correction_level={level!r}: use token, sequence or geometric.")


def rollout_correction_weights(
    old_logprobs: Tensor,
    sampler_logprobs: Tensor,
    mask: Tensor,
    seq_ids: Tensor,
    *,
    mode: Literal["tis", "mis"] = "tis",
    level: Literal["token", "sequence", "geometric"] = "token",
    threshold: float = 2.0,
    threshold_low: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """old_logprobs [N], sampler_logprobs [N], mask [N], seq_ids [N] -> (weights [N] detached, metrics).

    log w_t = old_t - sampler_t; level "token" uses w_t, "sequence" the product over the sequence
    w_i = exp(sum_t log w_t) on each of its tokens, "geometric" exp(mean_t log w_t). Log weights are clamped
    to +-20 before exp.
    mode "tis": weights = min(w, threshold) (truncated IS).
    mode "mis": weights = w where threshold_low <= w <= threshold, else 0 (masked IS; threshold_low=None
    means no lower bound). Weights are 0 on masked tokens.
    Metrics (scalars over unmasked tokens): rollout_is_weight_mean (before truncation/masking),
    rollout_is_clipped_frac (tis) or rollout_is_masked_frac (mis), rollout_is_log_weight_abs_max.
    """
    log_w = masked((old_logprobs - sampler_logprobs).detach().float(), mask)
    log_w = _log_weights(log_w, mask, seq_ids, level).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    w = torch.exp(log_w)
    if mode == "tis":
        out_of_range = w > threshold
        weights = w.clamp(max=threshold)
        frac_key = "rollout_is_clipped_frac"
    elif mode == "mis":
        out_of_range = w > threshold
        if threshold_low is not None:
            out_of_range = out_of_range | (w < threshold_low)
        weights = torch.where(out_of_range, torch.zeros_like(w), w)
        frac_key = "rollout_is_masked_frac"
    else:
        raise ValueError(f"rollout_correction={mode!r}: use tis or mis (or none to skip the correction).")
    metrics = {
        "rollout_is_weight_mean": masked_mean(w, mask),
        frac_key: masked_mean(out_of_range.float(), mask),
        "rollout_is_log_weight_abs_max": masked(log_w.abs(), mask).max() if log_w.numel() else log_w.sum(),
    }
    return masked(weights, mask), metrics
