"""Triton paged prefill attention: the new tokens of rows that continue a cached prefix, read from the cache.

A later turn of an episode prefills only its new tokens (the observation), which attend to the whole cached
history. Program (row b, query head hq, query block m) loads BLOCK_M new tokens of one head, walks the row's
keys 0..(last query position) in blocks of BLOCK_N (one page-table lookup per block: a block lies inside
one page, and a page of one head is contiguous) with an online softmax, and masks causally only where a key
block reaches the query block. Nothing past a row's own length is read, rows of any prefix length mix in one
launch, and no [B, Lq, Lk] mask or gathered copy of the cache is made (the torch path does both).

The new tokens' K/V must already be in the cache. Runs under TRITON_INTERPRET=1 on CPU tensors too.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ascent.rollout.fast.triton_decode import LOG2E


@triton.jit
def _prefill_kernel(
    Q,
    K,
    V,
    BT,
    STARTS,
    LENS,
    OUT,
    qk_scale,
    stride_qb,
    stride_ql,
    stride_qh,
    stride_kp,
    stride_kh,
    stride_bt,
    stride_ob,
    stride_ol,
    stride_oh,
    G: tl.constexpr,
    D: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    b = tl.program_id(0)
    hq = tl.program_id(1)
    m0 = tl.program_id(2) * BLOCK_M
    n_new = tl.load(LENS + b)
    if m0 < n_new:
        start = tl.load(STARTS + b)
        offs_m = m0 + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, D)
        offs_n = tl.arange(0, BLOCK_N)
        qmask = offs_m < n_new
        q_ptr = Q + b * stride_qb + offs_m[:, None] * stride_ql + hq * stride_qh + offs_d[None, :]
        q = tl.load(q_ptr, mask=qmask[:, None], other=0.0)
        qpos = start + offs_m
        end = start + tl.minimum(m0 + BLOCK_M, n_new)  # keys 0..end-1 cover every query of the block
        free = (start + m0 + 1) // BLOCK_N * BLOCK_N  # key blocks below this need no causal mask
        k_base = K + (hq // G) * stride_kh
        v_base = V + (hq // G) * stride_kh
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, D], tl.float32)
        for n0 in range(0, end, BLOCK_N):
            page = tl.load(BT + b * stride_bt + n0 // PAGE).to(tl.int64)
            addr = page * stride_kp + ((n0 % PAGE) + offs_n)[:, None] * D + offs_d[None, :]
            kpos = n0 + offs_n
            kmask = kpos < end
            k = tl.load(k_base + addr, mask=kmask[:, None], other=0.0)
            qk = tl.dot(q, tl.trans(k), input_precision="ieee") * qk_scale
            if n0 >= free:  # the diagonal blocks: key position <= query position, and inside the row
                qk = tl.where((kpos[None, :] <= qpos[:, None]) & kmask[None, :], qk, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(qk - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(v_base + addr, mask=kmask[:, None], other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
            m_i = m_new
        out = acc / l_i[:, None]  # every query sees key 0, so l_i > 0
        o_ptr = OUT + b * stride_ob + offs_m[:, None] * stride_ol + hq * stride_oh + offs_d[None, :]
        tl.store(o_ptr, out.to(OUT.dtype.element_ty), mask=qmask[:, None])


def paged_prefill_attention(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    block_tables: Tensor,
    starts: Tensor,
    lens: Tensor,
    scale: float,
    block_m: int = 64,
    block_n: int | None = None,
    num_warps: int = 4,
    num_stages: int | None = 2,
) -> Tensor:
    """q [B, Lq, nh, d] (row b's first lens[b] entries are real), caches [pages, kvh, ps, d] holding every
    row's keys up to starts[b] + lens[b], block_tables [B, P] int32, starts/lens [B] int32
    -> out [B, Lq, nh*d] in q's dtype, causal (query i of row b sits at position starts[b] + i);
    padded query entries are left unwritten (zeros)."""
    b, lq, nh, d = q.shape
    kvh, ps = k_cache.shape[1], k_cache.shape[2]
    block_n = block_n or min(ps, 64)
    assert d & (d - 1) == 0 and ps % block_n == 0 and q.stride(-1) == 1 and k_cache.is_contiguous()
    assert v_cache.stride() == k_cache.stride() and nh % kvh == 0
    out = torch.zeros(b, lq, nh, d, dtype=q.dtype, device=q.device)
    extra = {} if num_stages is None else {"num_stages": num_stages}
    _prefill_kernel[(b, nh, triton.cdiv(lq, block_m))](
        q,
        k_cache,
        v_cache,
        block_tables,
        starts,
        lens,
        out,
        scale * LOG2E,
        q.stride(0),
        q.stride(1),
        q.stride(2),
        k_cache.stride(0),
        k_cache.stride(1),
        block_tables.stride(0),
        out.stride(0),
        out.stride(1),
        out.stride(2),
        G=nh // kvh,
        D=d,
        PAGE=ps,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        num_warps=num_warps,
        **extra,
    )
    return out.view(b, lq, nh * d)
