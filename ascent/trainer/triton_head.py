"""The LM head's per-chunk work as Triton kernels (`ascent.trainer.head`, on CUDA): the forward's stats and
the backward's logits gradient.

The forward's stats (`chunk_stats_triton`): inductor made `head.chunk_stats` two reductions over the fp32
logits (logsumexp, then the entropy's sum of p log p), plus the cast that `train.keep_head_logits` keeps:
0.13 s of a 1.43 s 0.5B update on an H200 (BENCHMARKS.md, "Where the 0.5B update goes now"). One program per
row reads the row once, keeping per-lane online sums (the running max m, s = sum exp(x - m) and t = sum
exp(x - m) (x - m), rescaled when m grows), and writes the kept copy from the same loads. At the end:
lse = M + log S and H = log S - T / S, both relative to the row's max (no cancellation of large numbers).
On an H100 it took the 0.5B update from 1.59 to 1.47 s (BENCHMARKS.md, "The head's stats as one Triton pass";
`head.TRITON_STATS`, bench/update_sweep.py's `inductorstats` variant for the old path).

`head.logits_grad_` compiled by inductor became a reduction kernel plus a scatter that moved the bf16 logits
at about 1 TB/s on an H200, a quarter of the card's bandwidth (BENCHMARKS.md, "Where the 0.5B update goes, by
kernel"). The gradient is elementwise given four per-row numbers, so one pass suffices: each program reads a
tile of one row's logits, writes the gradient over it, and adds the target's term where the tile holds the
target (no second kernel, and the add happens in fp32 before the one rounding to the logits' dtype).

The logits gradient. Math (z = logits / T, log p = z - lse, H = entropy, g = dL/dlogp, e = dL/dH):
    dL/dlogits = (-p (g + e (log p + H)) + g [v == target]) / T.
Both run under TRITON_INTERPRET=1 on CPU tensors too (tests/unit/trainer/test_trainer_triton_head.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

BLOCK = 4096  # columns per program (per loop step of the stats): 16 fp32 values per thread at 8 warps


@triton.jit
def _logits_grad_kernel(
    z_ptr,
    stride,
    targets_ptr,
    lse_ptr,
    ent_ptr,
    g_logp_ptr,
    g_ent_ptr,
    vocab,
    inv_t,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = cols < vocab
    ptrs = z_ptr + row * stride + cols
    z = tl.load(ptrs, mask=inside, other=0.0).to(tl.float32)
    lse = tl.load(lse_ptr + row)
    ent = tl.load(ent_ptr + row)
    g = tl.load(g_logp_ptr + row)
    e = tl.load(g_ent_ptr + row)
    target = tl.load(targets_ptr + row)
    logp = z * inv_t - lse
    grad = -tl.exp(logp) * (g + e * (logp + ent))
    grad = tl.where(cols == target, grad + g, grad) * inv_t
    tl.store(ptrs, grad.to(z_ptr.dtype.element_ty), mask=inside)


def logits_grad_triton_(
    z: Tensor,
    targets: Tensor,
    lse: Tensor,
    ent: Tensor,
    g_logp: Tensor,
    g_ent: Tensor,
    temperature: float,
) -> None:
    """In place, as `head.logits_grad_`: logits z [n, V] (rows contiguous) -> dL/dlogits; targets [n] long,
    lse, ent, g_logp, g_ent [n] fp32."""
    n, vocab = z.shape
    if n == 0:
        return
    if z.stride(1) != 1:
        raise ValueError(f"logits_grad_triton_: the logits' rows must be contiguous (strides {z.stride()}).")
    grid = (n, triton.cdiv(vocab, BLOCK))
    rows = (t.contiguous() for t in (targets, lse.float(), ent.float(), g_logp.float(), g_ent.float()))
    _logits_grad_kernel[grid](z, z.stride(0), *rows, vocab, 1.0 / temperature, BLOCK=BLOCK, num_warps=8)


@triton.jit
def _max(a, b):  # combine functions of our own, not tl.max/tl.sum: those are @jit functions of triton's
    return tl.maximum(a, b)  # standard library, which the interpreter cannot call where triton was imported


@triton.jit
def _add(a, b):  # before TRITON_INTERPRET was set (by torch's inductor, in a test run)
    return a + b


@triton.jit
def _stats_kernel(
    z_ptr,
    stride,
    targets_ptr,
    logp_ptr,
    lse_ptr,
    ent_ptr,
    kept_ptr,
    vocab,
    inv_t,
    KEEP: tl.constexpr,
    BLOCK: tl.constexpr,
    STEPS: tl.constexpr,  # cdiv(vocab, BLOCK): a compile-time trip count (one build per vocabulary)
):
    row = tl.program_id(0).to(tl.int64)
    base = z_ptr + row * stride
    # per lane: the running max (from -1e30, finite: exp(m - m_new) never meets inf - inf), sum exp(x - m),
    # sum exp(x - m) (x - m)
    m = tl.full([BLOCK], -1.0e30, tl.float32)
    s = tl.full([BLOCK], 0.0, tl.float32)
    t = tl.full([BLOCK], 0.0, tl.float32)
    for step in range(STEPS):
        cols = step * BLOCK + tl.arange(0, BLOCK)
        inside = cols < vocab
        z = tl.load(base + cols, mask=inside, other=0.0)
        if KEEP:
            tl.store(kept_ptr + row * vocab + cols, z.to(kept_ptr.dtype.element_ty), mask=inside)
        x = tl.where(inside, z.to(tl.float32) * inv_t, -1.0e30)
        m_new = tl.maximum(m, x)
        alpha = tl.exp(m - m_new)
        p = tl.where(inside, tl.exp(x - m_new), 0.0)  # x <= m_new: no overflow, masked lanes too
        t = alpha * (t + (m - m_new) * s) + p * (x - m_new)
        s = alpha * s + p
        m = m_new
    top = tl.reduce(m, 0, _max)
    w = tl.exp(m - top)  # lanes that saw no column: exp(-1e30 - top) = 0
    total = tl.reduce(s * w, 0, _add)
    shifted = tl.reduce(w * (t + (m - top) * s), 0, _add)  # sum exp(x - top) (x - top)
    log_total = tl.log(total)
    lse = top + log_total
    target = tl.load(targets_ptr + row)
    tl.store(logp_ptr + row, tl.load(base + target).to(tl.float32) * inv_t - lse)
    tl.store(lse_ptr + row, lse)
    tl.store(ent_ptr + row, log_total - shifted / total)


def chunk_stats_triton(
    z: Tensor,
    targets: Tensor,
    temperature: float,
    with_entropy: bool,
    kept_dtype: torch.dtype | None = None,
) -> tuple[Tensor, ...]:
    """As `head.chunk_stats` (and, given `kept_dtype`, `head.chunk_stats_kept`) in one pass over each row:
    z [n, V] logits (rows contiguous), targets [n] -> (logp [n], lse [n], entropy [n] or [0], fp32; then z
    cast to `kept_dtype` [n, V] where asked). z itself is not changed."""
    n, vocab = z.shape
    if z.stride(1) != 1:
        raise ValueError(f"chunk_stats_triton: the logits' rows must be contiguous (strides {z.stride()}).")
    logp, lse, ent = (torch.empty(n, device=z.device, dtype=torch.float32) for _ in range(3))
    kept = torch.empty(n, vocab, device=z.device, dtype=kept_dtype) if kept_dtype is not None else None
    if n:
        _stats_kernel[(n,)](
            z,
            z.stride(0),
            targets.contiguous(),
            logp,
            lse,
            ent,
            kept if kept is not None else logp,  # not written without KEEP
            vocab,
            1.0 / temperature,
            KEEP=kept is not None,
            BLOCK=BLOCK,
            STEPS=triton.cdiv(vocab, BLOCK),
            num_warps=8,
        )
    out = (logp, lse, ent if with_entropy else ent.new_zeros(0))
    return (*out, kept) if kept is not None else out
