"""Sampler vs trainer logprobs, token by token, on a workload with early stops and refilled rows.

    python bench/logprob_check.py                        # CUDA: Qwen2.5-0.5B shape, bf16; CPU: tiny, fp32
    python bench/logprob_check.py --variants default,plain --requests 256 --out logprob_05b.json
    python bench/logprob_check.py --shape tiny --dtype bf16   # on the CPU too

A random-weight model (the Qwen2.5-0.5B shape of bench/e2e_workload.py on CUDA, the 64-wide tiny Qwen2 of
`ascent.models.tiny` on the CPU; its final-norm scale multiplied by --head-scale so outputs are peaked and
varied) generates with the fast engine: many requests with n samples, fewer decode rows than samples (freed
rows are refilled), per-request budgets, and as each request's stop tokens the ones its samples produced
most often in a first unconstrained run (rows stop early, at different steps). Each response is then scored
by the trainer's own logprob pass (`PolicyWorker.compute_logprobs`: packed sequences, varlen attention on
CUDA, autocast over fp32 master weights, as `ascent train` runs it) in the same dtype and in fp32. Prints,
per engine variant, mean and max |sampler - trainer| and |sampler - fp32|, |trainer - fp32|, how many tokens
differ by more than 0.5 nat and the worst ones (position in the response, length, finish reason). Variants
switch engine parts (CUDA graphs, torch.compile, Triton attention and sampler) to locate a mismatch.

Random weights show only small half-precision gaps (an SFT'd model amplifies the same gaps at single tokens);
what this bench guards is that the engine computes what the trainer computes: in fp32 both agree to ~1e-6,
and in bf16 the sampler sits far closer to the bf16 trainer than either sits to fp32 (BENCHMARKS.md,
"Sampler/trainer logprob agreement"). `main(argv)` is what `ascent bench logprob_check` would call.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import e2e_workload as W  # noqa: E402

VARIANTS = {
    "default": {},
    "no_graphs": {"cuda_graphs": False},
    "no_compile": {"compile": False},
    "torch_attention": {"attention": "torch"},
    "torch_sampler": {"sampler": "torch"},
    "plain": {"cuda_graphs": False, "compile": False, "attention": "torch", "sampler": "torch"},
}
PROMPT_TOKENS = (4, 40)  # prompt ids are drawn from this range (the char tokenizer's characters)


def build_model(root: Path, shape: str, head_scale: float, device: str) -> Path:
    """A random-weight checkpoint of `shape` (W.SHAPES; tied head) with its final norm scaled by
    head_scale."""
    from safetensors.torch import load_file, save_file

    path = W.make_checkpoint(root, shape, device)
    file = path / "model.safetensors"
    weights = load_file(str(file))
    weights["model.norm.weight"] = weights["model.norm.weight"] * head_scale  # logits x head_scale
    save_file(weights, str(file), metadata={"format": "pt"})
    return path


def make_requests(n_requests: int, samples: int, seed: int) -> list:
    """Requests with random prompts (4-47 tokens), budgets (2-39 new tokens) and seeds, n samples each."""
    from ascent.messages import GenerationRequest, SamplingParams

    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n_requests):
        length = int(torch.randint(4, 48, (1,), generator=g))
        prompt = torch.randint(*PROMPT_TOKENS, (length,), generator=g).tolist()
        params = SamplingParams(
            max_new_tokens=int(torch.randint(2, 40, (1,), generator=g)),
            n=samples,
            seed=1000 + i,
            temperature=1.0,
        )
        out.append(GenerationRequest(prompt, params, request_id=i))
    return out


def with_stop_tokens(engine: Any, reqs: list, k: int) -> list:
    """reqs with, as stop tokens, the k tokens each request's samples produce most often in an unconstrained
    run (same seeds): the rerun stops most rows early, each at its own step."""
    from dataclasses import replace

    out = []
    for req, gens in zip(reqs, engine.generate(reqs), strict=True):
        counts: dict[int, int] = {}
        for t in (t for g in gens for t in g.token_ids[1:]):
            counts[t] = counts.get(t, 0) + 1
        stops = tuple(sorted(counts, key=counts.__getitem__, reverse=True)[:k])
        out.append(replace(req, params=replace(req.params, stop_token_ids=stops)))
    return out


def trainer_logprobs(path: Path, dtype: str, device: str, runs: list[list]) -> list[list[list[float]]]:
    """runs: lists of (request, generation) pairs -> the trainer's logprobs of every response of each run,
    scored as `ascent train` scores them (one trainer for all runs)."""
    from ascent.messages import TrainSample
    from ascent.models.varlen import enable_for_training
    from ascent.trainer.policy import PolicyWorker
    from ascent.trainer.settings import TrainerSpec

    spec = TrainerSpec(str(path), device=device, dtype=dtype, max_tokens_per_micro_batch=8192, compile="auto")
    policy = PolicyWorker.from_spec(spec)
    enable_for_training(policy.model, policy.device, policy.compute_dtype, "auto")
    out = []
    for pairs in runs:
        samples = [
            TrainSample(
                prompt_ids=r.prompt_ids,
                response_ids=g.token_ids,
                loss_mask=[1] * len(g.token_ids),
                advantages=[0.0] * len(g.token_ids),
            )
            for r, g in pairs
        ]
        out.append(policy.compute_logprobs(samples, temperature=1.0, which="policy"))
    del policy
    if device == "cuda":
        torch.cuda.empty_cache()
    return out


def diff_stats(a: list[list[float]], b: list[list[float]]) -> dict[str, float]:
    """Per-token |a - b| over ragged rows -> mean, max and how many exceed 0.5 nat."""
    d = torch.tensor([abs(x - y) for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=True)])
    return {"mean": d.mean().item(), "max": d.max().item(), "over_0.5": int((d > 0.5).sum())}


def worst_tokens(pairs: list, trainer: list[list[float]], k: int = 5) -> list[dict[str, Any]]:
    """The k tokens where sampler and trainer differ most: position, response length, finish reason."""
    rows = [
        (abs(a - b), pos, len(g.token_ids), g.finish_reason, a, b)
        for (_, g), lp in zip(pairs, trainer, strict=True)
        for pos, (a, b) in enumerate(zip(g.logprobs, lp, strict=True))
    ]
    rows.sort(reverse=True)
    return [
        dict(diff=float(f"{d:.3g}"), pos=p, length=n, finish=f, sampler=round(a, 3), trainer=round(b, 3))
        for d, p, n, f, a, b in rows[:k]
    ]


def run_variant(name: str, a: argparse.Namespace, path: Path, reqs: list, stopping: list | None) -> tuple:
    """Generate with one engine variant -> ((request, generation) pairs, requests with stops, engine
    stats)."""
    from ascent.rollout.fast import build_fast_engine

    engine = build_fast_engine(
        model_path=path,
        dtype=a.dtype,
        device=a.device,
        max_batch_size=a.rows,
        max_model_len=256,
        page_size=16,
        kv_cache_tokens=a.rows * 256,
        **VARIANTS[name],
    )
    stopping = stopping or with_stop_tokens(engine, reqs, a.stop_tokens)
    engine.stats.update(steps=0, prefills=0, compactions=0)
    t0 = time.perf_counter()
    outs = engine.generate(stopping)
    stats = {k: round(v, 3) for k, v in engine.stats.items()} | {
        "generate_s": round(time.perf_counter() - t0, 2)
    }
    engine.sleep(release_weights=True)
    del engine
    pairs = [(r, g) for r, gens in zip(stopping, outs, strict=True) for g in gens if g.token_ids]
    return pairs, stopping, stats


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    cuda = torch.cuda.is_available()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", choices=sorted(W.SHAPES), default="0.5b" if cuda else "tiny")
    p.add_argument("--variants", default="default,plain" if cuda else "plain")
    p.add_argument("--requests", type=int, default=256 if cuda else 24)
    p.add_argument("--samples", type=int, default=8 if cuda else 4)
    p.add_argument(
        "--rows", type=int, default=64 if cuda else 6, help="decode rows (fewer than samples: refills)"
    )
    p.add_argument("--head-scale", type=float, default=10.0, help="final-norm scale: sharper outputs")
    p.add_argument("--stop-tokens", type=int, default=2, help="stop tokens per request (its frequent ones)")
    p.add_argument("--dtype", default="bf16" if cuda else "fp32", help="bf16 | fp32 (engine and trainer)")
    p.add_argument("--device", default="cuda" if cuda else "cpu")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    a = parse_args(argv)
    res: dict[str, Any] = W.report_header(a) | {"variants": {}}
    root = Path(tempfile.mkdtemp(prefix="logprob_check_"))
    path = build_model(root, a.shape, a.head_scale, a.device)
    reqs = make_requests(a.requests, a.samples, seed=0)
    names, runs, stats, stopping = a.variants.split(","), [], [], None
    for name in names:
        pairs, stopping, st = run_variant(name, a, path, reqs, stopping)
        runs.append(pairs)
        stats.append(st)
    trainers = trainer_logprobs(path, a.dtype, a.device, runs)
    fp32s = trainers if a.dtype == "fp32" else trainer_logprobs(path, "fp32", a.device, runs)
    for name, pairs, st, trainer, fp32 in zip(names, runs, stats, trainers, fp32s, strict=True):
        sampler = [g.logprobs for _, g in pairs]
        r = res["variants"][name] = {
            "tokens": sum(len(s) for s in sampler),
            "sequences": len(pairs),
            "stops": sum(g.finish_reason == "stop" for _, g in pairs),
            "engine": st,
            "sampler_vs_trainer": diff_stats(sampler, trainer),
            "sampler_vs_fp32": diff_stats(sampler, fp32),
            "trainer_vs_fp32": diff_stats(trainer, fp32),
            "worst": worst_tokens(pairs, trainer),
        }
        print(
            f"{name:16s} {a.shape} {a.dtype}: tokens {r['tokens']}, stops {r['stops']}/{r['sequences']}, "
            f"prefills {st['prefills']}, compactions {st['compactions']}",
            flush=True,
        )
        for key in ("sampler_vs_trainer", "sampler_vs_fp32", "trainer_vs_fp32"):
            s = r[key]
            print(
                f"    {key:20s} mean {s['mean']:.2e}  max {s['max']:.2e}  >0.5 nat: {s['over_0.5']}",
                flush=True,
            )
        for w in r["worst"][:3]:
            print("    worst:", w, flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=1))
    return res


if __name__ == "__main__":
    main()
