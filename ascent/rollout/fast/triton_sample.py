"""Triton sampler for the common case: temperature (or greedy) sampling, no top-k/top-p/min-p/penalty.

It computes what `ascent.rollout.sampling.sample` computes (same counter-based noise, bit for bit: the
hash runs in uint32 here instead of masked int64, and the logs use libdevice like torch's CUDA kernels),
in one pass over the logits instead of several: each program reads one chunk of one row, keeping an online
log-sum-exp, the best Gumbel score and the greedy argmax; a second kernel merges the chunks and returns
the token and its logprob `log_softmax(logits / T)[token]`. Other sampling options use sampling.py.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor
from triton.language.extra import libdevice


@triton.jit
def _mix32(x):
    """The xor-shift-multiply hash of sampling._mix32 on uint32 values."""
    x = x ^ (x >> 16)
    x = x * 0x7FEB352D
    x = x ^ (x >> 15)
    x = x * 0x846CA68B
    return x ^ (x >> 16)


@triton.jit
def _row_keys(seed, step):
    """(key, key2) of sampling.uniform_noise for one row: seed int64, step int64 -> uint32 scalars."""
    lo = (seed & 0xFFFFFFFF).to(tl.uint32)
    hi = ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32)
    key = _mix32(lo ^ _mix32(hi ^ 0x5BD1E995))
    key = _mix32(key ^ _mix32((step & 0xFFFFFFFF).to(tl.uint32) ^ 0x1B873593))
    return key, _mix32(key ^ 0x68E31DA4)


@triton.jit
def _hash_bits(offs, key, key2):
    """The 23 noise bits of vocabulary entries `offs` (uint32 math of sampling.uniform_noise)."""
    return _mix32(_mix32(offs.to(tl.uint32) ^ key) ^ key2) >> 9


@triton.jit
def _gumbel(bits, LIBDEVICE: tl.constexpr):
    """Gumbel noise -log(-log(u)) of u = (bits + 0.5) / 2**23, as sampling.py draws it."""
    u = (bits.to(tl.float32) + 0.5) * 1.1920928955078125e-07
    if LIBDEVICE:  # torch's CUDA log is libdevice's logf: same noise, same tokens
        return -libdevice.log(-libdevice.log(u))
    return -tl.log(-tl.log(u))  # the CPU interpreter has no libdevice


@triton.jit
def _partial_kernel(
    LOGITS,
    stride_l,
    TEMP,
    SEEDS,
    STEPS,
    PART,
    V,
    CHUNK: tl.constexpr,
    BLOCK: tl.constexpr,
    SAMPLE: tl.constexpr,
    LIBDEVICE: tl.constexpr,
):
    """One (row, chunk): online log-sum-exp of logits / T, the greedy argmax, and the best Gumbel score.

    The Gumbel scores of a block are computed only where some entry could still win. A lower bound LB of
    the winning score is known (the best so far, or the block's top logit plus its own noise), and entry i
    can reach LB only if its E_i = -log(u_i) <= exp(sc_i - LB): since E_i >= 1 - u_i (exact in fp32), an
    entry with 1 - u_i > exp(sc_i - LB + 1e-3) cannot, which costs a hash and a multiply of the exp the
    log-sum-exp computes anyway. The margin covers the exp's rounding, so the token is the one scoring
    every entry would give, bit for bit."""
    row = tl.program_id(0)
    c = tl.program_id(1)
    t = tl.load(TEMP + row)
    t = tl.where(t == 0.0, 1.0, t)
    key, key2 = _row_keys(tl.load(SEEDS + row), tl.load(STEPS + row))
    m = tl.full([], float("-inf"), tl.float32)
    s = tl.zeros([], tl.float32)
    best, best_i = tl.full([], float("-inf"), tl.float32), tl.zeros([], tl.int32)
    gbest, gbest_i = tl.full([], float("-inf"), tl.float32), tl.zeros([], tl.int32)
    for v0 in range(c * CHUNK, tl.minimum((c + 1) * CHUNK, V), BLOCK):
        offs = v0 + tl.arange(0, BLOCK)
        mask = offs < V
        sc = tl.load(LOGITS + row * stride_l + offs, mask=mask, other=float("-inf")).to(tl.float32) / t
        top, j = tl.max(sc, 0, return_indices=True)  # greedy rows have T = 1: sc is the logit
        m_new = tl.maximum(m, top)
        e = tl.exp(sc - m_new)
        s = s * tl.exp(m - m_new) + tl.sum(e, 0)
        m = m_new
        take = top > gbest
        gbest, gbest_i = tl.where(take, top, gbest), tl.where(take, v0 + j, gbest_i)
        if SAMPLE:
            bits = _hash_bits(offs, key, key2)
            top_score = top + _gumbel(_hash_bits(v0 + j, key, key2), LIBDEVICE)
            lb = tl.maximum(best, top_score)
            one_minus_u = (8388608.0 - bits.to(tl.float32) - 0.5) * 1.1920928955078125e-07
            reach = e * tl.exp(m - lb + 1e-3)  # exp(sc - LB + margin)
            rivals = tl.sum(((one_minus_u <= reach) & (offs != v0 + j)).to(tl.int32), 0)
            if rivals > 0:  # score the whole block, as without the bound
                g = tl.where(mask, sc + _gumbel(bits, LIBDEVICE), float("-inf"))
                bv, bi = tl.max(g, 0, return_indices=True)
            else:  # no entry but the top one can reach LB
                bv, bi = top_score, j
            take = bv > best
            best, best_i = tl.where(take, bv, best), tl.where(take, v0 + bi, best_i)
    out = PART + (row * tl.num_programs(1) + c) * 6  # m, s, best score and its index, top logit and its index
    tl.store(out + 0, m)
    tl.store(out + 1, s)
    tl.store(out + 2, best)
    tl.store(out + 3, best_i.to(tl.float32))
    tl.store(out + 4, gbest)
    tl.store(out + 5, gbest_i.to(tl.float32))


@triton.jit
def _merge_kernel(
    PART,
    LOGITS,
    stride_l,
    TEMP,
    TOKENS,
    LOGPROBS,
    NC: tl.constexpr,
    NC_PAD: tl.constexpr,
    SAMPLE: tl.constexpr,
):
    row = tl.program_id(0)
    cs = tl.arange(0, NC_PAD)
    cm = cs < NC
    base = PART + (row * NC + cs) * 6
    m = tl.load(base + 0, mask=cm, other=float("-inf"))
    s = tl.load(base + 1, mask=cm, other=0.0)
    mx = tl.max(m, 0)
    lse = mx + tl.log(tl.sum(s * tl.exp(m - mx), 0))
    g = tl.load(base + 4, mask=cm, other=float("-inf"))
    gc = tl.argmax(g, 0)
    tok = tl.sum(tl.where(cs == gc, tl.load(base + 5, mask=cm, other=0.0), 0.0), 0)
    val = tl.max(g, 0)  # greedy rows have T = 1, so the scaled logit is the logit
    greedy = tl.load(TEMP + row) == 0.0
    if SAMPLE:
        b = tl.load(base + 2, mask=cm, other=float("-inf"))
        bc = tl.argmax(b, 0)
        stok = tl.sum(tl.where(cs == bc, tl.load(base + 3, mask=cm, other=0.0), 0.0), 0)
        t = tl.where(greedy, 1.0, tl.load(TEMP + row))
        sval = tl.load(LOGITS + row * stride_l + stok.to(tl.int64)).to(tl.float32) / t  # as the partial's sc
        tok = tl.where(greedy, tok, stok)
        val = tl.where(greedy, val, sval)
    tl.store(TOKENS + row, tok.to(tl.int64))
    tl.store(LOGPROBS + row, val - lse)


# (chunk, block, warps) of the partial kernel: a program reduces `chunk` logits of one row, `block` at a time
# (bench/sampler_sweep.py times the choices: this one was the fastest on an H200, 2026-11-28)
CONFIG = (8192, 512, 2)


def triton_sample(
    logits: Tensor,
    temperature: Tensor,
    seeds: Tensor,
    steps: Tensor,
    all_greedy: bool,
    config: tuple[int, int, int] | None = None,
) -> tuple[Tensor, Tensor]:
    """logits [B, V] (any float dtype, last dim contiguous), temperature [B] (0 = greedy), seeds [B] int64,
    steps [B] int64 -> (tokens [B] int64, logprobs [B] float32), as sampling.sample without filters.
    `config` = (chunk, block, warps), CONFIG when None: the result does not depend on it beyond rounding."""
    chunk, block, warps = config or CONFIG
    b, v = logits.shape
    assert logits.stride(-1) == 1 and chunk % block == 0
    nc = triton.cdiv(v, chunk)
    part = torch.empty(b, nc, 6, dtype=torch.float32, device=logits.device)
    tokens = torch.empty(b, dtype=torch.long, device=logits.device)
    logprobs = torch.empty(b, dtype=torch.float32, device=logits.device)
    sample = not all_greedy
    _partial_kernel[(b, nc)](
        logits,
        logits.stride(0),
        temperature,
        seeds,
        steps,
        part,
        v,
        CHUNK=chunk,
        BLOCK=block,
        SAMPLE=sample,
        LIBDEVICE=logits.is_cuda,
        num_warps=warps,
    )
    nc_pad = max(2, triton.next_power_of_2(nc))
    _merge_kernel[(b,)](
        part, logits, logits.stride(0), temperature, tokens, logprobs, NC=nc, NC_PAD=nc_pad, SAMPLE=sample
    )
    return tokens, logprobs
