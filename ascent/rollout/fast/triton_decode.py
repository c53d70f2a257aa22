"""Triton paged decode attention: one query token per row, grouped-query, split over the context.

Program (row b, KV head h, split s) loads the G query heads that share KV head h (padded to 16 rows for the
tensor cores), walks its share of the row's context in blocks of BLOCK_N tokens (one page-table lookup per
block: a block lies inside one page, and a page of one head is contiguous) and keeps an online softmax.
Every K/V byte up to the row's context length is read once per step, nothing past it. Optionally the
program owning the newest position first writes that token's K/V into the cache. A second kernel merges
the splits by their log-sum-exp.

Optionally (`rope`) q and the new k arrive unrotated with the row's cos/sin (fp32 tables), and the kernel
rotates them as `layers.apply_rope` does: rotate-half, in fp32, the same products summed in the same order,
rounded once to q's (k's) dtype; the rotated k is what goes into the cache. That saves the RoPE kernel of
each layer's `attn_in` (runner.py, `fused_rope`).

Shared prefixes (`prefix`, triton_cascade.py): rows grouped by their common leading pages (prefix_groups.py)
have those pages' attention computed once per group by the prefix kernel, as normalized partial results
with their log-sum-exp. The split kernel then walks only a row's own tokens, from its shared length to its
context, and its split 0 starts the online softmax from the row's prefix partials merged into one (max =
their LSE, sum = 1, accumulator = their output: exactly the state after attending those tokens). A row
uses its group only after checking it (`_group_claim`): it is a member, its first n pages are the group's
and its newest position lies past them; otherwise, and for rows in no group, it starts from nothing as
without `prefix`, with the same arithmetic. Without `prefix` the kernel compiles to what it was before
(the additions sit behind a constexpr).

Runs under TRITON_INTERPRET=1 on CPU tensors too (the unit tests do that when triton is installed).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

LOG2E = 1.4426950408889634


@triton.jit
def _rope(x, x_partner, cos, sin, sign):
    """x rotated in fp32 as `layers.apply_rope`: x * cos + cat(-x2, x1) * sin, where `x_partner` holds x at
    (i + D/2) % D and `sign` is -1 in the first half. The negation is a product with -1, as torch negates:
    Triton's `-x` is `0 - x`, which loses the sign of -0."""
    return x.to(tl.float32) * cos + (x_partner.to(tl.float32) * sign) * sin


@triton.jit
def _group_claim(GRP, BT, b, ctx, nrows, stride_gr, stride_bt, PAGE: tl.constexpr, MEMBERS: tl.constexpr):
    """-> how many leading tokens of row b the prefix kernel attended (n * PAGE), or 0. Row b's group slot
    (GRP[b, 0]), its page count n and members (GRP[slot, 1], GRP[slot, 2:]) count only if row b is one of
    the members, its newest position ctx - 1 lies past the n pages, and its first n page ids are those of
    the first member (whose table the prefix kernel reads)."""
    slot = tl.load(GRP + b * stride_gr)
    group = GRP + tl.maximum(slot, 0) * stride_gr
    n = tl.load(group + 1)
    offs_m = tl.arange(0, MEMBERS)
    rows = tl.load(group + 2 + offs_m)
    lead = tl.load(group + 2)
    listed = tl.sum((rows == b).to(tl.int32), 0) > 0
    ok = listed & (slot >= 0) & (n > 0) & (n * PAGE <= ctx - 1) & (lead >= 0) & (lead < nrows)
    n = tl.where(ok, n, 0)
    lead = tl.where(ok, lead, b)
    offs = tl.arange(0, 64)
    differ = n * 0
    for p0 in range(0, n, 64):
        pmask = p0 + offs < n
        mine = tl.load(BT + b * stride_bt + p0 + offs, mask=pmask, other=0)
        theirs = tl.load(BT + lead * stride_bt + p0 + offs, mask=pmask, other=0)
        differ += tl.sum((mine != theirs).to(tl.int32), 0)
    return tl.where(differ == 0, n * PAGE, 0)


@triton.jit
def _prefix_state(
    PO,
    PL,
    b,
    heads,
    hmask,
    stride_pb,
    stride_ph,
    stride_ps,
    stride_lb,
    stride_lh,
    D: tl.constexpr,
    PRE_SPLITS: tl.constexpr,
):
    """Row b's prefix partials (PO [B, nh, PRE_SPLITS, D] normalized outputs, PL [B, nh, PRE_SPLITS] log2
    LSEs) of `heads` [G_PAD], merged by LSE one split at a time -> (lse [G_PAD], out [G_PAD, D]); -inf and
    0 where `hmask` is off."""
    offs_d = tl.arange(0, D)
    m = tl.full(heads.shape, float("-inf"), tl.float32)
    total = tl.zeros(heads.shape, tl.float32)
    o = tl.zeros([heads.shape[0], D], tl.float32)
    for j in tl.static_range(PRE_SPLITS):
        lse_j = tl.load(PL + b * stride_lb + heads * stride_lh + j, mask=hmask, other=float("-inf"))
        o_ptr = PO + b * stride_pb + heads[:, None] * stride_ph + j * stride_ps + offs_d[None, :]
        o_j = tl.load(o_ptr, mask=hmask[:, None], other=0.0)
        m_new = tl.maximum(m, lse_j)
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m - m_safe)
        w = tl.exp2(lse_j - m_safe)
        total = total * alpha + w
        o = o * alpha[:, None] + o_j * w[:, None]
        m = m_new
    out, lse = _normalize(o, m, total)
    return lse, out


@triton.jit
def _attend(
    q,
    k_base,
    v_base,
    bt_row,
    start,
    end,
    m_i,
    l_i,
    acc,
    qk_scale,
    stride_kp,
    PAGE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    D: tl.constexpr,
):
    """Continue the online softmax (m_i, l_i [R], acc [R, D] fp32, log2 domain) of the queries q [R, D]
    over the tokens [start, end) of one page table (`bt_row` points at it), one block of BLOCK_N tokens at
    a time -> (m_i, l_i, acc). Masked tokens score -inf. A block of at most PAGE tokens lies inside one
    page (`start` a multiple of BLOCK_N); a larger block spans several, each token's page looked up."""
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    for n0 in range(start, end, BLOCK_N):
        if BLOCK_N <= PAGE:  # (tmask in each branch: this one's order is the split kernel's compiled code)
            page = tl.load(bt_row + n0 // PAGE).to(tl.int64)
            tmask = n0 + offs_n < end
            addr = page * stride_kp + ((n0 % PAGE) + offs_n)[:, None] * D + offs_d[None, :]
        else:
            tmask = n0 + offs_n < end
            tok = n0 + offs_n
            pages = tl.load(bt_row + tok // PAGE, mask=tmask, other=0).to(tl.int64)
            addr = pages[:, None] * stride_kp + (tok % PAGE)[:, None] * D + offs_d[None, :]
        k = tl.load(k_base + addr, mask=tmask[:, None], other=0.0)
        qk = tl.dot(q, tl.trans(k), input_precision="ieee") * qk_scale
        qk = tl.where(tmask[None, :], qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(qk - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_base + addr, mask=tmask[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
        m_i = m_new
    return m_i, l_i, acc


@triton.jit
def _normalize(acc, m_i, l_i):
    """An online softmax's state -> (out [R, D] = acc / l, lse [R] in log2); 0 and -inf for a row that saw
    no token."""
    valid = l_i > 0
    out = acc / tl.where(valid, l_i, 1.0)[:, None]
    return out, tl.where(valid, m_i + tl.log2(tl.where(valid, l_i, 1.0)), float("-inf"))


@triton.jit
def _split_kernel(
    Q,
    K,
    V,
    KN,
    VN,
    COS,
    SIN,
    BT,
    CTX,
    OP,
    LP,
    OUT,
    qk_scale,
    stride_qb,
    stride_qh,
    stride_kp,
    stride_kh,
    stride_kb,
    stride_khn,
    stride_vb,
    stride_vhn,
    stride_cb,
    stride_bt,
    stride_ob,
    stride_oh,
    stride_os,
    stride_lb,
    stride_lh,
    stride_xb,
    stride_xh,
    GRP,
    PO,
    PL,
    nrows,
    stride_gr,
    stride_pb,
    stride_ph,
    stride_ps,
    stride_plb,
    stride_plh,
    G: tl.constexpr,
    G_PAD: tl.constexpr,
    D: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SPLITS: tl.constexpr,
    WRITE: tl.constexpr,
    ROPE: tl.constexpr,
    CASCADE: tl.constexpr,
    PRE_SPLITS: tl.constexpr,
    MEMBERS: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.program_id(2)
    ctx = tl.load(CTX + b)
    if CASCADE:  # the splits share the tokens after the group's prefix (module doc)
        shared = _group_claim(GRP, BT, b, ctx, nrows, stride_gr, stride_bt, PAGE, MEMBERS)
        per = tl.cdiv(tl.cdiv(ctx - shared, SPLITS), BLOCK_N) * BLOCK_N
        start = shared + s * per
    else:
        per = tl.cdiv(tl.cdiv(ctx, SPLITS), BLOCK_N) * BLOCK_N
        start = s * per
    end = tl.minimum(start + per, ctx)
    offs_g = tl.arange(0, G_PAD)
    offs_d = tl.arange(0, D)
    partner = (offs_d + D // 2) % D  # rotate-half's pairs (`_rope`)
    sign = tl.where(offs_d < D // 2, -1.0, 1.0)
    if ROPE:
        cos = tl.load(COS + b * stride_cb + offs_d)
        sin = tl.load(SIN + b * stride_cb + offs_d)
    k_base = K + h * stride_kh
    v_base = V + h * stride_kh
    if WRITE:  # the program covering the newest position stores its K/V first
        last = ctx - 1
        if (last >= start) & (last < end):
            page = tl.load(BT + b * stride_bt + last // PAGE).to(tl.int64)
            dst = page * stride_kp + (last % PAGE) * D + offs_d
            kn_ptr = KN + b * stride_kb + h * stride_khn
            kn = tl.load(kn_ptr + offs_d)
            if ROPE:
                kn = _rope(kn, tl.load(kn_ptr + partner), cos, sin, sign).to(KN.dtype.element_ty)
            tl.store(k_base + dst, kn)
            tl.store(v_base + dst, tl.load(VN + b * stride_vb + h * stride_vhn + offs_d))
            tl.debug_barrier()
    heads = h * G + offs_g
    gmask = offs_g < G
    q_ptr = Q + b * stride_qb + heads[:, None] * stride_qh
    q = tl.load(q_ptr + offs_d[None, :], mask=gmask[:, None], other=0.0)
    if ROPE:
        qp = tl.load(q_ptr + partner[None, :], mask=gmask[:, None], other=0.0)
        q = _rope(q, qp, cos[None, :], sin[None, :], sign[None, :]).to(Q.dtype.element_ty)
    m_i = tl.full([G_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([G_PAD], tl.float32)
    acc = tl.zeros([G_PAD, D], tl.float32)
    if CASCADE:  # split 0 continues from the prefix's partial result
        use = (shared > 0) & (s == 0)
        lse_p, o_p = _prefix_state(
            PO,
            PL,
            b,
            heads,
            gmask & use,
            stride_pb,
            stride_ph,
            stride_ps,
            stride_plb,
            stride_plh,
            D,
            PRE_SPLITS,
        )
        m_i = tl.where(use, lse_p, m_i)
        l_i = tl.where(use, 1.0, l_i)
        acc = tl.where(use, o_p, acc)
    m_i, l_i, acc = _attend(
        q,
        k_base,
        v_base,
        BT + b * stride_bt,
        start,
        end,
        m_i,
        l_i,
        acc,
        qk_scale,
        stride_kp,
        PAGE,
        BLOCK_N,
        D,
    )
    out, lse = _normalize(acc, m_i, l_i)
    if SPLITS == 1:  # no merge needed: write the final output
        x_ptr = OUT + b * stride_xb + heads[:, None] * stride_xh + offs_d[None, :]
        tl.store(x_ptr, out.to(OUT.dtype.element_ty), mask=gmask[:, None])
    else:
        o_ptr = OP + b * stride_ob + heads[:, None] * stride_oh + s * stride_os + offs_d[None, :]
        tl.store(o_ptr, out, mask=gmask[:, None])
        tl.store(LP + b * stride_lb + heads * stride_lh + s, lse, mask=gmask)


@triton.jit
def _combine_kernel(
    OP,
    LP,
    OUT,
    stride_ob,
    stride_oh,
    stride_os,
    stride_lb,
    stride_lh,
    stride_xb,
    stride_xh,
    SPLITS: tl.constexpr,
    S_PAD: tl.constexpr,
    D: tl.constexpr,
):
    b = tl.program_id(0)
    hq = tl.program_id(1)
    offs_s = tl.arange(0, S_PAD)
    offs_d = tl.arange(0, D)
    smask = offs_s < SPLITS
    lse = tl.load(LP + b * stride_lb + hq * stride_lh + offs_s, mask=smask, other=float("-inf"))
    m = tl.max(lse, 0)
    m = tl.where(m == float("-inf"), 0.0, m)
    w = tl.exp2(lse - m)
    denom = tl.sum(w, 0)
    o_ptr = OP + b * stride_ob + hq * stride_oh + offs_s[:, None] * stride_os + offs_d[None, :]
    o = tl.load(o_ptr, mask=smask[:, None], other=0.0)
    out = tl.sum(o * w[:, None], 0) / tl.where(denom > 0, denom, 1.0)
    tl.store(OUT + b * stride_xb + hq * stride_xh + offs_d, out.to(OUT.dtype.element_ty))


def choose_splits(batch: int, kv_heads: int, device: torch.device, max_splits: int = 16) -> int:
    """Splits per row so that about two programs per multiprocessor run (a power of two, 1..max_splits)."""
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 8
    want = max(1, -(-2 * sms // max(1, batch * kv_heads)))
    return min(max_splits, triton.next_power_of_2(want))


def paged_decode_attention(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    block_tables: Tensor,
    context_lens: Tensor,
    scale: float,
    new_kv: tuple[Tensor, Tensor] | None = None,
    splits: int | None = None,
    block_n: int | None = None,
    num_warps: int = 4,
    num_stages: int | None = 3,
    rope: tuple[Tensor, Tensor] | None = None,
    prefix: tuple[Tensor, Tensor, Tensor] | None = None,
) -> Tensor:
    """q [B, nh, d], k/v cache [pages, kvh, ps, d], block_tables [B, P] int32, context_lens [B] int32
    -> out [B, nh*d] in q's dtype; rows with context 0 get zeros.

    `new_kv` = (k, v) [B, kvh, d] of the newest token (position context_len - 1): the kernel stores them
    into the cache before attending, which saves the separate cache-write launches.
    `rope` = (cos, sin) [B, d] fp32, each row's at its position: q and new_kv's k arrive unrotated and the
    kernel rotates them (module doc; needs `new_kv`).
    `prefix` = (groups [rows >= B, 2 + members] int32, po [B, nh, S', d] fp32, pl [B, nh, S'] fp32): the
    shared-prefix groups (prefix_groups.py) and what the prefix kernel made of them (triton_cascade.py):
    a row of a group attends only its tokens past the group's pages, starting from its partials (module
    doc). Call it through `triton_cascade.cascade_decode_attention`.
    """
    b, nh, d = q.shape
    kvh, ps = k_cache.shape[1], k_cache.shape[2]
    g = nh // kvh
    block_n = block_n or min(ps, 64)
    assert d & (d - 1) == 0 and ps % block_n == 0 and q.stride(-1) == 1 and k_cache.is_contiguous()
    splits = splits or choose_splits(b, kvh, q.device)
    op = torch.empty(b, nh, splits, d, dtype=torch.float32, device=q.device)
    lp = torch.empty(b, nh, splits, dtype=torch.float32, device=q.device)
    out = torch.empty(b, nh, d, dtype=q.dtype, device=q.device)
    kn, vn = new_kv if new_kv is not None else (q, q)
    assert kn.stride(-1) == 1 and vn.stride(-1) == 1
    assert rope is None or new_kv is not None  # the kernel rotates the k it writes
    cos, sin = rope if rope is not None else (lp, lp)  # (unread placeholders without rope)
    assert cos.stride(-1) == 1 and cos.stride() == sin.stride()
    extra = {} if num_stages is None else {"num_stages": num_stages}
    groups, po, pl = prefix if prefix is not None else (block_tables, op, lp)  # (unread without prefix)
    members = groups.shape[1] - 2 if prefix is not None else 1
    assert members & (members - 1) == 0, "the group table's member count must be a power of two"
    assert groups.stride(-1) == 1 and po.stride(-1) == 1 and pl.stride(-1) == 1
    _split_kernel[(b, kvh, splits)](
        q,
        k_cache,
        v_cache,
        kn,
        vn,
        cos,
        sin,
        block_tables,
        context_lens,
        op,
        lp,
        out,
        scale * LOG2E,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        kn.stride(0),
        kn.stride(1),
        vn.stride(0),
        vn.stride(1),
        cos.stride(0),
        block_tables.stride(0),
        op.stride(0),
        op.stride(1),
        op.stride(2),
        lp.stride(0),
        lp.stride(1),
        out.stride(0),
        out.stride(1),
        groups,
        po,
        pl,
        b,
        groups.stride(0),
        po.stride(0),
        po.stride(1),
        po.stride(2),
        pl.stride(0),
        pl.stride(1),
        G=g,
        G_PAD=max(16, triton.next_power_of_2(g)),
        D=d,
        PAGE=ps,
        BLOCK_N=block_n,
        SPLITS=splits,
        WRITE=new_kv is not None,
        ROPE=rope is not None,
        CASCADE=prefix is not None,
        PRE_SPLITS=po.shape[2] if prefix is not None else 1,
        MEMBERS=members,
        num_warps=num_warps,
        **extra,
    )
    if splits > 1:
        _combine(op, lp, out)
    return out.view(b, nh * d)


def _combine(op: Tensor, lp: Tensor, out: Tensor) -> None:
    """Launch the kernel that merges the splits: op [B, nh, splits, d] and lp [B, nh, splits] -> out."""
    b, nh, splits, d = op.shape
    _combine_kernel[(b, nh)](
        op,
        lp,
        out,
        op.stride(0),
        op.stride(1),
        op.stride(2),
        lp.stride(0),
        lp.stride(1),
        out.stride(0),
        out.stride(1),
        SPLITS=splits,
        S_PAD=triton.next_power_of_2(splits),
        D=d,
    )
