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
    row = tl.program_id(0)
    c = tl.program_id(1)
    t = tl.load(TEMP + row)
    t = tl.where(t == 0.0, 1.0, t)
    key, key2 = _row_keys(tl.load(SEEDS + row), tl.load(STEPS + row))
    m = tl.full([], float("-inf"), tl.float32)
    s = tl.zeros([], tl.float32)
    best, best_i, best_sc = (
        tl.full([], float("-inf"), tl.float32),
        tl.zeros([], tl.int32),
        tl.zeros([], tl.float32),
    )
    gbest, gbest_i = tl.full([], float("-inf"), tl.float32), tl.zeros([], tl.int32)
    for v0 in range(c * CHUNK, tl.minimum((c + 1) * CHUNK, V), BLOCK):
        offs = v0 + tl.arange(0, BLOCK)
        mask = offs < V
        x = tl.load(LOGITS + row * stride_l + offs, mask=mask, other=float("-inf")).to(tl.float32)
        sc = x / t
        m_new = tl.maximum(m, tl.max(sc, 0))
        s = s * tl.exp(m - m_new) + tl.sum(tl.exp(sc - m_new), 0)
        m = m_new
        gi = tl.argmax(x, 0)
        gv = tl.max(x, 0)
        take = gv > gbest
        gbest, gbest_i = tl.where(take, gv, gbest), tl.where(take, v0 + gi, gbest_i)
        if SAMPLE:
            h = _mix32(_mix32(offs.to(tl.uint32) ^ key) ^ key2)
            u = ((h >> 9).to(tl.float32) + 0.5) * 1.1920928955078125e-07
            if LIBDEVICE:  # torch's CUDA log is libdevice's logf: same noise, same tokens
                gumbel = -libdevice.log(-libdevice.log(u))
            else:  # the CPU interpreter has no libdevice
                gumbel = -tl.log(-tl.log(u))
            g = tl.where(mask, sc + gumbel, float("-inf"))
            bi = tl.argmax(g, 0)
            bv = tl.max(g, 0)
            take = bv > best
            bsc = tl.sum(tl.where(offs == v0 + bi, sc, 0.0), 0)
            best, best_i, best_sc = (
                tl.where(take, bv, best),
                tl.where(take, v0 + bi, best_i),
                tl.where(take, bsc, best_sc),
            )
    out = PART + (row * tl.num_programs(1) + c) * 8
    tl.store(out + 0, m)
    tl.store(out + 1, s)
    tl.store(out + 2, best)
    tl.store(out + 3, best_i.to(tl.float32))
    tl.store(out + 4, best_sc)
    tl.store(out + 5, gbest)
    tl.store(out + 6, gbest_i.to(tl.float32))


@triton.jit
def _merge_kernel(PART, TEMP, TOKENS, LOGPROBS, NC: tl.constexpr, NC_PAD: tl.constexpr, SAMPLE: tl.constexpr):
    row = tl.program_id(0)
    cs = tl.arange(0, NC_PAD)
    cm = cs < NC
    base = PART + (row * NC + cs) * 8
    m = tl.load(base + 0, mask=cm, other=float("-inf"))
    s = tl.load(base + 1, mask=cm, other=0.0)
    mx = tl.max(m, 0)
    lse = mx + tl.log(tl.sum(s * tl.exp(m - mx), 0))
    g = tl.load(base + 5, mask=cm, other=float("-inf"))
    gc = tl.argmax(g, 0)
    tok = tl.sum(tl.where(cs == gc, tl.load(base + 6, mask=cm, other=0.0), 0.0), 0)
    val = tl.max(g, 0)  # greedy rows have T = 1, so the scaled logit is the logit
    greedy = tl.load(TEMP + row) == 0.0
    if SAMPLE:
        b = tl.load(base + 2, mask=cm, other=float("-inf"))
        bc = tl.argmax(b, 0)
        stok = tl.sum(tl.where(cs == bc, tl.load(base + 3, mask=cm, other=0.0), 0.0), 0)
        sval = tl.sum(tl.where(cs == bc, tl.load(base + 4, mask=cm, other=0.0), 0.0), 0)
        tok = tl.where(greedy, tok, stok)
        val = tl.where(greedy, val, sval)
    tl.store(TOKENS + row, tok.to(tl.int64))
    tl.store(LOGPROBS + row, val - lse)


def triton_sample(
    logits: Tensor, temperature: Tensor, seeds: Tensor, steps: Tensor, all_greedy: bool, chunk: int = 8192
) -> tuple[Tensor, Tensor]:
    """logits [B, V] (any float dtype, last dim contiguous), temperature [B] (0 = greedy), seeds [B] int64,
    steps [B] int64 -> (tokens [B] int64, logprobs [B] float32), as sampling.sample without filters."""
    b, v = logits.shape
    assert logits.stride(-1) == 1
    nc = triton.cdiv(v, chunk)
    part = torch.empty(b, nc, 8, dtype=torch.float32, device=logits.device)
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
        BLOCK=1024,
        SAMPLE=sample,
        LIBDEVICE=logits.is_cuda,
        num_warps=4,
    )
    _merge_kernel[(b,)](
        part, temperature, tokens, logprobs, NC=nc, NC_PAD=max(2, triton.next_power_of_2(nc)), SAMPLE=sample
    )
    return tokens, logprobs
