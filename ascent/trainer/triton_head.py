"""The LM head's logits gradient as one Triton kernel (`ascent.trainer.head`'s backward, on CUDA).

`head.logits_grad_` compiled by inductor became a reduction kernel plus a scatter that moved the bf16 logits
at about 1 TB/s on an H200, a quarter of the card's bandwidth (BENCHMARKS.md, "Where the 0.5B update goes, by
kernel"). The gradient is elementwise given four per-row numbers, so one pass suffices: each program reads a
tile of one row's logits, writes the gradient over it, and adds the target's term where the tile holds the
target (no second kernel, and the add happens in fp32 before the one rounding to the logits' dtype).

Math (z = logits / T, log p = z - lse, H = entropy, g = dL/dlogp, e = dL/dH):
    dL/dlogits = (-p (g + e (log p + H)) + g [v == target]) / T.
Runs under TRITON_INTERPRET=1 on CPU tensors too (tests/unit/trainer/test_trainer_triton_head.py).
"""

from __future__ import annotations

import triton
import triton.language as tl
from torch import Tensor

BLOCK = 4096  # columns per program: 16 fp32 values per thread at 8 warps


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
