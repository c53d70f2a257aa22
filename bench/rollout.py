"""Rollout engine benchmark: the fast engine against transformers `generate`, same batch, same run.

    python bench/rollout.py --shape 0.5b --prompts 32 --samples 8 --prompt-len 512 --new-tokens 512 --baseline

Random-weight Qwen2.5-0.5B / 1.5B shapes built from a Qwen2Config (no downloads), bf16, on one GPU. Reports
new tokens/s, ms per decode step, the step's share of the bandwidth roofline (weights + KV cache read at the
mean context, over device-to-device copy bandwidth measured in the same run), and peak memory. `--mixed`
draws prompt lengths and output budgets at random and stops sequences at random through stop tokens, with
more samples than decode rows, so continuous batching refills freed rows. `main(argv)` is what
`ascent bench rollout` calls.
"""

from __future__ import annotations

import argparse
import functools
import json
import random
import sys
import time
from pathlib import Path

import torch
from step_profile import categorize, dense_category  # bench/step_profile.py, beside this script
from step_profile import profile_decode as kernel_ms

SHAPES = {
    "0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14),
    "1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12),
}


def make_model(shape: str, device: torch.device):
    """A randomly initialised Qwen2.5-shaped causal LM in bf16 on `device`."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(
        vocab_size=151936,
        num_key_value_heads=2,
        max_position_embeddings=32768,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        dtype="bfloat16",
        **SHAPES[shape],
    )
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16, attn_implementation="sdpa")
    return model.eval()


def copy_bandwidth(device: torch.device, nbytes: int = 1 << 30) -> float:
    """Device-to-device copy bandwidth in bytes/s, counting bytes read plus bytes written (median of 10)."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device).random_()
    dst = torch.empty_like(src)
    times = []
    for _ in range(12):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    del src, dst
    return 2 * nbytes / sorted(times[2:])[len(times[2:]) // 2]


def make_requests(args, rng: random.Random, new_tokens: int | None = None):
    """The workload: `prompts` prompts x `samples` samples (mixed: random lengths, budgets, stop tokens)."""
    from ascent.messages import GenerationRequest, SamplingParams

    stop = tuple(rng.sample(range(151936), 600)) if args.mixed else ()
    reqs = []
    for i in range(args.prompts):
        plen = rng.randint(args.prompt_len // 4, args.prompt_len) if args.mixed else args.prompt_len
        budget = new_tokens or (
            rng.randint(args.new_tokens // 8, args.new_tokens) if args.mixed else args.new_tokens
        )
        params = SamplingParams(
            temperature=1.0, max_new_tokens=budget, n=args.samples, seed=i, stop_token_ids=stop
        )
        reqs.append(GenerationRequest([rng.randrange(151936) for _ in range(plen)], params, request_id=i))
    return reqs


def timed(fn):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return out, time.perf_counter() - t0


def weight_bytes(model) -> int:
    """Bytes one decode step must read of the weights (tied embedding counted once: the LM head reads it)."""
    seen, total = set(), 0
    for p in model.parameters():
        if p.data_ptr() not in seen:
            seen.add(p.data_ptr())
            total += p.numel() * p.element_size()
    return total


def bench_fast(args, model, device) -> dict:
    """Build the engine, warm it up (compile + graph capture), time prefill-only and the full workload."""
    from ascent.rollout.fast import build_fast_engine

    t0 = time.perf_counter()
    engine = build_fast_engine(
        model=model,
        dtype=torch.bfloat16,
        device=device,
        eos_token_ids=[],
        max_batch_size=args.max_batch_size,
        max_model_len=args.prompt_len + args.new_tokens + 16,
        gpu_memory_fraction=args.gpu_memory_fraction,
        compile=not args.no_compile,
        cuda_graphs=not args.no_graphs,
        share_weights=args.share_weights,
        attn_options=args.attn_options,
        **({"page_size": args.page_size} if args.page_size else {}),
    )
    build_s = time.perf_counter() - t0
    rng = random.Random(0)
    _, warm_s = timed(lambda: engine.generate(make_requests(args, rng, new_tokens=4)))
    _, warm2_s = timed(lambda: engine.generate(make_requests(args, rng, new_tokens=4)))
    _, prefill_s = timed(lambda: engine.generate(make_requests(args, random.Random(1), new_tokens=1)))
    torch.cuda.reset_peak_memory_stats(device)
    steps0 = engine.stats["steps"]
    out, total_s = timed(lambda: engine.generate(make_requests(args, random.Random(1))))
    steps = engine.stats["steps"] - steps0
    gens = [g for req in out for g in req]
    new = sum(len(g.token_ids) for g in gens)
    res = dict(
        build_s=build_s,
        warmup_s=warm_s,
        warmup2_s=warm2_s,
        prefill_s=prefill_s,
        total_s=total_s,
        steps=steps,
        new_tokens=new,
        tokens_per_s=new / total_s,
        kv_cache_gib=engine.cache.nbytes / 2**30,
        peak_gib=torch.cuda.max_memory_allocated(device) / 2**30,
        stats=dict(engine.stats),
        mean_len=new / len(gens),
        finish={r: sum(g.finish_reason == r for g in gens) for r in ("stop", "length")},
    )
    res["decode_ms_per_step"] = 1e3 * (total_s - prefill_s) / max(1, steps)
    res["engine"] = engine
    return res


def roofline(args, model, res: dict, bw: float) -> dict:
    """Bytes per decode step at the mean context and the roofline time they take at copy bandwidth."""
    from ascent.rollout.fast.spec import spec_from_config

    spec = spec_from_config(model.config)
    batch = min(args.prompts * args.samples, args.max_batch_size)
    mean_ctx = args.prompt_len + args.new_tokens / 2
    kv = batch * mean_ctx * spec.kv_bytes_per_token(torch.bfloat16)
    wb = weight_bytes(model)
    t = (wb + kv) / bw
    return dict(
        weight_gb=wb / 1e9,
        kv_gb_per_step=kv / 1e9,
        roofline_ms=1e3 * t,
        copy_bw_tbs=bw / 1e12,
        pct_roofline=100 * 1e3 * t / res["decode_ms_per_step"],
    )


def bench_baseline(args, model, device) -> dict:
    """transformers generate on the same batch (prompts x samples rows), sampling, EOS off."""
    n = min(args.new_tokens, args.baseline_new_tokens)
    rng = random.Random(1)
    reqs = make_requests(args, rng)
    ids = torch.tensor([r.prompt_ids for r in reqs for _ in range(args.samples)], device=device)
    kw = dict(
        max_new_tokens=n,
        min_new_tokens=n,
        do_sample=True,
        top_k=0,
        top_p=1.0,
        temperature=1.0,
        pad_token_id=0,
        eos_token_id=None,
    )
    with torch.no_grad():
        model.generate(
            ids[:8], attention_mask=torch.ones_like(ids[:8]), **dict(kw, max_new_tokens=2, min_new_tokens=2)
        )
        torch.cuda.reset_peak_memory_stats(device)
        _, secs = timed(lambda: model.generate(ids, attention_mask=torch.ones_like(ids), **kw))
    return dict(
        new_tokens=n * ids.shape[0],
        total_s=secs,
        tokens_per_s=n * ids.shape[0] / secs,
        ms_per_step=1e3 * secs / n,
        peak_gib=torch.cuda.max_memory_allocated(device) / 2**30,
    )


SWEEP = [  # (page, block_n, warps, stages, splits)
    *[(16, 16, 4, st, sp) for st in (2, 3) for sp in (1, 2)],
    *[(32, 32, 4, st, sp) for st in (1, 2, 3, 4) for sp in (1, 2)],
    *[(64, bn, w, st, sp) for bn in (32, 64) for w in (4, 8) for st in (2, 3) for sp in (1, 2)],
    *[(128, 64, 4, st, sp) for st in (2, 3) for sp in (1, 2)],
]


def attn_sweep(device, batch=256, ctx=768, nh=14, kvh=2, d=64) -> list[dict]:
    """Time the Triton paged decode kernel over (page, block, warps, stages, splits) against dense SDPA."""
    import triton.testing as tt

    from ascent.rollout.fast.triton_decode import paged_decode_attention

    kv_bytes = 2 * batch * ctx * kvh * d * 2
    q = torch.randn(batch, nh, d, dtype=torch.bfloat16, device=device)
    kd = torch.randn(batch, kvh, ctx, d, dtype=torch.bfloat16, device=device)
    vd = torch.randn_like(kd)
    sdpa = functools.partial(
        torch.nn.functional.scaled_dot_product_attention, q[:, :, None], kd, vd, enable_gqa=True
    )
    ms = tt.do_bench(sdpa, return_mode="median")
    out = [dict(kernel="sdpa_dense_gqa", us=ms * 1e3, gbs=kv_bytes / ms / 1e6)]
    del kd, vd, sdpa
    ctx_t = torch.full((batch,), ctx, dtype=torch.int32, device=device)
    for page in sorted({c[0] for c in SWEEP}):
        per = ctx // page
        kc = torch.randn(batch * per + 1, kvh, page, d, dtype=torch.bfloat16, device=device)
        vc = torch.randn_like(kc)
        bt = (torch.randperm(batch * per, device=device) + 1).view(batch, per).int()
        for _, bn, w, st, sp in (c for c in SWEEP if c[0] == page):
            fn = functools.partial(paged_decode_attention, q, kc, vc, bt, ctx_t, d**-0.5, None, sp, bn, w, st)
            ms = tt.do_bench(fn, return_mode="median")
            name = f"p{page} n{bn} w{w} st{st} s{sp}"
            out.append(dict(kernel=name, config=(page, bn, w, st, sp), us=ms * 1e3, gbs=kv_bytes / ms / 1e6))
        del kc, vc
    return out


def profile_decode(engine, args, device) -> dict:
    """Per-step GPU time by kernel category: profile 1-token and 33-token runs, difference over 32 steps
    (bench/step_profile.py)."""
    per = kernel_ms(lambda n: engine.generate(make_requests(args, random.Random(2), new_tokens=n)), cuda=True)
    return categorize(per, dense_category, top=30)  # ms and launches per step


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="0.5b")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--new-tokens", type=int, default=512)
    ap.add_argument("--mixed", action="store_true", help="random prompt lengths, budgets and stop tokens")
    ap.add_argument("--baseline", action="store_true", help="also time transformers generate")
    ap.add_argument("--baseline-new-tokens", type=int, default=128)
    ap.add_argument("--max-batch-size", type=int, default=256)
    ap.add_argument("--gpu-memory-fraction", type=float, default=0.5)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--no-graphs", action="store_true")
    ap.add_argument("--share-weights", action="store_true", help="use the HF module's tensors (unfused)")
    ap.add_argument("--attn-sweep", action="store_true")
    ap.add_argument("--page-size", type=int, default=None)
    ap.add_argument(
        "--attn-options", type=json.loads, default=None, help='e.g. {"block_n": 32, "num_stages": 2}'
    )
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--blas", choices=("default", "cublas", "cublaslt"), default="default")
    ap.add_argument(
        "--sampler-config",
        default=None,
        help="the Triton sampler's chunk,block,warps (bench/sampler_sweep.py)",
    )
    ap.add_argument("--json", type=Path, default=None)
    return ap.parse_args(argv)


def report(res: dict) -> str:
    f, r = res["fast"], res["roofline"]
    lines = [
        f"device: {res['device']}  torch {res['torch']}  shape {res['args']['shape']}  copy bw "
        f"{r['copy_bw_tbs']:.2f} TB/s",
        f"fast: {f['tokens_per_s']:.0f} new tok/s  ({f['new_tokens']} tokens in {f['total_s']:.2f} s, "
        f"prefill run {f['prefill_s']:.2f} s)",
        f"      decode {f['decode_ms_per_step']:.2f} ms/step over {f['steps']} steps; roofline "
        f"{r['roofline_ms']:.2f} ms "
        f"(weights {r['weight_gb']:.2f} GB + KV {r['kv_gb_per_step']:.2f} GB) = {r['pct_roofline']:.0f}%"
        + (" (uniform-workload formula: not meaningful for --mixed)" if res["args"]["mixed"] else ""),
        f"      warm-up (compile+capture) {f['warmup_s']:.1f} s; peak {f['peak_gib']:.1f} GiB (KV cache "
        f"{f['kv_cache_gib']:.1f} GiB)",
        f"      mean response {f['mean_len']:.0f} tokens; finish {f['finish']}; {f['stats']}",
        f"      attention kernel config: {res.get('chosen', res['args'].get('attn_options'))}",
    ]
    if "baseline" in res:
        b = res["baseline"]
        lines.append(
            f"transformers generate: {b['tokens_per_s']:.0f} new tok/s ({b['new_tokens']} tokens, "
            f"{b['ms_per_step']:.1f} ms/step, peak {b['peak_gib']:.1f} GiB) -> speedup {res['speedup']:.1f}x"
        )
    prof = res.get("profile", {})
    for k, v in prof.get("categories", {}).items():
        lines.append(f"  profile {k:32s} {v:.3f} ms/step")
    for name, ms, n in prof.get("top", []):
        lines.append(f"  kernel {ms:.4f} ms/step x{n:5.1f}  {name}")
    for row in res.get("attn_sweep", []):
        lines.append(f"  attn {row['kernel']:24s} {row['us']:8.1f} us {row['gbs']:8.0f} GB/s")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    """Run the benchmark; print a summary and return the numbers (also written to --json)."""
    import gc

    args = parse(argv)
    device = torch.device("cuda")
    res = dict(device=torch.cuda.get_device_name(device), torch=torch.__version__, args=dict(vars(args)))
    if args.blas != "default":
        torch.backends.cuda.preferred_blas_library(args.blas)
    if args.sampler_config:
        from ascent.rollout.fast import triton_sample

        chunk, block, warps = (int(v) for v in args.sampler_config.split(","))
        triton_sample.CONFIG = (chunk, block, warps)
    model = make_model(args.shape, device)
    bw = copy_bandwidth(device)
    if args.attn_sweep:
        res["attn_sweep"] = attn_sweep(device)
        if args.page_size is None and args.attn_options is None:  # run the engine with the fastest kernel
            page, bn, w, st, sp = min(res["attn_sweep"][1:], key=lambda r: r["us"])["config"]
            args.page_size, args.attn_options = page, dict(block_n=bn, num_warps=w, num_stages=st, splits=sp)
            res["chosen"] = dict(page_size=page, **args.attn_options)
    fast = bench_fast(args, model, device)
    engine = fast.pop("engine")
    res["fast"], res["roofline"] = fast, roofline(args, model, fast, bw)
    if args.profile:
        res["profile"] = profile_decode(engine, args, device)
    engine.sleep()
    del engine
    gc.collect()
    torch.cuda.empty_cache()
    if args.baseline:
        res["baseline"] = bench_baseline(args, model, device)
        res["speedup"] = fast["tokens_per_s"] / res["baseline"]["tokens_per_s"]
    print(report(res), flush=True)
    if args.json:
        args.json.write_text(json.dumps(res, indent=1, default=str))
    return res


if __name__ == "__main__":
    main(sys.argv[1:])
