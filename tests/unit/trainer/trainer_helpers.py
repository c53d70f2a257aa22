"""Helpers of the trainer tests: sample builders, the naive full-logits reference and the multi-rank start."""

from __future__ import annotations

import multiprocessing
import random

import torch
import torch.multiprocessing as mp

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


# What every rank of a multi-rank test imports anyway (seconds per process on a 2-core machine).
RANK_PRELOAD = [
    "torch",
    "torch.distributed",
    "torch.distributed.checkpoint",
    "transformers",
    "ascent.trainer",
]


def spawn_ranks(fn, args: tuple, nprocs: int) -> None:
    """`torch.multiprocessing.spawn(fn, args, nprocs)` with the ranks started through a forkserver: one server
    per test session imports RANK_PRELOAD once and each rank forks from it, instead of every rank of every
    test starting an interpreter and importing torch and transformers again. The ranks are fresh processes
    all the same (the server only imported modules: no threads, no state of the test process). Raises as
    mp.spawn does (mp.ProcessRaisedException, mp.ProcessExitedException)."""
    multiprocessing.set_forkserver_preload(RANK_PRELOAD)  # used when the server starts (the first call)
    mp.start_processes(fn, args=args, nprocs=nprocs, join=True, start_method="forkserver")
