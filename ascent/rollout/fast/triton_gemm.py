"""Triton GEMMs of the decode step with the elementwise work around them fused into the epilogue.

One kernel, three epilogues (fused_gemm.py says what each computes; its references are the tests):
- RESIDUAL: out [T, N] fp32 = x + float(bf16(a @ w.T)) (o_proj, down_proj: the fp32 residual stream);
- SILU: out [T, I] = silu(g) * u, g and u the gate and up products rounded to the input dtype; a program
  holds both accumulators (weight rows n and I + n), so the [T, 2I] product is never written;
- ROPE: out [T, (nh + 2 kvh) d] = the biased q/k/v product rounded, q and k heads rotated in fp32 and
  rounded once; a program holds columns c and c + d/2 of the same heads as its two accumulators, so
  out1 = a1 cos - a2 sin and out2 = a2 cos + a1 sin need nothing outside the program.

Program (row block, column block, K split). Row blocks vary fastest, so programs reading the same weight
tile run together and share it through L2. Loads clamp rows and columns into range (no masks: a decode
GEMM streams the weight, masks cost issue slots); only the stores mask. A decode product has few column
blocks for the SMs (down_proj of a 0.5B model: 896 columns), so K may be split over `split_k` programs:
each writes its fp32 partials to a workspace and bumps the tile's counter; the last one sums the partials in
split order (deterministic, independent of arrival), resets the counter to 0 for the next launch and runs
the epilogue. Counters live in one zeroed buffer per device that every launch leaves zeroed.

The launchers are registered as torch custom ops (`ascent::…`, opaque to inductor, with fake
implementations for tracing), so `torch.compile`d layer math calls them and CUDA graphs capture them.
Runs under TRITON_INTERPRET=1 on CPU tensors too (the unit tests).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from torch import Tensor

from ascent.rollout.fast.fused_gemm import (
    MAX_ROWS,
    Tile,
    gate_up_silu_ref,
    linear_residual_ref,
    pick_tile,
    qkv_rope_ref,
)

RESIDUAL, SILU, ROPE = 0, 1, 2
_LOCK_SLOTS = 1 << 16
_locks: dict[torch.device, Tensor] = {}
_sms: dict[torch.device, int] = {}


@triton.jit
def _columns(j, MODE: tl.constexpr, HALF: tl.constexpr, second):
    """Accumulator columns j -> (weight row / output column of accumulator 1, of accumulator 2)."""
    if MODE == 2:  # ROPE: j counts half-heads; column c of head h and its partner d/2 later
        c1 = (j // HALF) * (2 * HALF) + j % HALF
        return c1, c1 + HALF
    return j, j + second  # SILU: gate row n, up row I + n (RESIDUAL: the second is unused)


@triton.jit
def _dot(a, w, acc, UPCAST: tl.constexpr):
    """acc + a @ w. UPCAST (the interpreter only, whose triton 3.6 dot multiplies bf16 bit patterns as
    integers) multiplies in fp32: exact products, as the tensor cores' are."""
    if UPCAST:
        return tl.dot(a.to(tl.float32), w.to(tl.float32), acc)
    return tl.dot(a, w, acc)


@triton.jit(do_not_specialize=["M"])  # one compile serves every batch size of a tile (graphs.py warm-ups)
def _gemm_kernel(
    A,
    W,
    BIAS,
    X,
    COS,
    SIN,
    OUT,
    WS,
    LOCKS,
    M,
    J,
    K,
    second,
    rot_cols,
    stride_am,
    stride_wn,
    stride_xm,
    stride_cm,
    stride_om,
    MODE: tl.constexpr,
    NACC: tl.constexpr,
    HALF: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
    EVEN_K: tl.constexpr,
    UPCAST: tl.constexpr,
):
    TWO: tl.constexpr = NACC == 2
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    pid_m = pid % num_m
    pid_s = (pid // num_m) % SPLIT_K
    pid_n = pid // (num_m * SPLIT_K)
    rm = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    rj = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % J
    c1, c2 = _columns(rj, MODE, HALF, second)
    k_per = tl.cdiv(tl.cdiv(K, BLOCK_K), SPLIT_K) * BLOCK_K
    k_lo = pid_s * k_per
    k_hi = tl.minimum(K, k_lo + k_per)
    rk = k_lo + tl.arange(0, BLOCK_K)
    a_ptr = A + rm[:, None] * stride_am + rk[None, :]
    w1_ptr = W + c1[None, :] * stride_wn + rk[:, None]  # [BLOCK_K, BLOCK_N]: w.T's tile
    w2_ptr = W + c2[None, :] * stride_wn + rk[:, None]
    acc1 = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    acc2 = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        if EVEN_K:
            a = tl.load(a_ptr)
            acc1 = _dot(a, tl.load(w1_ptr), acc1, UPCAST)
            if TWO:
                acc2 = _dot(a, tl.load(w2_ptr), acc2, UPCAST)
        else:
            kin = rk < k_hi - (k0 - k_lo)
            a = tl.load(a_ptr, mask=kin[None, :], other=0.0)
            acc1 = _dot(a, tl.load(w1_ptr, mask=kin[:, None], other=0.0), acc1, UPCAST)
            if TWO:
                acc2 = _dot(a, tl.load(w2_ptr, mask=kin[:, None], other=0.0), acc2, UPCAST)
        a_ptr += BLOCK_K
        w1_ptr += BLOCK_K
        w2_ptr += BLOCK_K
    last = True
    if SPLIT_K > 1:
        tile = pid_m + num_m * pid_n
        tile_elems: tl.constexpr = BLOCK_M * BLOCK_N * NACC
        offs = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
        mine = WS + (tile * SPLIT_K + pid_s) * tile_elems + offs
        tl.store(mine, acc1)
        if TWO:
            tl.store(mine + BLOCK_M * BLOCK_N, acc2)
        tl.debug_barrier()  # every thread's partials are out before the counter says so
        last = tl.atomic_add(LOCKS + tile, 1, sem="acq_rel") == SPLIT_K - 1
        if last:  # the tile's last split sums them all, in split order (whoever came last)
            acc1 = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
            acc2 = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
            for s in range(SPLIT_K):
                part = WS + (tile * SPLIT_K + s) * tile_elems + offs
                acc1 += tl.load(part, cache_modifier=".cg")
                if TWO:
                    acc2 += tl.load(part + BLOCK_M * BLOCK_N, cache_modifier=".cg")
            tl.atomic_xchg(LOCKS + tile, 0)  # zeroed again for the next launch
    if last:
        _epilogue(
            acc1,
            acc2,
            A,
            BIAS,
            X,
            COS,
            SIN,
            OUT,
            M,
            J,
            second,
            rot_cols,
            stride_xm,
            stride_cm,
            stride_om,
            pid_m,
            pid_n,
            MODE,
            HALF,
            HAS_BIAS,
            BLOCK_M,
            BLOCK_N,
        )


@triton.jit
def _epilogue(
    acc1,
    acc2,
    A,
    BIAS,
    X,
    COS,
    SIN,
    OUT,
    M,
    J,
    second,
    rot_cols,
    stride_xm,
    stride_cm,
    stride_om,
    pid_m,
    pid_n,
    MODE: tl.constexpr,
    HALF: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """The tile's full sums -> its outputs (masked to the real rows and columns)."""
    dt = A.dtype.element_ty  # products are rounded to the input dtype, as cuBLAS's output
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rj = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rm[:, None] < M) & (rj[None, :] < J)
    c1, c2 = _columns(rj % J, MODE, HALF, second)  # in range: bias loads need no mask
    if MODE == 0:
        x = tl.load(X + rm[:, None] * stride_xm + rj[None, :], mask=mask, other=0.0)
        y = x + acc1.to(dt).to(tl.float32)
        tl.store(OUT + rm[:, None] * stride_om + rj[None, :], y, mask=mask)
    elif MODE == 1:
        g = acc1.to(dt).to(tl.float32)
        u = acc2.to(dt).to(tl.float32)
        y = g * tl.sigmoid(g) * u
        tl.store(OUT + rm[:, None] * stride_om + rj[None, :], y.to(dt), mask=mask)
    else:
        if HAS_BIAS:
            acc1 += tl.load(BIAS + c1).to(tl.float32)[None, :]
            acc2 += tl.load(BIAS + c2).to(tl.float32)[None, :]
        y1 = acc1.to(dt).to(tl.float32)
        y2 = acc2.to(dt).to(tl.float32)
        h = (rj % J) % HALF
        cs = rm[:, None] * stride_cm + h[None, :]
        cos1 = tl.load(COS + cs, mask=mask, other=0.0)
        cos2 = tl.load(COS + cs + HALF, mask=mask, other=0.0)
        sin1 = tl.load(SIN + cs, mask=mask, other=0.0)
        sin2 = tl.load(SIN + cs + HALF, mask=mask, other=0.0)
        rot = (c1 < rot_cols)[None, :]  # q and k heads; v heads pass through
        o1 = tl.where(rot, y1 * cos1 - y2 * sin1, y1)
        o2 = tl.where(rot, y2 * cos2 + y1 * sin2, y2)
        out = OUT + rm[:, None] * stride_om
        tl.store(out + c1[None, :], o1.to(dt), mask=mask)
        tl.store(out + c2[None, :], o2.to(dt), mask=mask)


def gate_up_silu_launch(h: Tensor, w: Tensor, tile: Tile | None = None) -> Tensor:
    """h [T, K], w [2I, K] (gate rows then up rows) -> silu(g) * u [T, I] in h's dtype."""
    t, i = h.shape[0], w.shape[0] // 2
    out = torch.empty(t, i, dtype=h.dtype, device=h.device)
    return _launch(SILU, h, w, out, "gate_up", j=i, second=i, tile=tile)


def linear_residual_launch(a: Tensor, w: Tensor, x: Tensor, tile: Tile | None = None) -> Tensor:
    """a [T, K], w [N, K], x [T, N] fp32 -> x + a @ w.T (rounded to a's dtype first) [T, N] fp32."""
    out = torch.empty(a.shape[0], w.shape[0], dtype=torch.float32, device=a.device)
    assert x.dtype == torch.float32 and x.shape == out.shape and x.stride(1) == 1
    return _launch(RESIDUAL, a, w, out, "residual", j=w.shape[0], x=x, tile=tile)


def qkv_rope_launch(
    h: Tensor,
    w: Tensor,
    bias: Tensor | None,
    cos: Tensor,
    sin: Tensor,
    rot_heads: int,
    head_dim: int,
    tile: Tile | None = None,
) -> Tensor:
    """h [T, K], w [(nh + 2 kvh) d, K], bias [(nh + 2 kvh) d] | None, cos/sin [T, d] fp32 -> [T, (nh+2kvh) d]
    in h's dtype, the first `rot_heads` heads (q and k) rotated (fused_gemm.qkv_rope_ref)."""
    n = w.shape[0]
    assert head_dim % 2 == 0 and n % head_dim == 0 and cos.dtype == sin.dtype == torch.float32
    assert cos.stride(1) == 1 and sin.stride() == cos.stride() and cos.shape == (h.shape[0], head_dim)
    out = torch.empty(h.shape[0], n, dtype=h.dtype, device=h.device)
    half, rot_cols = head_dim // 2, rot_heads * head_dim
    return _launch(ROPE, h, w, out, "qkv_rope", n // 2, 0, None, bias, cos, sin, half, rot_cols, tile)


def _launch(
    mode: int,
    a: Tensor,
    w: Tensor,
    out: Tensor,
    op: str,
    j: int,
    second: int = 0,
    x: Tensor | None = None,
    bias: Tensor | None = None,
    cos: Tensor | None = None,
    sin: Tensor | None = None,
    half: int = 1,
    rot_cols: int = 0,
    tile: Tile | None = None,
) -> Tensor:
    """Launch `_gemm_kernel` over a [M, K] x w [*, K] with `j` accumulator columns (module doc)."""
    m, k = a.shape
    assert w.shape[1] == k and a.stride(1) == 1 and w.stride(1) == 1 and out.is_contiguous()
    assert a.dtype == w.dtype and w.numel() < 2**31 and m > 0
    tile = tile or pick_tile(op, m, w.shape[0], k, a.device, _sm_count(a.device))
    num_m, num_n = triton.cdiv(m, tile.block_m), triton.cdiv(j, tile.block_n)
    ws = a
    if tile.split_k > 1:
        assert num_m * num_n <= _LOCK_SLOTS, "more tiles than split-K counters"
        per_tile = tile.block_m * tile.block_n * (1 if mode == RESIDUAL else 2)
        ws = torch.empty(num_m * num_n * tile.split_k * per_tile, dtype=torch.float32, device=a.device)
    _gemm_kernel[(num_m * num_n * tile.split_k,)](
        a,
        w,
        a if bias is None else bias,
        a if x is None else x,
        a if cos is None else cos,
        a if sin is None else sin,
        out,
        ws,
        _lock_buffer(a.device),
        m,
        j,
        k,
        second,
        rot_cols,
        a.stride(0),
        w.stride(0),
        0 if x is None else x.stride(0),
        0 if cos is None else cos.stride(0),
        out.stride(0),
        MODE=mode,
        NACC=1 if mode == RESIDUAL else 2,
        HALF=half,
        HAS_BIAS=bias is not None,
        BLOCK_M=tile.block_m,
        BLOCK_N=tile.block_n,
        BLOCK_K=tile.block_k,
        SPLIT_K=tile.split_k,
        EVEN_K=k % tile.block_k == 0,  # then every split walks whole blocks too
        UPCAST=not a.is_cuda and a.dtype == torch.bfloat16,
        num_warps=tile.num_warps,
        num_stages=tile.num_stages,
    )
    return out


def _lock_buffer(device: torch.device) -> Tensor:
    """The device's split-K counters (zeroed once; every launch leaves them zeroed). Made on the first
    launch, which runs before any CUDA graph capture (graphs.py warms every step up first)."""
    buf = _locks.get(device)
    if buf is None:
        buf = _locks[device] = torch.zeros(_LOCK_SLOTS, dtype=torch.int32, device=device)
    return buf


def _sm_count(device: torch.device) -> int:
    if device not in _sms:
        cuda = device.type == "cuda"
        _sms[device] = torch.cuda.get_device_properties(device).multi_processor_count if cuda else 132
    return _sms[device]


def _use_kernel(t: Tensor) -> bool:
    """The kernel runs on CUDA (and on CPU under the interpreter); prefill-sized products take cuBLAS."""
    on_device = t.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"
    return on_device and t.shape[0] <= MAX_ROWS


@torch.library.custom_op("ascent::gate_up_silu", mutates_args=())
def gate_up_silu(h: Tensor, w: Tensor) -> Tensor:
    """h [T, K], w [2I, K] -> silu(g) * u [T, I] (fused_gemm.gate_up_silu_ref)."""
    return gate_up_silu_launch(h, w) if _use_kernel(h) else gate_up_silu_ref(h, w)


@gate_up_silu.register_fake
def _(h: Tensor, w: Tensor) -> Tensor:
    return h.new_empty(h.shape[0], w.shape[0] // 2)


@torch.library.custom_op("ascent::linear_residual", mutates_args=())
def linear_residual(a: Tensor, w: Tensor, x: Tensor) -> Tensor:
    """a [T, K], w [N, K], x [T, N] fp32 -> x + a @ w.T [T, N] fp32 (fused_gemm.linear_residual_ref)."""
    return linear_residual_launch(a, w, x) if _use_kernel(a) else linear_residual_ref(a, w, x)


@linear_residual.register_fake
def _(a: Tensor, w: Tensor, x: Tensor) -> Tensor:
    return x.new_empty(a.shape[0], w.shape[0])


@torch.library.custom_op("ascent::qkv_rope", mutates_args=())
def qkv_rope(
    h: Tensor, w: Tensor, bias: Tensor | None, cos: Tensor, sin: Tensor, rot_heads: int, head_dim: int
) -> Tensor:
    """h [T, K], w [(nh+2kvh) d, K], bias | None, cos/sin [T, d] fp32 -> [T, (nh+2kvh) d], q/k rotated."""
    if _use_kernel(h):
        return qkv_rope_launch(h, w, bias, cos.contiguous(), sin.contiguous(), rot_heads, head_dim)
    return qkv_rope_ref(h, w, bias, cos, sin, rot_heads, head_dim)


@qkv_rope.register_fake
def _(h: Tensor, w: Tensor, bias: Tensor | None, cos: Tensor, sin: Tensor, rot_heads: int, head_dim: int):
    return h.new_empty(h.shape[0], w.shape[0])
