"""Tensor-parallel rollout benchmark: one fast-engine replica over 1, 2, 4... GPUs, same workload, same call.

    python bench/tp_rollout.py --shape 7b --tp 1,2,4 --prompts 32 --samples 8 --prompt-len 512 --new-tokens 256
    python bench/tp_rollout.py --shape tiny --device cpu --tp 1,2 --prompts 2 --samples 2 --new-tokens 8
    python bench/tp_rollout.py --shape 7b --tp 2 --vocab-parallel on,off --allreduce nccl,nccl-dtype,symm

Random-weight Qwen2.5 shapes (7B, 14B, 32B; `tiny` for a CPU check with gloo) built from a Qwen2Config on the
meta device (no downloads, no checkpoint on disk): each rank's engine builder gets meta tensors and makes
random ones of its shard's shapes directly on its GPU (`random_weights`; a tensor's values come from its
name, so replicated tensors agree over the ranks). This process is rank 0, the driver; the other ranks are
spawned and serve it, as tp_launch.py does for a replica of a training run. For each TP size
(in order; one that cannot fit a GPU is skipped with a note) it reports new tokens/s, ms per decode step
((full run - 1-new-token run) / steps, EOS off), the roofline of a step on the driver (its bytes read: its
layer shards, the LM head and its KV heads at the mean context, over the device-to-device copy bandwidth
measured in this call; all-reduce time not counted) and its share of it, and peak memory of every rank
after its engine was built (warm-up and runs: activations, graph pools, KV cache). At TP > 1 it runs every
combination of --vocab-parallel (the LM head split by vocabulary, tp_head.py) and --allreduce (how the ranks
sum: tp_comm.py), each a replica of its own, labelled e.g. `TP=2 vp=on symm`.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import multiprocessing
import random
import socket
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any
from unittest import mock

import torch

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]  # bench/ modules, and ascent from this checkout
from rollout import copy_bandwidth  # noqa: E402  (bench/rollout.py: the copy bandwidth of the roofline)

from ascent.rollout.fast import build_fast_engine  # noqa: E402
from ascent.rollout.fast.tensor_parallel import tp_group  # noqa: E402
from ascent.rollout.fast.weights import IMPLEMENTATIONS  # noqa: E402

SHAPES = {  # Qwen2.5 (untied embeddings from 7B on), and a tiny one for CPU
    "tiny": dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=512,
    ),
    "7b": dict(
        hidden_size=3584,
        intermediate_size=18944,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
    ),
    "14b": dict(
        hidden_size=5120,
        intermediate_size=13824,
        num_hidden_layers=48,
        num_attention_heads=40,
        num_key_value_heads=8,
    ),
    "32b": dict(
        hidden_size=5120,
        intermediate_size=27648,
        num_hidden_layers=64,
        num_attention_heads=40,
        num_key_value_heads=8,
    ),
}


def qwen_config(shape: str):
    from transformers import Qwen2Config  # deferred: transformers, slow to import

    return Qwen2Config(
        **{"vocab_size": 152064, **SHAPES[shape]},
        max_position_embeddings=32768,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
    )


def meta_model(shape: str):
    """The shape's causal LM on the meta device: names, shapes and config, no memory."""
    from transformers import AutoModelForCausalLM  # deferred: transformers, slow to import

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(qwen_config(shape), dtype=torch.bfloat16)


def _random(name: str, t: torch.Tensor, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A meta tensor -> random values of its shape on `device` (norm scales 1, biases 0; N(0, 0.02^2) else,
    seeded by the name); a real tensor as it is."""
    if t.device.type != "meta":
        return t
    if name.endswith("norm.weight"):
        return torch.ones(t.shape, dtype=dtype, device=device)
    if name.endswith(".bias"):
        return torch.zeros(t.shape, dtype=dtype, device=device)
    g = torch.Generator(device=device).manual_seed(zlib.crc32(name.encode()))
    return torch.randn(t.shape, generator=g, dtype=dtype, device=device).mul_(0.02)


@contextlib.contextmanager
def random_weights():
    """While open, the fast engine's weight builders (IMPLEMENTATIONS) fill meta tensors with random ones
    on the engine's device: a meta module's shard is made where it lives, never in full."""

    def wrap(build):
        def built(sd, spec, dtype, device, share, **kw):
            return build(
                {n: _random(n, t, dtype, device) for n, t in sd.items()}, spec, dtype, device, False, **kw
            )

        return built

    with mock.patch.dict(IMPLEMENTATIONS, {k: wrap(v) for k, v in IMPLEMENTATIONS.items()}):
        yield


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_device(args, rank: int) -> torch.device:
    return torch.device("cuda", rank) if args.device == "cuda" else torch.device("cpu")


def build(args, rank: int, size: int, port: int):
    """This rank's engine over its random shard (the whole model at size 1)."""
    device = rank_device(args, rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    tp = tp_group(rank, size, "127.0.0.1", port, device, timeout_s=args.timeout) if size > 1 else None
    with random_weights():
        engine = build_fast_engine(
            model=meta_model(args.shape),
            dtype=args.dtype,
            device=device,
            eos_token_ids=[],
            max_batch_size=args.max_batch_size,
            max_model_len=args.prompt_len + args.new_tokens + 16,
            gpu_memory_fraction=args.gpu_memory_fraction,
            compile=False if args.no_compile else None,  # (None: on for CUDA, off on CPU)
            cuda_graphs=False if args.no_graphs else None,
            tensor_parallel=tp,
            vocab_parallel=args.vp == "on",
            tp_allreduce=args.allreduce_mode,
        )
    if device.type == "cuda":  # the peak of generation, not of building (two copies of the shard)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    return engine


def peak_gib(device: torch.device) -> float:
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else 0.0


def follower(rank: int, size: int, port: int, args, out_dir: str) -> None:
    """Ranks 1..size-1: build, serve the driver until it shuts down, write this rank's memory."""
    engine = build(args, rank, size, port)
    held = engine.memory()  # (before the driver's last sleep frees it)
    engine.serve()
    mem = dict(rank=rank, peak_gib=peak_gib(engine.device), **held)
    (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps(mem))


def requests(args, seed: int, new_tokens: int | None = None) -> list:
    """`prompts` random prompts of `prompt_len` tokens x `samples` samples, sampling, EOS off."""
    from ascent.messages import GenerationRequest, SamplingParams

    rng, vocab = random.Random(seed), qwen_config(args.shape).vocab_size
    params = [
        SamplingParams(temperature=1.0, max_new_tokens=new_tokens or args.new_tokens, n=args.samples, seed=i)
        for i in range(args.prompts)
    ]
    return [GenerationRequest([rng.randrange(vocab) for _ in range(args.prompt_len)], p) for p in params]


def timed(engine, reqs) -> tuple[list, float]:
    sync = torch.cuda.synchronize if engine.device.type == "cuda" else lambda: None
    sync()
    t0 = time.perf_counter()
    out = engine.generate(reqs)
    sync()
    return out, time.perf_counter() - t0


def workload(engine, args) -> dict:
    """Two warm-up calls (compile, graph capture), a 1-new-token run (prefill), then the timed workload."""
    _, warm_s = timed(engine, requests(args, 0, new_tokens=4))
    timed(engine, requests(args, 0, new_tokens=4))
    _, prefill_s = timed(engine, requests(args, 1, new_tokens=1))
    steps0 = engine.stats["steps"]
    out, total_s = timed(engine, requests(args, 1))
    steps = engine.stats["steps"] - steps0
    new = sum(len(g.token_ids) for gens in out for g in gens)
    return dict(
        warmup_s=warm_s,
        prefill_s=prefill_s,
        total_s=total_s,
        steps=steps,
        new_tokens=new,
        tokens_per_s=new / total_s,
        ms_per_step=1e3 * (total_s - prefill_s) / max(1, steps),
    )


def roofline(engine, args, bw: float | None) -> dict:
    """The driver's bytes per decode step (weights less the embedding table, whose rows are gathered, and
    less the LM head rows of the other ranks when vocab-parallel; its KV heads of every row at the mean
    context) and their time at copy bandwidth `bw` (bytes/s)."""
    weights = engine.weights.nbytes - engine.weights.embed.nbytes
    vocab = getattr(engine.runner, "vocab", None)  # a vocab-parallel rank's (start, end) of the head rows
    if vocab is not None and engine.weights.lm_head is not engine.weights.embed:
        head = engine.weights.lm_head
        weights -= head.nbytes * (1 - (vocab[1] - vocab[0]) / len(head))
    rows = min(args.prompts * args.samples, args.max_batch_size)
    ctx = args.prompt_len + args.new_tokens / 2
    kv = rows * ctx * engine.runner.spec.kv_bytes_per_token(engine.weights.lm_head.dtype)
    out = dict(weight_gb=weights / 1e9, kv_gb=kv / 1e9)
    if bw:
        out |= dict(copy_bw_tbs=bw / 1e12, roofline_ms=1e3 * (weights + kv) / bw)
    return out


def profile_step(engine, args) -> dict:
    """The driver's GPU time per decode step by kernel category (NCCL collectives apart): profiles of a
    1-new-token and a 33-new-token run, their difference over 32 steps (bench/step_profile.py)."""
    from step_profile import categorize, profile_decode  # bench/, beside this script

    per = profile_decode(
        lambda n: engine.generate(requests(args, 2, new_tokens=n)), engine.device.type == "cuda"
    )
    return categorize(per, category)


def category(name: str) -> str:
    """`tp_category` (bench/step_profile.py), the one-shot all-reduce kernels over symmetric memory apart."""
    from step_profile import tp_category  # bench/, beside this script

    low = name.lower()
    symm = "nccl" not in low and ("all_reduce" in low or "symm" in low)
    return "all-reduce (symmetric memory)" if symm else tp_category(name)


def fits(args, size: int) -> str:
    """'' when a rank's shard can be built on one GPU (the builder holds the random shard and its copy),
    else why not."""
    if args.device != "cuda":
        return ""
    c = qwen_config(args.shape)
    h, inter, n = c.hidden_size, c.intermediate_size, c.num_hidden_layers
    layer = n * (4 * h * h + 3 * h * inter)  # upper bound: q/k/v/o as if no GQA
    need = 2 * 2 * layer / size + 10 * c.vocab_size * h  # bf16 twice; embedding fp32 + bf16, head bf16 twice
    have = torch.cuda.get_device_properties(0).total_memory
    if size > torch.cuda.device_count():
        return f"needs {size} GPUs, this machine has {torch.cuda.device_count()}"
    return (
        ""
        if need < 0.9 * have
        else f"a rank would need ~{need / 2**30:.0f} GiB to build, the GPU has {have / 2**30:.0f}"
    )


def run(args, size: int, bw: float | None) -> dict:
    """One replica over `size` ranks: spawn the others, drive the workload here, collect every rank's memory."""
    port, out_dir = free_port(), tempfile.mkdtemp(prefix="tp_rollout")
    ctx = multiprocessing.get_context("spawn")  # (CPU too: a fork after this process ran torch can hang)
    children = [
        ctx.Process(target=follower, args=(r, size, port, args, out_dir), daemon=True) for r in range(1, size)
    ]
    for c in children:
        c.start()
    engine = None
    try:
        engine = build(args, 0, size, port)
        res = workload(engine, args)
        res["roofline"] = roofline(engine, args, bw)
        if "roofline_ms" in res["roofline"]:
            res["pct_roofline"] = 100 * res["roofline"]["roofline_ms"] / res["ms_per_step"]
        res["ranks"] = [dict(rank=0, peak_gib=peak_gib(engine.device), **engine.memory())]
        res["allreduce_ran"] = engine.tp.reduce if size > 1 else "none"  # ("symm" falls back on CPU)
        if args.profile:
            res["profile"] = profile_step(engine, args)
    finally:
        if engine is not None:  # free its memory on every rank: the engine froze the heap (gc.freeze at its
            engine.sleep(release_weights=True)  # first capture), so a cycle through it is never collected
            if size > 1:
                engine.shutdown()
        for c in children:
            c.join(timeout=120)
            if c.is_alive():
                c.kill()
        del engine
        if args.device == "cuda":
            gc.unfreeze()
            gc.collect()
            torch.cuda.empty_cache()
    for c in children:
        if c.exitcode != 0:
            raise RuntimeError(f"tensor-parallel rank {children.index(c) + 1} exited with {c.exitcode}")
    for r in range(1, size):
        res["ranks"].append(json.loads((Path(out_dir) / f"rank{r}.json").read_text()))
    return res


def report(res: dict) -> str:
    lines = [f"device: {res['device']}  torch {res['torch']}  shape {res['args']['shape']}"]
    for size, r in res["tp"].items():
        if "skipped" in r:
            lines.append(f"TP={size}: skipped ({r['skipped']})")
            continue
        roof = r["roofline"]
        line = (
            f"TP={size}: {r['tokens_per_s']:.0f} new tok/s ({r['new_tokens']} tokens in {r['total_s']:.2f} s), "
            f"decode {r['ms_per_step']:.2f} ms/step over {r['steps']} steps"
        )
        if r.get("allreduce_ran", "none") != "none":
            line += f" (all-reduce ran: {r['allreduce_ran']})"
        if "roofline_ms" in roof:
            line += (
                f"; roofline per rank {roof['roofline_ms']:.2f} ms (weights {roof['weight_gb']:.2f} GB + KV "
                f"{roof['kv_gb']:.2f} GB at {roof['copy_bw_tbs']:.2f} TB/s) = {r['pct_roofline']:.0f}%"
            )
        lines.append(line)
        peaks = ", ".join(f"{m['peak_gib']:.1f}" for m in r["ranks"])
        kv = r["ranks"][0]["kv_cache"] / 2**30
        lines.append(
            f"      warm-up {r['warmup_s']:.1f} s; peak GiB per rank [{peaks}] (KV cache {kv:.1f} GiB a rank)"
        )
        for cat, ms in sorted(r.get("profile", {}).get("categories", {}).items(), key=lambda kv: -kv[1]):
            lines.append(f"      profile {cat:30s} {ms:.3f} ms/step")
    return "\n".join(lines)


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="7b")
    ap.add_argument("--tp", default="1,2,4", help="comma-separated replica sizes, run in this order")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--dtype", default=None, help="default bf16 on CUDA, fp32 on CPU")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--max-batch-size", type=int, default=256)
    ap.add_argument("--gpu-memory-fraction", type=float, default=0.8)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--no-graphs", action="store_true")
    ap.add_argument("--vocab-parallel", default="on", help="at TP > 1: comma-separated on/off, each run")
    ap.add_argument("--allreduce", default="nccl", help="at TP > 1: comma-separated nccl/nccl-dtype/symm")
    ap.add_argument("--profile", action="store_true", help="the driver's GPU time a decode step, by kernel")
    ap.add_argument("--timeout", type=float, default=600, help="seconds a rank waits for the others")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    args.dtype = args.dtype or ("bf16" if args.device == "cuda" else "fp32")
    if set(args.vocab_parallel.split(",")) - {"on", "off"}:
        ap.error(f"--vocab-parallel {args.vocab_parallel}: comma-separated on/off")
    return args


def variants(args) -> list[tuple[int, str, str]]:
    """(TP size, vocab-parallel on/off, all-reduce mode) of every run: one at TP=1 (nothing to split), every
    combination of --vocab-parallel and --allreduce at TP > 1."""
    out = []
    for size in (int(s) for s in args.tp.split(",")):
        if size == 1:
            out.append((1, "off", "nccl"))
            continue
        for vp in args.vocab_parallel.split(","):
            out += [(size, vp, mode) for mode in args.allreduce.split(",")]
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run every TP size of --tp; print a summary and return the numbers (also written to --json)."""
    args = parse(argv)
    cuda = args.device == "cuda"
    name = torch.cuda.get_device_name(0) if cuda else "cpu"
    res: dict[str, Any] = dict(device=name, torch=torch.__version__, args=dict(vars(args)), tp={})
    bw = copy_bandwidth(torch.device("cuda", 0)) if cuda else None
    if cuda:
        torch.cuda.empty_cache()  # (the bandwidth test's 2 GiB)
    for size, vp, mode in variants(args):
        key: int | str = size if size == 1 else f"{size} vp={vp} {mode}"
        why = fits(args, size)
        run_args = argparse.Namespace(**{**vars(args), "vp": vp, "allreduce_mode": mode})
        res["tp"][key] = dict(skipped=why) if why else run(run_args, size, bw)
        print(report({**res, "tp": {key: res["tp"][key]}}), flush=True)  # (as it comes: a later may fail)
    print("summary\n" + report(res), flush=True)
    if args.json:
        args.json.write_text(json.dumps(res, indent=1, default=str))
    return res


if __name__ == "__main__":
    main(sys.argv[1:])
