"""Shared-prefix ("cascade") decode attention: a group's common prompt pages read once for all its rows.

In GRPO the samples of a prompt decode side by side over the same prompt pages (prefix_groups.py finds
them). The plain decode kernel (triton_decode.py) gives every row its own programs, so each of the group's
rows reads the whole prompt's K/V again. Here one program per (group, KV head, prefix split) stacks the
query heads of all the group's rows that read KV head h (members x G rows of one tile, padded to a power
of two, at least 16 for the tensor cores) and walks its share of the n shared pages once, through the page
table of the group's first member, with an online softmax. It leaves, per member row, head and prefix
split, the normalized output (fp32) and its log-sum-exp (log2 domain, scaled as the split kernel scales
its scores), which the split kernel merges and continues from over each row's own tokens.

q is the split kernel's q: with `rope` it arrives unrotated and is rotated here with the same `_rope` and
rounded to q's dtype the same way, row by row with each member's cos/sin, so both kernels score the same
query. The prefix kernel writes no K/V: the pages it reads lie before every member's newest position.
Its programs for group slots that hold no group return at once (a batch of b rows has at most b/2 groups).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ascent.rollout.fast.triton_decode import (
    LOG2E,
    _attend,
    _normalize,
    _rope,
    choose_splits,
    paged_decode_attention,
)

PREFIX_STAGES = 2  # the prefix kernel's software pipeline (the split kernel's default is 3)


@triton.jit
def _prefix_kernel(
    Q,
    K,
    V,
    COS,
    SIN,
    BT,
    GRP,
    PO,
    PL,
    qk_scale,
    nrows,
    stride_qb,
    stride_qh,
    stride_kp,
    stride_kh,
    stride_cb,
    stride_bt,
    stride_gr,
    stride_ob,
    stride_oh,
    stride_os,
    stride_lb,
    stride_lh,
    G: tl.constexpr,
    MEMBERS: tl.constexpr,
    R_PAD: tl.constexpr,
    D: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PRE_SPLITS: tl.constexpr,
    ROPE: tl.constexpr,
):
    g = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.program_id(2)
    n = tl.load(GRP + g * stride_gr + 1)
    lead = tl.load(GRP + g * stride_gr + 2)
    if (n > 0) & (lead >= 0) & (lead < nrows):
        total = n * PAGE
        per = tl.cdiv(tl.cdiv(total, PRE_SPLITS), BLOCK_N) * BLOCK_N
        start = s * per
        end = tl.minimum(start + per, total)
        offs_r = tl.arange(0, R_PAD)
        offs_d = tl.arange(0, D)
        member = offs_r // G
        in_tile = offs_r < MEMBERS * G
        row = tl.load(GRP + g * stride_gr + 2 + member, mask=in_tile, other=-1)
        rmask = in_tile & (row >= 0) & (row < nrows)
        row = tl.where(rmask, row, 0)
        heads = h * G + offs_r % G
        q_ptr = Q + row[:, None] * stride_qb + heads[:, None] * stride_qh
        q = tl.load(q_ptr + offs_d[None, :], mask=rmask[:, None], other=0.0)
        if ROPE:  # as the split kernel rotates, each tile row with its own row's cos/sin
            partner = (offs_d + D // 2) % D
            sign = tl.where(offs_d < D // 2, -1.0, 1.0)
            cos = tl.load(COS + row[:, None] * stride_cb + offs_d[None, :])
            sin = tl.load(SIN + row[:, None] * stride_cb + offs_d[None, :])
            qp = tl.load(q_ptr + partner[None, :], mask=rmask[:, None], other=0.0)
            q = _rope(q, qp, cos, sin, sign[None, :]).to(Q.dtype.element_ty)
        k_base = K + h * stride_kh
        v_base = V + h * stride_kh
        m_i = tl.full([R_PAD], float("-inf"), tl.float32)
        l_i = tl.zeros([R_PAD], tl.float32)
        acc = tl.zeros([R_PAD, D], tl.float32)
        bt_row = BT + lead * stride_bt
        m_i, l_i, acc = _attend(
            q, k_base, v_base, bt_row, start, end, m_i, l_i, acc, qk_scale, stride_kp, PAGE, BLOCK_N, D
        )
        out, lse = _normalize(acc, m_i, l_i)
        o_ptr = PO + row[:, None] * stride_ob + heads[:, None] * stride_oh + s * stride_os + offs_d[None, :]
        tl.store(o_ptr, out, mask=rmask[:, None])
        tl.store(PL + row * stride_lb + heads * stride_lh + s, lse, mask=rmask)


def prefix_attention(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    block_tables: Tensor,
    groups: Tensor,
    scale: float,
    splits: int,
    block_n: int,
    rope: tuple[Tensor, Tensor] | None = None,
    num_warps: int = 4,
    num_stages: int | None = 3,
) -> tuple[Tensor, Tensor]:
    """q [B, nh, d] (unrotated with `rope` = (cos, sin) [B, d] fp32), caches [pages, kvh, ps, d],
    block_tables [B, P] int32, groups [rows >= B, 2 + members] int32 (prefix_groups.py) -> the partials of
    every grouped row over its group's shared pages, po [B, nh, splits, d] fp32 and pl [B, nh, splits]
    (log2 LSE, scores scaled by scale * log2(e)); rows in no group are left unwritten."""
    b, nh, d = q.shape
    kvh, ps = k_cache.shape[1], k_cache.shape[2]
    g, members = nh // kvh, groups.shape[1] - 2
    po = torch.empty(b, nh, splits, d, dtype=torch.float32, device=q.device)
    pl = torch.empty(b, nh, splits, dtype=torch.float32, device=q.device)
    cos, sin = rope if rope is not None else (pl, pl)  # (unread placeholders without rope)
    assert cos.stride(-1) == 1 and cos.stride() == sin.stride() and groups.stride(-1) == 1
    extra = {} if num_stages is None else {"num_stages": num_stages}
    _prefix_kernel[(max(1, -(-b // 2)), kvh, splits)](
        q,
        k_cache,
        v_cache,
        cos,
        sin,
        block_tables,
        groups,
        po,
        pl,
        scale * LOG2E,
        b,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        cos.stride(0),
        block_tables.stride(0),
        groups.stride(0),
        po.stride(0),
        po.stride(1),
        po.stride(2),
        pl.stride(0),
        pl.stride(1),
        G=g,
        MEMBERS=members,
        R_PAD=max(16, triton.next_power_of_2(members * g)),
        D=d,
        PAGE=ps,
        BLOCK_N=block_n,
        PRE_SPLITS=splits,
        ROPE=rope is not None,
        num_warps=num_warps,
        **extra,
    )
    return po, pl


def cascade_decode_attention(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    block_tables: Tensor,
    context_lens: Tensor,
    scale: float,
    groups: Tensor,
    new_kv: tuple[Tensor, Tensor] | None = None,
    splits: int | None = None,
    block_n: int | None = None,
    num_warps: int = 4,
    num_stages: int | None = 3,
    rope: tuple[Tensor, Tensor] | None = None,
    prefix_splits: int | None = None,
    prefix_warps: int | None = None,
    prefix_block_n: int | None = None,
    prefix_stages: int | None = None,
) -> Tensor:
    """`paged_decode_attention`'s arguments plus the group table `groups` [rows >= B, 2 + members] int32
    (prefix_groups.py) -> out [B, nh*d]: the prefix kernel over each group's shared pages, then the split
    kernel over the rest. `prefix_splits` (default: about one program per two multiprocessors if every
    row is in a full group), `prefix_warps` (default num_warps), `prefix_block_n` (tokens a step, may span
    pages; default block_n) and `prefix_stages` (default `PREFIX_STAGES`) tune the prefix kernel."""
    b, kvh, ps = q.shape[0], k_cache.shape[1], k_cache.shape[2]
    block_n = block_n or min(ps, 64)
    members = groups.shape[1] - 2
    # half the split kernel's rule (each split leaves [B, nh, d] fp32 partials that every row's merge
    # reads) and a two-stage pipeline: at 256 rows (32 groups of 8) 4 splits of 2 stages were the fastest
    # or within 1.5% of it over 36 settings at both shapes (bench/cascade_sweep.py, H200, 2026-11-28)
    prefix_splits = prefix_splits or max(1, choose_splits(-(-b // members), kvh, q.device) // 2)
    po, pl = prefix_attention(
        q,
        k_cache,
        v_cache,
        block_tables,
        groups,
        scale,
        prefix_splits,
        prefix_block_n or block_n,
        rope,
        prefix_warps or num_warps,
        prefix_stages or PREFIX_STAGES,
    )
    return paged_decode_attention(
        q,
        k_cache,
        v_cache,
        block_tables,
        context_lens,
        scale,
        new_kv,
        splits,
        block_n,
        num_warps,
        num_stages,
        rope,
        prefix=(groups, po, pl),
    )
