"""Per-token entropy of the policy's next-token distribution, in bounded memory.

`entropy_from_logits(logits [n, V]) -> [n]` with H = logsumexp(z) - sum_j softmax(z)_j z_j. The logits of a
micro-batch can be huge ([tokens, 150k] in bf16), so rows are processed `chunk_size` at a time: only one
chunk is ever upcast to fp32. Peak extra memory is about 3 * chunk_size * V * 4 bytes (the fp32 chunk, its
softmax and one product), independent of n, plus the [n] output. Backward does the same: a custom autograd
function saves only the input logits (already alive in the caller) and recomputes each chunk's softmax,
using dH/dz_j = -p_j (z_j - sum_k p_k z_k). The result is fp32 (fp64 for fp64 input).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

DEFAULT_CHUNK_ROWS = 256


def _entropy_chunk(z: Tensor) -> Tensor:
    """z [c, V] fp32 -> [c]: -sum(p * log p) with log p = z - logsumexp(z) <= 0, a sum of terms >= 0.

    (The equal form logsumexp(z) - sum(p * z) subtracts two large numbers when the logits are large and
    confident, and came out slightly negative.)"""
    logp = z - torch.logsumexp(z, dim=-1).unsqueeze(-1)
    return -_expected(torch.exp(logp), logp)


def _expected(p: Tensor, z: Tensor) -> Tensor:
    """p [c, V], z [c, V] -> [c]: sum_j p_j z_j, with 0 * (-inf) taken as 0 (masked vocabulary entries)."""
    return torch.where(p > 0, p * z, torch.zeros((), dtype=z.dtype, device=z.device)).sum(-1)


def _compute_dtype(logits: Tensor) -> torch.dtype:
    """fp32 for half types and fp32, fp64 for fp64 input."""
    return torch.promote_types(logits.dtype, torch.float32)


class _ChunkedEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, logits: Tensor, chunk_size: int) -> Tensor:
        dtype = _compute_dtype(logits)
        out = torch.empty(logits.shape[0], dtype=dtype, device=logits.device)
        for s in range(0, logits.shape[0], chunk_size):
            out[s : s + chunk_size] = _entropy_chunk(logits[s : s + chunk_size].to(dtype))
        ctx.save_for_backward(logits)
        ctx.chunk_size = chunk_size
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor, None]:
        (logits,) = ctx.saved_tensors
        grad = torch.empty_like(logits)
        for s in range(0, logits.shape[0], ctx.chunk_size):
            z = logits[s : s + ctx.chunk_size].to(_compute_dtype(logits))
            p = torch.softmax(z, dim=-1)
            mean_z = _expected(p, z).unsqueeze(-1)
            g = torch.where(p > 0, -p * (z - mean_z), torch.zeros((), dtype=z.dtype, device=z.device))
            g = g * grad_out[s : s + ctx.chunk_size].unsqueeze(-1)
            grad[s : s + ctx.chunk_size] = g.to(logits.dtype)
        return grad, None


def entropy_from_logits(logits: Tensor, chunk_size: int = DEFAULT_CHUNK_ROWS) -> Tensor:
    """logits [n, V] (any float dtype) -> entropy [n] (fp32; fp64 for fp64 input), processing `chunk_size`
    rows at a time.

    H(softmax(z)) = logsumexp(z) - sum_j softmax(z)_j z_j (nats). Differentiable (custom backward, same memory
    bound). Rows of -inf except one finite entry give 0. Temperature is the caller's: pass logits / T.
    """
    if logits.dim() != 2:
        raise ValueError(f"entropy_from_logits: expected logits [n, V], got shape {tuple(logits.shape)}.")
    if chunk_size <= 0:
        raise ValueError(f"entropy_from_logits: chunk_size={chunk_size} must be > 0.")
    return _ChunkedEntropy.apply(logits, chunk_size)
