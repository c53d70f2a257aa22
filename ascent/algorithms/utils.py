"""Masked and segmented reductions shared by the estimators and losses (pure torch, no state).

Two layouts meet here: the controller's padded layout (`[B, T]` with a 0/1 mask) and the trainer's flat
"packed" layout (`[N]` tokens with `seq_ids [N]` numbering sequences 0..S-1). Every helper is safe on empty
or fully masked input: denominators are clamped to at least 1 (or `eps`) and masked entries are selected
away with `torch.where`, so a NaN or inf sitting in a masked slot never leaks into a result.
"""

from __future__ import annotations

import torch
from torch import Tensor

LOG_RATIO_CLAMP = 20.0
"""Log-ratios are clamped to [-20, 20] before `exp` (e^20 ~ 4.9e8 stays finite in fp32 and its square too)."""


def masked(x: Tensor, mask: Tensor) -> Tensor:
    """x [*], mask [*] -> x where mask is nonzero, else 0 (also zeroes NaN/inf in masked slots)."""
    return torch.where(mask.bool(), x, torch.zeros((), dtype=x.dtype, device=x.device))


def safe_div(num: Tensor, den: Tensor) -> Tensor:
    """num / den elementwise, 0 where den == 0 (e.g. a zero std with eps = 0)."""
    ok = den != 0
    return torch.where(ok, num / torch.where(ok, den, torch.ones_like(den)), torch.zeros_like(num))


def masked_sum(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """x [*], mask [*] -> sum of x over the unmasked entries (over `dim`, or everything)."""
    m = masked(x, mask)
    return m.sum() if dim is None else m.sum(dim)


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """x [*], mask [*] -> sum(x * mask) / max(sum(mask), 1); 0 where nothing is unmasked."""
    count = mask.to(x.dtype).sum() if dim is None else mask.to(x.dtype).sum(dim)
    return masked_sum(x, mask, dim) / count.clamp(min=1.0)


def masked_whiten(x: Tensor, mask: Tensor, eps: float = 1e-6, shift_mean: bool = True) -> Tensor:
    """x [*], mask [*] -> (x - mean) / (std + eps) over the unmasked entries, 0 on masked ones.

    The std is the unbiased one (n - 1), taken as 0 when fewer than two entries are unmasked.
    shift_mean=False adds the mean back after scaling, (x - mean) / (std + eps) + mean: the spread is
    normalised but the sign and level of x stay (TRL's reward whitening, verl's `masked_whiten`).
    """
    n = mask.to(x.dtype).sum()
    mean = masked_mean(x, mask)
    var = masked_sum((x - mean) ** 2, mask) / (n - 1).clamp(min=1.0)
    out = safe_div(x - mean, var.sqrt() + eps)
    return masked(out if shift_mean else out + mean, mask)


def clamp_log_ratio(log_ratio: Tensor, limit: float = LOG_RATIO_CLAMP) -> Tensor:
    """log_ratio [*] -> log_ratio clamped to [-limit, limit] (so `exp` of it is finite)."""
    return log_ratio.clamp(min=-limit, max=limit)


def safe_ratio(log_ratio: Tensor, limit: float = LOG_RATIO_CLAMP) -> Tensor:
    """log_ratio [*] -> exp(clamp(log_ratio, -limit, limit))."""
    return torch.exp(clamp_log_ratio(log_ratio, limit))


def num_segments(seq_ids: Tensor) -> int:
    """seq_ids [N] -> S = max(seq_ids) + 1 (0 for an empty tensor)."""
    return int(seq_ids.max().item()) + 1 if seq_ids.numel() else 0


def segment_sum(x: Tensor, seq_ids: Tensor, mask: Tensor, size: int | None = None) -> Tensor:
    """x [N], seq_ids [N], mask [N] -> [S]: per-sequence sum of x over unmasked tokens (differentiable).

    Masked tokens add 0 to sequence 0, so padding may carry any id (even -1).
    """
    ids = torch.where(mask.bool(), seq_ids, torch.zeros_like(seq_ids)).long()
    size = num_segments(ids) if size is None else size
    out = torch.zeros(size, dtype=x.dtype, device=x.device)
    return out.index_add(0, ids, masked(x, mask))


def segment_mean_broadcast(x: Tensor, seq_ids: Tensor, mask: Tensor) -> Tensor:
    """x [N], seq_ids [N], mask [N] -> [N]: each token gets its sequence's mean of x over unmasked tokens."""
    ids = torch.where(mask.bool(), seq_ids, torch.zeros_like(seq_ids)).long()
    size = num_segments(ids)
    sums = segment_sum(x, ids, mask, size)
    counts = segment_sum(torch.ones_like(x), ids, mask, size)
    return (sums / counts.clamp(min=1.0))[ids]


def group_index(group_ids: Tensor) -> tuple[Tensor, int]:
    """group_ids [B] (any integers) -> (index [B] in 0..G-1, G)."""
    uniq, inverse = torch.unique(group_ids, return_inverse=True)
    return inverse, int(uniq.numel())


def group_stats(values: Tensor, group_ids: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """values [B], group_ids [B] -> (mean [B], unbiased std [B], size [B]) of each element's group.

    A group of one has std 0 (not NaN).
    """
    idx, g = group_index(group_ids)
    zeros = torch.zeros(g, dtype=values.dtype, device=values.device)
    size = zeros.index_add(0, idx, torch.ones_like(values))
    mean = zeros.index_add(0, idx, values) / size.clamp(min=1.0)
    sq = zeros.index_add(0, idx, (values - mean[idx]) ** 2)
    std = (sq / (size - 1).clamp(min=1.0)).sqrt()
    return mean[idx], std[idx], size[idx]


def clean_masked(mask: Tensor, *xs: Tensor) -> tuple[Tensor, ...]:
    """Each x [N] zeroed on masked tokens first, so garbage there (NaN, inf) cannot reach a loss's values or
    gradients."""
    return tuple(masked(x, mask) for x in xs)


def ratio_metrics(log_ratio: Tensor, ratio: Tensor, clipped: Tensor, mask: Tensor) -> dict[str, Tensor]:
    """A policy loss's detached per-token diagnostics [N]: clipfrac (0/1), approx_kl = r - 1 - log r (k3 of
    KL(old||new)), ratio."""
    lr = clamp_log_ratio(log_ratio.detach())
    r = ratio.detach()
    return {
        "clipfrac": masked(clipped.to(r.dtype), mask),
        "approx_kl": masked(r - 1.0 - lr, mask),
        "ratio": masked(r, mask),
    }
