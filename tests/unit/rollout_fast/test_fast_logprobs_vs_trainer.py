"""The fast engine's per-token logprobs equal the trainer's, token by token, on a workload with early stops
and refilled rows (fp32 on the CPU: to 1e-5).

Six decode rows serve 24 requests x 4 samples, so rows are freed and refilled throughout; frequent tokens
stop rows early; budgets differ per request. The trainer scores every response with its own logprob pass
(`PolicyWorker.compute_logprobs`, packed sequences, as in `ascent train`).
"""

from __future__ import annotations

import torch

from ascent.messages import GenerationRequest, SamplingParams, TrainSample
from ascent.rollout.fast import build_fast_engine
from ascent.trainer.policy import PolicyWorker
from ascent.trainer.settings import TrainerSpec


def _requests(n: int) -> list[GenerationRequest]:
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(n):
        prompt = torch.randint(4, 60, (int(torch.randint(3, 30, (1,), generator=g)),), generator=g).tolist()
        budget = int(torch.randint(2, 20, (1,), generator=g))
        out.append(
            GenerationRequest(prompt, SamplingParams(max_new_tokens=budget, n=4, seed=100 + i), request_id=i)
        )
    return out


def test_engine_logprobs_equal_the_trainers_with_early_stops_and_refills(fast_tiny_path):
    engine = build_fast_engine(
        model_path=fast_tiny_path,
        dtype="fp32",
        device="cpu",
        page_size=16,
        max_model_len=160,
        max_batch_size=6,
    )
    reqs = _requests(24)
    first = engine.generate(reqs[:8])
    counts: dict[int, int] = {}
    for gens in first:
        for gen in gens:
            for t in gen.token_ids:
                counts[t] = counts.get(t, 0) + 1
    engine.eos = frozenset(sorted(counts, key=counts.__getitem__, reverse=True)[:4])  # rows stop early
    outs = engine.generate(reqs)
    gens = [(r, g) for r, gs in zip(reqs, outs, strict=True) for g in gs]
    assert sum(g.finish_reason == "stop" for _, g in gens) > len(gens) // 3  # many early stops
    assert engine.stats["prefills"] > 10  # freed rows were refilled by waiting requests

    spec = TrainerSpec(str(fast_tiny_path), device="cpu", max_tokens_per_micro_batch=4096, compile="auto")
    policy = PolicyWorker.from_spec(spec)
    samples = [
        TrainSample(
            prompt_ids=r.prompt_ids,
            response_ids=g.token_ids,
            loss_mask=[1] * len(g.token_ids),
            advantages=[0.0] * len(g.token_ids),
        )
        for r, g in gens
    ]
    trainer = policy.compute_logprobs(samples, temperature=1.0, which="policy")
    diffs = [
        abs(a - b)
        for (_, g), lp in zip(gens, trainer, strict=True)
        for a, b in zip(g.logprobs, lp, strict=True)
    ]
    assert len(diffs) > 300
    assert max(diffs) < 1e-5, max(diffs)
