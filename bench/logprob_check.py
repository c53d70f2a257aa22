"""Sampler vs trainer logprobs, token by token, on a workload with early stops and refilled rows.

    python bench/logprob_check.py                       # CUDA: bf16, each engine variant; CPU: fp32, small
    python bench/logprob_check.py --variants default,no_graphs --requests 256

A tiny Qwen2-architecture model (`ascent.models.tiny`, its LM head sharpened so outputs are peaked and
varied) generates with the fast engine: many requests with n samples, fewer decode rows than samples (freed
rows are refilled), random budgets, and a set of frequent tokens as stop tokens (rows stop early). Each
response is then scored by the trainer's own logprob pass (`PolicyWorker.compute_logprobs`, the packed
varlen path of `ascent train`) on the same weights. Prints mean and max |sampler - trainer| per variant,
where the worst tokens sit (position in the response, finish reason), and the same against a plain fp32
forward. Variants switch one engine part each (CUDA graphs, torch.compile, Triton attention, Triton
sampler), to locate a mismatch. `main(argv)` is what `ascent bench logprob_check` would call.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

VARIANTS = {
    "default": {},
    "no_graphs": {"cuda_graphs": False},
    "no_compile": {"compile": False},
    "torch_attention": {"attention": "torch"},
    "torch_sampler": {"sampler": "torch"},
    "plain": {"cuda_graphs": False, "compile": False, "attention": "torch", "sampler": "torch"},
}


def build_model(root: Path, hidden: int, layers: int, head_scale: float) -> Path:
    from safetensors.torch import load_file, save_file

    from ascent.models.tiny import make_tiny_checkpoint

    path = make_tiny_checkpoint(root / "model", hidden_size=hidden, num_layers=layers, num_heads=max(2, hidden // 64),
                                num_kv_heads=2, tie_word_embeddings=False, seed=1)  # fmt: skip
    weights = load_file(str(path / "model.safetensors"))
    weights["lm_head.weight"] = weights["lm_head.weight"] * head_scale
    save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path


def requests(n_requests: int, samples: int, vocab: int, seed: int):
    from ascent.types import GenerationRequest, SamplingParams

    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n_requests):
        length = int(torch.randint(4, 48, (1,), generator=g))
        prompt = torch.randint(4, vocab, (length,), generator=g).tolist()
        params = SamplingParams(max_new_tokens=int(torch.randint(2, 40, (1,), generator=g)), n=samples,
                                seed=1000 + i, temperature=1.0)  # fmt: skip
        out.append(GenerationRequest(prompt, params, request_id=i))
    return out


def frequent_tokens(engine, reqs, k: int) -> list[int]:
    """The k tokens sampled most often in a short unconstrained run: good stop tokens for early stops."""
    counts: dict[int, int] = {}
    for gens in engine.generate(reqs[:16]):
        for gen in gens:
            for t in gen.token_ids:
                counts[t] = counts.get(t, 0) + 1
    return sorted(counts, key=counts.get, reverse=True)[:k]  # type: ignore[arg-type]


def trainer_logprobs(path: Path, dtype: str, device: str, reqs, outs) -> list[list[float]]:
    from ascent.config import AlgorithmConfig, ModelConfig, TrainConfig
    from ascent.models.varlen import enable_for_training
    from ascent.trainer.policy import PolicyWorker
    from ascent.types import TrainSample

    policy = PolicyWorker.from_config(
        model_cfg=ModelConfig(path=str(path), dtype=dtype), train_cfg=TrainConfig(max_tokens_per_micro_batch=8192),
        algo_cfg=AlgorithmConfig(), total_optimizer_steps=1, temperature=1.0, device=torch.device(device),
    )  # fmt: skip
    enable_for_training(policy.model, policy.device, policy.compute_dtype, "auto")
    samples = [
        TrainSample(
            prompt_ids=r.prompt_ids,
            response_ids=g.token_ids,
            loss_mask=[1] * len(g.token_ids),
            advantages=[0.0] * len(g.token_ids),
        )  # fmt: skip
        for r, gens in zip(reqs, outs, strict=True)
        for g in gens
        if g.token_ids
    ]
    return policy.compute_logprobs(samples, temperature=1.0, which="policy")


def compare(reqs, outs, trainer: list[list[float]]) -> dict:
    diffs, worst = [], []
    gens = [(r, g) for r, gs in zip(reqs, outs, strict=True) for g in gs if g.token_ids]
    for (_, g), lp in zip(gens, trainer, strict=True):
        for pos, (a, b) in enumerate(zip(g.logprobs, lp, strict=True)):
            d = abs(a - b)
            diffs.append(d)
            worst.append((d, pos, len(g.token_ids), g.finish_reason, a, b))
    worst.sort(reverse=True)
    t = torch.tensor(diffs)
    return {
        "tokens": len(diffs),
        "mean": t.mean().item(),
        "max": t.max().item(),
        "over_0.5": int((t > 0.5).sum()),
        "worst": [
            dict(diff=round(d, 4), pos=p, length=n, finish=f, sampler=round(a, 3), trainer=round(b, 3))
            for d, p, n, f, a, b in worst[:5]
        ],  # fmt: skip
        "stops": sum(g.finish_reason == "stop" for _, g in gens),
        "sequences": len(gens),
    }


def main(argv: list[str] | None = None) -> int:
    from ascent.rollout.fast import build_fast_engine

    cuda = torch.cuda.is_available()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variants", default=",".join(VARIANTS) if cuda else "plain")
    p.add_argument("--requests", type=int, default=192 if cuda else 24)
    p.add_argument("--samples", type=int, default=8 if cuda else 4)
    p.add_argument(
        "--rows", type=int, default=64 if cuda else 6, help="decode rows (fewer than samples: refills)"
    )
    p.add_argument("--hidden", type=int, default=384 if cuda else 64)
    p.add_argument("--layers", type=int, default=6 if cuda else 2)
    p.add_argument("--head-scale", type=float, default=10.0)
    p.add_argument("--stop-tokens", type=int, default=6, help="how many frequent tokens stop a row")
    p.add_argument("--dtype", default=None, help="bf16 | fp32 (default: bf16 on CUDA, fp32 on CPU)")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    a = p.parse_args(argv)
    dtype, device = ("bf16", "cuda") if cuda else ("fp32", "cpu")
    dtype = a.dtype or dtype
    root = Path(tempfile.mkdtemp(prefix="logprob_check_"))
    path = build_model(root, a.hidden, a.layers, a.head_scale)
    reqs = requests(a.requests, a.samples, 60, seed=0)
    results = {}
    stops = None
    for name in a.variants.split(","):
        engine = build_fast_engine(model_path=path, dtype=dtype, device=device, max_batch_size=a.rows,
                                   max_model_len=256, page_size=16, kv_cache_tokens=a.rows * 256, **VARIANTS[name])  # fmt: skip
        stops = stops or frequent_tokens(engine, reqs, a.stop_tokens)
        engine.eos = frozenset(stops)
        outs = engine.generate(reqs)
        results[name] = compare(reqs, outs, trainer_logprobs(path, dtype, device, reqs, outs))
        results[name]["engine_stats"] = {k: round(v, 3) for k, v in engine.stats.items()}
        engine.sleep(release_weights=True)
        del engine
        r = results[name]
        print(f"{name:16s} tokens {r['tokens']:6d}  stops {r['stops']:5d}/{r['sequences']:5d}  mean {r['mean']:.2e}  "
              f"max {r['max']:.3f}  >0.5 nat: {r['over_0.5']}", flush=True)  # fmt: skip
        for w in r["worst"][:3]:
            print("    worst:", w, flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
