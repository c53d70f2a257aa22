"""Trajectory filters: boolean keep-masks [B] the orchestrator applies before training.

They never change values; they only say which trajectories are worth a forward/backward pass.
"""

from __future__ import annotations

from torch import Tensor


def zero_advantage_filter(advantages: Tensor, mask: Tensor, atol: float = 0.0) -> Tensor:
    """advantages [B, T], mask [B, T] -> keep [B] bool: rows with some policy token whose |advantage| > atol.

    A row whose advantages are all 0 (e.g. a GRPO group of equal rewards) contributes no policy gradient,
    only compute; fully masked rows are dropped too. Note: dropping rows changes the loss denominators
    (fewer tokens/sequences), which is usually the intent (as in DAPO's dynamic sampling).
    """
    return ((advantages.abs() > atol) & (mask != 0)).any(-1)


def length_filter(lengths: Tensor, min_len: int = 0, max_len: int | None = None) -> Tensor:
    """lengths [B] -> keep [B] bool: min_len <= length <= max_len (max_len=None: no upper bound)."""
    keep = lengths >= min_len
    if max_len is not None:
        keep = keep & (lengths <= max_len)
    return keep
