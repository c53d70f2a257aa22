"""Batched, pure-torch token sampling shared by every rollout engine (contracts: "ascent.rollout").

One call turns next-token logits [B, V] into sampled tokens [B] and their logprobs [B], with per-row
temperature, top-k, top-p, min-p and repetition penalty. It runs on CPU and GPU, has no Python loop over
rows or vocabulary, and makes no host-device sync, so a CUDA-graph engine can capture it for a fixed batch.

Logprob convention: the returned logprob is `log_softmax(logits / T)` of the sampled token, computed on the
raw logits *before* repetition penalty and top-k/top-p/min-p filtering (T = 1 for greedy rows, T = 0).
That is exactly what the trainer recomputes, so the two agree on identical weights.

Randomness is counter-based: each row's noise is a hash of (row seed, step, token id), so a seeded request
samples the same tokens whatever else shares its batch and whichever engine runs it. The noise feeds the
exponential-race (Gumbel-max) trick: argmax(log p_i - log E_i) with E_i ~ Exp(1) draws i with
probability p_i.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from ascent.messages import SamplingParams

_M32 = 0xFFFFFFFF
_M63 = (1 << 63) - 1


def _mul32(x: Tensor, c: int) -> Tensor:
    """(x * c) mod 2**32 for int64 x in [0, 2**32), split in 16-bit halves so int64 never overflows."""
    lo = x * (c & 0xFFFF)
    hi = ((x * (c >> 16)) & 0xFFFF) << 16
    return (lo + hi) & _M32


def _mix32(x: Tensor) -> Tensor:
    """A bijective 32-bit integer hash (xor-shift-multiply) on int64 tensors holding values in [0, 2**32)."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def uniform_noise(seeds: Tensor, steps: Tensor, vocab_size: int, offset: int = 0) -> Tensor:
    """seeds [B] int64 (>= 0), steps [B] int64 -> uniform noise [B, V] float32 in (0, 1) of token ids
    offset .. offset + V - 1 (a vocabulary slice: a vocab-parallel rank's, fast/tp_head.py).

    A pure function of (seed, step, token id): rows never share state, so results do not depend on the
    batch. Resolution is 2**-23 (values (k + 0.5) / 2**23), which keeps -log(u) finite and positive.
    """
    seeds, steps = seeds.long(), steps.long()
    key = _mix32((seeds & _M32) ^ _mix32(((seeds >> 32) & _M32) ^ 0x5BD1E995))
    key = _mix32(key ^ _mix32((steps & _M32) ^ 0x1B873593))  # [B]
    key2 = _mix32(key ^ 0x68E31DA4)
    vocab = torch.arange(offset, offset + vocab_size, device=seeds.device, dtype=torch.long)
    h = _mix32(_mix32(vocab[None, :] ^ key[:, None]) ^ key2[:, None])  # [B, V]
    return ((h >> 9).float() + 0.5) * (2.0**-23)


def split_seed(seed: int, index: int) -> int:
    """A 63-bit seed for sample `index` of a request seeded with `seed` (splitmix64 of both; pure Python)."""
    z = (seed * 0x9E3779B97F4A7C15 + (index + 1) * 0xBF58476D1CE4E5B9) & ((1 << 64) - 1)
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & ((1 << 64) - 1)
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & ((1 << 64) - 1)
    return (z ^ (z >> 31)) & _M63


def token_presence(token_ids: Tensor, vocab_size: int) -> Tensor:
    """token_ids [B, L] int64 (-1 = padding) -> seen [B, V] bool: which tokens each row contains."""
    idx = torch.where(token_ids >= 0, token_ids, vocab_size)
    seen = torch.zeros(token_ids.shape[0], vocab_size + 1, dtype=torch.bool, device=token_ids.device)
    return seen.scatter_(1, idx, True)[:, :vocab_size]


def apply_repetition_penalty(logits: Tensor, penalty: Tensor, seen: Tensor) -> Tensor:
    """logits [B, V], penalty [B], seen [B, V] bool -> logits [B, V] with seen tokens made less likely.

    The usual CTRL rule: a seen token's positive logit is divided by the penalty, a negative one multiplied.
    """
    pen = penalty[:, None].to(logits.dtype)
    penalised = torch.where(logits > 0, logits / pen, logits * pen)
    return torch.where(seen, penalised, logits)


def top_k_top_p_mask(scaled: Tensor, top_k: Tensor, top_p: Tensor) -> Tensor:
    """scaled logits [B, V], top_k [B] (0 = off), top_p [B] (1 = off) -> removed [B, V] bool.

    Top-k keeps the k highest logits. Top-p then keeps, of those, the fewest most likely tokens whose
    renormalised mass reaches top_p (a token is dropped when the mass strictly above it is >= top_p).
    The most likely token is always kept.
    """
    sorted_logits, order = scaled.sort(dim=-1, descending=True)
    rank = torch.arange(scaled.shape[-1], device=scaled.device)[None, :]
    drop = (top_k[:, None] > 0) & (rank >= top_k[:, None])
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    probs = sorted_logits.softmax(dim=-1)
    mass_above = probs.cumsum(dim=-1) - probs
    drop = drop | ((top_p[:, None] < 1.0) & (mass_above >= top_p[:, None]))
    drop[:, 0] = False
    return torch.zeros_like(drop).scatter_(1, order, drop)


def min_p_mask(scaled: Tensor, min_p: Tensor) -> Tensor:
    """scaled logits [B, V], min_p [B] (0 = off) -> removed [B, V] bool: tokens with p < min_p * p_max."""
    gap = scaled - scaled.max(dim=-1, keepdim=True).values  # log(p / p_max)
    return gap < torch.log(min_p)[:, None]


@dataclass
class SamplingTensors:
    """Per-row sampling parameters of a batch as device tensors [B], plus host flags that skip unused work.

    Build once per batch with `from_params`; the flags are plain bools, so `sample` makes no device sync.
    """

    temperature: Tensor  # [B] float32; 0 = greedy
    top_k: Tensor  # [B] int64; 0 = off
    top_p: Tensor  # [B] float32; 1 = off
    min_p: Tensor  # [B] float32; 0 = off
    repetition_penalty: Tensor  # [B] float32; 1 = off
    seeds: Tensor  # [B] int64 in [0, 2**63)
    use_top_k_top_p: bool = True
    use_min_p: bool = True
    use_penalty: bool = True
    all_greedy: bool = False

    @classmethod
    def from_params(
        cls, params: Sequence[SamplingParams], seeds: Sequence[int], device: torch.device | str = "cpu"
    ) -> SamplingTensors:
        """params and seeds: one per row."""

        def f32(values: list[float]) -> Tensor:
            return torch.tensor(values, dtype=torch.float32, device=device)

        return cls(
            temperature=f32([p.temperature for p in params]),
            top_k=torch.tensor([p.top_k for p in params], dtype=torch.long, device=device),
            top_p=f32([p.top_p for p in params]),
            min_p=f32([p.min_p for p in params]),
            repetition_penalty=f32([p.repetition_penalty for p in params]),
            seeds=torch.tensor([s & _M63 for s in seeds], dtype=torch.long, device=device),
            use_top_k_top_p=any(p.top_k > 0 or p.top_p < 1.0 for p in params),
            use_min_p=any(p.min_p > 0 for p in params),
            use_penalty=any(p.repetition_penalty != 1.0 for p in params),
            all_greedy=all(p.temperature == 0 for p in params),
        )


def sample(
    logits: Tensor,
    st: SamplingTensors,
    steps: Tensor,
    seen: Tensor | None = None,
    allowed: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """logits [B, V], steps [B] int64 (token index within each response), seen [B, V] bool | None,
    allowed [B, V] bool | None -> (tokens [B] int64, logprobs [B] float32).

    `seen` (prompt + generated tokens so far, see `token_presence`) is needed only for repetition penalty.
    `allowed` (a grammar's mask; every row must allow a token) removes the other tokens like the filters do:
    the logprob is still that of the unfiltered distribution.
    """
    logits = logits.float()
    greedy = st.temperature == 0
    temp = torch.where(greedy, torch.ones_like(st.temperature), st.temperature)[:, None]
    logprobs_all = torch.log_softmax(logits / temp, dim=-1)  # the convention: raw logits, before filters
    if st.use_penalty:
        if seen is None:
            raise ValueError("repetition_penalty != 1 needs `seen` (prompt + generated tokens) in sample().")
        logits = apply_repetition_penalty(logits, st.repetition_penalty, seen)
    if allowed is not None:
        logits = logits.masked_fill(~allowed, float("-inf"))
    greedy_tokens = logits.argmax(dim=-1)
    if st.all_greedy:
        tokens = greedy_tokens
    else:
        scaled = logits / temp
        removed = torch.zeros_like(scaled, dtype=torch.bool)
        if st.use_top_k_top_p:
            removed |= top_k_top_p_mask(scaled, st.top_k, st.top_p)
        if st.use_min_p:
            removed |= min_p_mask(scaled, st.min_p)
        scaled = scaled.masked_fill(removed, float("-inf"))
        noise = uniform_noise(st.seeds, steps, logits.shape[-1])
        sampled = (scaled - torch.log(-torch.log(noise))).argmax(dim=-1)
        tokens = torch.where(greedy, greedy_tokens, sampled)
    logprobs = logprobs_all.gather(1, tokens[:, None]).squeeze(1)
    return tokens, logprobs
