"""FP8 rollout benchmark: the fast engine with bf16 weights against the same engine with FP8 weights
(`rollout.quantization=fp8`), one process, same model, same workload, one after the other on one GPU.

    python3 bench/fp8_rollout.py --shapes 0.5b,1.5b,7b --json /tmp/fp8.json

Random-weight Qwen2.5-0.5B / 1.5B / 7B shapes built from a Qwen2Config (no downloads), bf16. For each shape
and each engine (bf16, fp8; both own fused copies of the weights, built from the same module):
- `publish_s`: the engine's side of a publication of every weight (`update_weights` from the module's GPU
  tensors, median of 3): a copy per tensor for bf16, a copy plus the per-row quantisation for fp8 (the bytes
  the transport moves are the same for both: the trainer's bf16 tensors);
- `tokens_per_s`: new tokens per second over `prompts x samples` sequences (after two warm-up calls that
  compile and capture the decode graphs), and ms per decode step;
- the sampler/trainer gap: the engine's logprobs of its own sampled tokens against the module's (bf16,
  transformers' forward, the "trainer") on a smaller workload: mean and max |difference| over the tokens;
- the engine's weight bytes and KV cache.
Random weights give near-uniform next-token distributions, so the gap here is smaller than on a trained model
(whose peaked distributions amplify matmul error); it compares bf16 with fp8, it is not the gap of a real run.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]  # bench/ modules, and ascent from this checkout
from rollout import SHAPES, make_requests, timed  # noqa: E402  (bench/rollout.py: the shapes and workload)

SHAPES_7B = dict(
    hidden_size=3584,
    intermediate_size=18944,
    num_hidden_layers=28,
    num_attention_heads=28,
    num_key_value_heads=4,
    vocab_size=152064,
    tie_word_embeddings=False,
)


def make_model(shape: str, device: torch.device):
    """A randomly initialised Qwen2.5-shaped causal LM in bf16 on `device` (7b: its own head, 4 KV heads)."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    sizes: dict[str, Any] = {"vocab_size": 151936, "num_key_value_heads": 2, "tie_word_embeddings": True}
    sizes |= SHAPES_7B if shape == "7b" else SHAPES[shape]
    config = Qwen2Config(
        max_position_embeddings=32768,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        dtype="bfloat16",
        **sizes,
    )
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16, attn_implementation="sdpa")
    return model.eval()


@torch.no_grad()
def trainer_logprobs(model, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """The module's logprobs of `tokens` after `prompt` (fp32 log-softmax of its bf16 logits)."""
    device = next(model.parameters()).device
    ids = torch.tensor([prompt + tokens], device=device)
    hidden = model.model(ids).last_hidden_state[0, len(prompt) - 1 : -1]
    logp = model.lm_head(hidden).float().log_softmax(-1)
    return logp.gather(1, torch.tensor(tokens, device=device)[:, None])[:, 0].cpu()


def gap(engine, model, args) -> dict:
    """Mean and max |engine - trainer| logprob over the tokens of a small sampled workload."""
    small = argparse.Namespace(**{**vars(args), "prompts": args.gap_prompts, "samples": 2, "mixed": False})
    reqs = make_requests(small, random.Random(2), new_tokens=args.gap_tokens)
    diffs = []
    for req, gens in zip(reqs, engine.generate(reqs), strict=True):
        for g in gens:
            ref = trainer_logprobs(model, req.prompt_ids, g.token_ids)
            diffs.append((torch.tensor(g.logprobs) - ref).abs())
    d = torch.cat(diffs)
    return dict(gap_mean=d.mean().item(), gap_max=d.max().item(), gap_tokens=d.numel())


def publish_seconds(engine, model) -> float:
    """Median of 3 engine-side publications of every weight, from the module's GPU tensors."""
    from ascent.rollout.fast.weights import state_dict_of

    named = list(state_dict_of(model).items())
    times = [timed(lambda: engine.update_weights(named))[1] for _ in range(3)]
    return statistics.median(times)


def bench_engine(model, quantization: str, args, device) -> dict:
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
        share_weights=False,
        quantization=quantization,
    )
    res: dict = dict(quantization=quantization, build_s=time.perf_counter() - t0)
    res["publish_s"] = publish_seconds(engine, model)
    rng = random.Random(0)
    for i in range(2):  # compile and capture the graphs (the second call: buckets the first missed)
        res[f"warmup{i}_s"] = timed(lambda: engine.generate(make_requests(args, rng, new_tokens=4)))[1]
    steps0 = engine.stats["steps"]
    out, total_s = timed(lambda: engine.generate(make_requests(args, random.Random(1))))
    new = sum(len(g.token_ids) for req in out for g in req)
    res |= dict(new_tokens=new, total_s=total_s, tokens_per_s=new / total_s)
    res["decode_ms_per_step"] = 1e3 * total_s / max(1, engine.stats["steps"] - steps0)
    res |= gap(engine, model, args)
    res |= dict(
        weights_gib=engine.memory()["weights"] / 2**30, kv_cache_gib=engine.memory()["kv_cache"] / 2**30
    )
    engine.sleep(release_weights=True)  # compiled graphs may keep the engine alive: free its memory now
    return res


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="0.5b,1.5b,7b", help="comma-separated: 0.5b, 1.5b, 7b")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--gap-prompts", type=int, default=8)
    ap.add_argument("--gap-tokens", type=int, default=64)
    ap.add_argument("--max-batch-size", type=int, default=128)
    ap.add_argument("--gpu-memory-fraction", type=float, default=0.45)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    args.mixed = False
    device = torch.device("cuda", torch.cuda.current_device())
    print(f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}", flush=True)
    rows = []
    for shape in args.shapes.split(","):
        model = make_model(shape, device)
        for quantization in ("none", "fp8"):
            res = {"shape": shape} | bench_engine(model, quantization, args, device)
            gc.collect()
            torch.cuda.empty_cache()
            rows.append(res)
            print(
                f"{shape:>5} {quantization:>4}: {res['tokens_per_s']:9.0f} tok/s "
                f"{res['decode_ms_per_step']:7.2f} ms/step  gap mean {res['gap_mean']:.2e} "
                f"max {res['gap_max']:.2e}  publish {res['publish_s']:.3f} s  weights "
                f"{res['weights_gib']:.2f} GiB  kv {res['kv_cache_gib']:.1f} GiB  build {res['build_s']:.1f} s",
                flush=True,
            )
        base, fp8 = rows[-2], rows[-1]
        print(
            f"{shape:>5} fp8/bf16 throughput: {fp8['tokens_per_s'] / base['tokens_per_s']:.2f}x", flush=True
        )
        del model
        gc.collect()
        torch.cuda.empty_cache()
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=1))
    return rows


if __name__ == "__main__":
    main()
