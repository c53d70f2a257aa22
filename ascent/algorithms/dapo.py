"""The pure pieces of DAPO (Yu et al. 2025, "DAPO: An Open-Source LLM RL System at Scale").

Dynamic sampling keeps only groups whose rewards differ (`filter_groups_with_variance`); the orchestrator
re-samples until a batch is full. Overlong reward shaping (`overlong_penalty`) punishes responses that run
into the last `buffer` tokens of the budget; overlong filtering (`truncation_mask`) drops truncated responses
from the loss instead. Token-level loss (`token-mean`) and clip-higher (`clip_ratio_high`) live elsewhere.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ascent.algorithms.utils import group_index


def filter_groups_with_variance(rewards: Tensor, group_ids: Tensor, atol: float = 1e-6) -> Tensor:
    """rewards [B], group_ids [B] -> keep [B] bool: True for trajectories whose group's rewards are not all
    equal (max - min > atol). A group of one is dropped (it has no variance)."""
    idx, g = group_index(group_ids)
    r = rewards.to(torch.float64)
    hi = torch.full((g,), -torch.inf, dtype=r.dtype, device=r.device).scatter_reduce(0, idx, r, "amax")
    lo = torch.full((g,), torch.inf, dtype=r.dtype, device=r.device).scatter_reduce(0, idx, r, "amin")
    return ((hi - lo) > atol)[idx]


def overlong_penalty(lengths: Tensor, max_len: int, buffer: int, penalty_factor: float = 1.0) -> Tensor:
    """lengths [B] (response tokens) -> penalty [B] <= 0 to add to the reward (DAPO soft overlong punishment).

    With L_exp = max_len - buffer: 0 if len <= L_exp; -(len - L_exp) / buffer * penalty_factor inside the
    buffer; -penalty_factor at len >= max_len. buffer = 0 gives a step at max_len (only over-long is hit).
    """
    expected = max_len - buffer
    over = (lengths.to(torch.float32) - expected).clamp(min=0.0)
    frac = over / buffer if buffer > 0 else (lengths.to(torch.float32) > max_len).to(torch.float32)
    return -frac.clamp(max=1.0) * penalty_factor


def truncation_mask(finish_reasons_is_length: Tensor) -> Tensor:
    """is_length [B] bool (the response hit max_new_tokens) -> keep [B] float: 0 for truncated, 1 otherwise.

    DAPO's overlong filtering: multiply each trajectory's loss mask by it so truncated responses teach
    nothing.
    """
    return (~finish_reasons_is_length.bool()).to(torch.float32)
