"""Helpers of the trainer tests: sample builders and the naive full-logits reference."""

from __future__ import annotations

import random

import torch

from ascent.messages import TrainSample


def make_samples(n: int, seed: int = 0, vocab: int = 60, with_old: bool = True) -> list[TrainSample]:
    """n samples of different prompt/response lengths with random tokens, advantages and partial masks."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        p, r = rng.randint(1, 9), rng.randint(1, 12)
        mask = [1] * r
        if r > 3 and i % 3 == 0:
            mask[1] = 0  # a tool token in the middle of the response
        out.append(
            TrainSample(
                prompt_ids=[rng.randrange(4, vocab) for _ in range(p)],
                response_ids=[rng.randrange(4, vocab) for _ in range(r)],
                loss_mask=mask,
                advantages=[rng.uniform(-1, 1)] * r,
                old_logprobs=[rng.uniform(-5, -1) for _ in range(r)] if with_old else None,
                sampler_logprobs=[rng.uniform(-5, -1) for _ in range(r)],
                ref_logprobs=[rng.uniform(-5, -1) for _ in range(r)],
            )
        )
    return out


def naive_logprobs(model, sample: TrainSample, temperature: float = 1.0) -> torch.Tensor:
    """Reference: full-logits forward of one unpadded sequence -> logprobs [R] of its response tokens."""
    ids = torch.tensor([sample.prompt_ids + sample.response_ids])
    logits = model(input_ids=ids, use_cache=False).logits[0].float() / temperature
    p = len(sample.prompt_ids)
    targets = torch.tensor(sample.response_ids)
    return torch.log_softmax(logits[p - 1 : -1], dim=-1).gather(-1, targets[:, None])[:, 0]
