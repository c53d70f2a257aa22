"""Vocab-parallel LM head of a tensor-parallel replica: each rank's logits slice, one exact sample of the whole.

Rank r computes the logits of its rows [start, end) of the LM head (`vocab_slice`: ceil(V / size) each, the
last rank fewer) and reduces them to five numbers per row (`local_candidates`): its best candidate's key,
token id and scaled logit, and the max and sum-of-exponentials of its scaled logits. One all-gather of those
[B, 5] values (a few KiB) replaces the [B, V] logits: `combine` picks, per row, the rank with the largest
key (the lowest rank on a tie, as argmax over the whole vocabulary picks the lowest id) and merges the
log-sum-exps into the chosen token's logprob.

It is `ascent.rollout.sampling.sample` restricted to plain batches (temperature or greedy; no top-k/top-p,
min-p, repetition penalty or allowed-token mask): a sampled row's key is `scaled - log(-log(u))` with the
same counter-based noise, keyed by the GLOBAL token id (`uniform_noise(..., offset=start)`), a greedy row's
key is its largest logit, so the argmax over ranks of the per-rank argmaxes is the argmax over the whole
vocabulary: the same token as one process, given the same logits. The logprob is `log_softmax(logits /
T)[token]` as there (T = 1 for greedy rows), its log-sum-exp merged from the ranks' (`combine`; equal to
one process's up to float rounding). Batches that need the whole distribution are sampled by the driver
from the full logits (tensor_parallel.py: `ShardRunner.decode`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ascent.rollout.sampling import uniform_noise

STATS = 5  # per row and rank: key, global token id, its scaled logit, max scaled logit, sum exp(scaled - max)
MAX_VOCAB = 1 << 24  # token ids travel as fp32 values: exact below 2**24


def vocab_slice(vocab: int, rank: int, size: int) -> tuple[int, int]:
    """Rank `rank`'s rows [start, end) of a [vocab, H] LM head: ceil(vocab / size) rows each, the last fewer."""
    if vocab >= MAX_VOCAB:
        raise ValueError(
            f"vocab-parallel LM head: vocab_size={vocab} >= 2**24 (token ids travel as fp32); turn it off "
            "with build_fast_engine(vocab_parallel=False) or ASCENT_FAST_ENGINE='{\"vocab_parallel\": false}'."
        )
    per = -(-vocab // size)
    return min(rank * per, vocab), min((rank + 1) * per, vocab)


def local_candidates(
    logits: Tensor, temperature: Tensor, seeds: Tensor, steps: Tensor, offset: int, all_greedy: bool
) -> Tensor:
    """logits [B, Vs] fp32 of token ids offset .. offset + Vs - 1 (this rank's slice), temperature [B]
    (0 = greedy), seeds [B] int64, steps [B] int64 -> stats [B, STATS] fp32: (key, global token id, its
    scaled logit, max scaled logit, sum of exp(scaled - max)). `all_greedy`: no noise at all."""
    greedy = temperature == 0
    temp = torch.where(greedy, torch.ones_like(temperature), temperature)[:, None]
    scaled = logits.float() / temp
    m = scaled.max(dim=-1).values
    s = torch.exp(scaled - m[:, None]).sum(dim=-1)
    if all_greedy:
        idx, key, val = scaled.argmax(dim=-1), m, m
    else:
        noise = uniform_noise(seeds, steps, logits.shape[-1], offset)
        score = scaled - torch.log(-torch.log(noise))
        sampled = score.argmax(dim=-1)
        idx = torch.where(greedy, scaled.argmax(dim=-1), sampled)
        key = torch.where(greedy, m, score.gather(1, sampled[:, None])[:, 0])
        val = scaled.gather(1, idx[:, None])[:, 0]
    return torch.stack([key, (idx + offset).float(), val, m, s], dim=1)


def combine(stats: Tensor) -> tuple[Tensor, Tensor]:
    """stats [size, B, STATS] (every rank's `local_candidates`, in rank order) -> (tokens [B] int64,
    logprobs [B] fp32) of the whole vocabulary."""
    key, idx, val, m, s = stats.unbind(dim=-1)  # each [size, B]
    win = key.argmax(dim=0)[None]  # the first (lowest) rank holding the largest key
    mx = m.max(dim=0).values
    lse = mx + torch.log((s * torch.exp(m - mx)).sum(dim=0))
    return idx.gather(0, win)[0].long(), val.gather(0, win)[0] - lse
