"""Mixture-of-experts rollout under tensor parallelism: the fast engine on a Qwen3-30B-A3B shape over N GPUs.

    python bench/moe_tp.py --shape 30b-a3b --tensor-parallel 2            # ranks 1..N-1 are spawned here
    python bench/moe_tp.py --shape tiny-moe --tensor-parallel 2 --device cpu   # the same path on CPU, gloo
    for p in dense routed; do python bench/moe_tp.py --moe-path $p; done        # the experts' two paths
    python bench/moe_tp.py --tensor-parallel 2 --profile --json moe.json            # where a decode step goes

Random weights, built directly on each rank's GPU at the size of its shard (no checkpoint on disk, never the
whole model on one rank): the tensor names and full shapes come from transformers' Qwen3-MoE built on the
meta device, each rank's shape from `shard_tensor` (the rule a publication follows), so the shards are those
a real checkpoint or a trainer's publication would give. Each rank's engine is assembled as
`build_fast_engine(tensor_parallel=TPGroup)` assembles it (rank 0 drives, the others `serve()`), over the
shard's own tensors (shared, not copied). Rank 0 times a prefill-only pass and the whole workload (sampling
at temperature 1, EOS off) and prints one JSON line: new tokens/s, ms per decode step, and every rank's peak
memory (CUDA: max allocated over the whole run; CPU: 0). `--moe-path` picks how the experts are computed
(ascent/rollout/fast/moe.py: "dense", every expert on every token, or "routed", grouped matmuls over the
chosen experts only; default: the engine's, routed on an sm90 GPU in bf16). The decode step is replayed from
CUDA graphs on CUDA, as the engine's builder does (`--no-graphs`: eager, as this bench ran before, the first
BENCHMARKS.md figures); `--eager-moe` leaves the MoE block of a TP rank uncompiled (as before it was compiled).

The floor of a decode step on the driver (`floor`): the bytes it must read (its weight shard less the
embedding table, whose rows are gathered; of the experts only the expected share a step's rows hit, for
uniform routing 1 - (1 - k/E)^rows: all of them from ~64 rows at 128 experts, 8 a token; its KV heads at the
mean context) over the copy bandwidth measured in the same call (bench/rollout.py); all-reduces not counted.
`--profile` adds the driver's kernel time a decode step by category (bench/step_profile.py: grouped matmuls,
routing, the sort and its copies, attention, NCCL, norms, ...), printed as a table and kept in the JSON.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import socket
import sys
import time
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
# bench/ modules (step_profile.py, rollout.py), and ascent from this checkout (spawned ranks too)
sys.path[:0] = [str(HERE), str(HERE.parent)]

SHAPES: dict[str, dict[str, Any]] = {
    # Qwen3-30B-A3B's config.json (30.5B parameters, 3.3B active): 48 layers, 128 experts, 8 per token
    "30b-a3b": dict(
        vocab_size=151936,
        hidden_size=2048,
        intermediate_size=6144,
        moe_intermediate_size=768,
        num_experts=128,
        num_experts_per_tok=8,
        num_hidden_layers=48,
        num_attention_heads=32,
        num_key_value_heads=4,
        head_dim=128,
        max_position_embeddings=40960,
        rope_theta=1000000.0,
        tie_word_embeddings=False,
    ),
}
# the same path at a size a CPU runs in seconds (every other setting as above)
SHAPES["tiny-moe"] = SHAPES["30b-a3b"] | dict(
    hidden_size=64,
    intermediate_size=128,
    moe_intermediate_size=32,
    num_experts=8,
    num_experts_per_tok=2,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
)


def hf_config(shape: str) -> Any:
    from transformers import Qwen3MoeConfig  # deferred: transformers, slow to import (each rank imports it)

    return Qwen3MoeConfig(norm_topk_prob=True, decoder_sparse_step=1, rms_norm_eps=1e-6, **SHAPES[shape])


def shard_weights(config: Any, rank: int, size: int, device: torch.device, dtype: torch.dtype) -> dict:
    """This rank's shard of a random-weight model, by engine name, allocated on `device` tensor by tensor."""
    from transformers import AutoModelForCausalLM

    from ascent.rollout.fast.spec import engine_family, spec_from_config
    from ascent.rollout.fast.tp_shard import shard_tensor

    spec, rename = spec_from_config(config), engine_family(config).to_engine_name
    with torch.device("meta"):
        meta = AutoModelForCausalLM.from_config(config)
    gen = torch.Generator(device=device).manual_seed(rank)
    sd = {}
    for name, full in meta.state_dict().items():
        key = rename(name)
        shape = shard_tensor(key, full, spec, rank, size).shape
        if name.endswith("norm.weight"):
            sd[key] = torch.ones(shape, device=device, dtype=dtype)
        else:
            sd[key] = torch.randn(shape, device=device, dtype=dtype, generator=gen).mul_(0.02)
    return sd


def weight_bytes(sd: dict[str, torch.Tensor]) -> dict[str, int]:
    """Bytes of a rank's shard that a decode step reads: the experts', and the rest less the embedding."""
    experts = sum(t.nbytes for n, t in sd.items() if ".mlp.experts." in n)
    rest = sum(t.nbytes for n, t in sd.items() if ".mlp.experts." not in n and "embed" not in n)
    return dict(experts=experts, rest=rest)


def build_engine(args: argparse.Namespace, rank: int, size: int, port: int, device: torch.device) -> Any:
    """Rank `rank`'s engine (a TPEngine when size > 1, else a FastEngine) over its random shard; the bytes of
    its shard a step reads (`weight_bytes`) in `engine.bench_bytes`."""
    from ascent.rollout.fast import FastEngine, TPEngine
    from ascent.rollout.fast.graphs import default_buckets
    from ascent.rollout.fast.kv_cache import KVCache
    from ascent.rollout.fast.moe import default_moe_path
    from ascent.rollout.fast.runner import ModelRunner
    from ascent.rollout.fast.spec import rope_tables, spec_from_config
    from ascent.rollout.fast.tensor_parallel import DriverRunner, ShardRunner, tp_group
    from ascent.rollout.fast.tp_shard import shard_spec
    from ascent.rollout.fast.weights import build_weights

    cuda, dt = device.type == "cuda", torch.bfloat16
    config = hf_config(args.shape)
    full = spec_from_config(config)
    local = shard_spec(full, size)
    sd = shard_weights(config, rank, size, device, dt)
    weights = build_weights(sd, local, dt, device, share=True)
    max_len = args.prompt_len + args.new_tokens + 16
    rows = min(args.prompts * args.samples, args.max_batch_size)
    cache = KVCache(local, rows * -(-max_len // args.page_size) + 1, args.page_size, dt, device)
    fast = "triton" if cuda else "torch"
    kw: dict[str, Any] = dict(attention=fast, sampler=fast, compile=cuda and not args.no_compile)
    moe_down = next(lw.down_w for lw in weights.layers if lw.down_w.dim() == 3)
    kw["moe_path"] = args.moe_path or default_moe_path(device, moe_down)
    rope = rope_tables(config, local, max_len, torch.float32, device)
    common = dict(eos_token_ids=[], decode=None, max_batch_size=args.max_batch_size, max_model_len=max_len)
    buckets = default_buckets(args.max_batch_size) if cuda and not args.no_graphs else None
    if size == 1:
        runner = ModelRunner(local, weights, cache, rope, max_len, **kw)
        engine: Any = FastEngine(runner, weights, buckets=buckets, **common)
    else:
        tp = tp_group(rank, size, "127.0.0.1", port, device)
        runner_cls = DriverRunner if rank == 0 else ShardRunner
        runner = runner_cls(local, weights, cache, rope, max_len, **kw, tp=tp)
        if args.eager_moe and "moe_mlp" in vars(runner.math):
            del runner.math.moe_mlp  # the compiled wrapper goes: the class's (eager) method runs
        engine = TPEngine(runner, weights, full_spec=full, buckets=buckets, **common)
    engine.bench_bytes = weight_bytes(sd)
    return engine


def floor(args: argparse.Namespace, engine: Any, bw: float | None) -> dict:
    """The driver's bytes a decode step (module doc) and their time at copy bandwidth `bw` (bytes/s)."""
    c, spec = SHAPES[args.shape], engine.runner.spec
    rows = min(args.prompts * args.samples, args.max_batch_size)
    hit = 1 - (1 - c["num_experts_per_tok"] / c["num_experts"]) ** rows  # expected share of experts hit
    kv = rows * (args.prompt_len + args.new_tokens / 2) * spec.kv_bytes_per_token(torch.bfloat16)
    b = engine.bench_bytes
    total = hit * b["experts"] + b["rest"] + kv
    out = dict(
        experts_gb=b["experts"] / 1e9,
        experts_hit=hit,
        other_weights_gb=b["rest"] / 1e9,
        kv_gb=kv / 1e9,
    )
    out["floor_gb"] = total / 1e9
    if bw:
        out |= dict(copy_bw_tbs=bw / 1e12, floor_ms=1e3 * total / bw)
    return out


def requests(args: argparse.Namespace, new_tokens: int) -> list:
    from ascent.messages import GenerationRequest, SamplingParams

    rng, vocab = random.Random(1), SHAPES[args.shape]["vocab_size"]
    return [
        GenerationRequest(
            [rng.randrange(vocab) for _ in range(args.prompt_len)],
            SamplingParams(temperature=1.0, max_new_tokens=new_tokens, n=args.samples, seed=i),
            request_id=i,
        )
        for i in range(args.prompts)
    ]


def timed(fn: Any, device: torch.device) -> tuple[Any, float]:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    out = fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return out, time.perf_counter() - t0


def drive(args: argparse.Namespace, engine: Any, device: torch.device) -> dict:
    """Rank 0: warm up, time a prefill-only pass and the whole workload (and say which experts path ran);
    with `--profile`, the kernel time a decode step by category."""
    from ascent.rollout.fast.moe import experts_forward_routed

    engine.generate(requests(args, 4))  # compile, first kernels, graph captures
    engine.generate(requests(args, 4))
    _, prefill_s = timed(lambda: engine.generate(requests(args, 1)), device)
    steps0 = engine.stats["steps"]
    out, total_s = timed(lambda: engine.generate(requests(args, args.new_tokens)), device)
    steps = engine.stats["steps"] - steps0
    new = sum(len(g.token_ids) for gens in out for g in gens)
    res: dict[str, Any] = dict(
        moe_path="routed" if engine.runner.math.experts is experts_forward_routed else "dense",
        graphs=engine.graphs is not None,
        eager_moe=args.eager_moe,
        new_tokens=new,
        total_s=round(total_s, 3),
        prefill_s=round(prefill_s, 3),
        steps=steps,
        tokens_per_s=round(new / total_s, 1),
        decode_ms_per_step=round(1e3 * (total_s - prefill_s) / max(1, steps), 2),
    )
    if args.profile:
        from step_profile import categorize, moe_category, profile_decode  # bench/, beside this script

        per = profile_decode(lambda n: engine.generate(requests(args, n)), device.type == "cuda")
        res["profile"] = categorize(per, moe_category, top=20)
    return res


def peak_gib(device: torch.device) -> float:
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else 0.0


def run_rank(args: argparse.Namespace, rank: int, size: int, port: int) -> dict | None:
    """Build this rank's engine; rank 0 drives and returns the results (with every rank's peak memory), the
    others serve until it shuts down."""
    device = torch.device("cuda", rank) if args.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    bw = None
    if rank == 0 and device.type == "cuda":
        from rollout import copy_bandwidth  # bench/rollout.py: the floor's bandwidth, measured here

        bw = copy_bandwidth(device)
        torch.cuda.empty_cache()  # (the bandwidth test's 2 GiB)
    engine = build_engine(args, rank, size, port, device)
    res = {**drive(args, engine, device), "floor": floor(args, engine, bw)} if rank == 0 else None
    if res is not None and "floor_ms" in res["floor"]:
        res["floor"]["pct_of_floor"] = round(100 * res["floor"]["floor_ms"] / res["decode_ms_per_step"], 1)
    if size == 1:
        assert res is not None
        return {**res, "peak_gib_per_rank": [round(peak_gib(device), 2)]}
    if rank == 0:
        engine.shutdown()
    else:
        engine.serve()
    peaks = torch.zeros(size, device=engine.tp.device)
    peaks[rank] = peak_gib(device)
    peaks = engine.tp.all_reduce(peaks)  # every rank's peak, gathered by a sum
    if res is not None:
        res["peak_gib_per_rank"] = [round(p, 2) for p in peaks.tolist()]
    return res


def _child(args: argparse.Namespace, rank: int, size: int, port: int) -> None:
    run_rank(args, rank, size, port)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="30b-a3b")
    ap.add_argument("--tensor-parallel", type=int, default=2)
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--max-batch-size", type=int, default=128)
    ap.add_argument("--page-size", type=int, default=64)
    ap.add_argument("--no-compile", action="store_true", help="no torch.compile of the layer halves")
    ap.add_argument("--no-graphs", action="store_true", help="decode steps eagerly (no CUDA graphs)")
    ap.add_argument(
        "--eager-moe", action="store_true", help="TP: the MoE block (norm, router, experts) uncompiled"
    )
    ap.add_argument("--profile", action="store_true", help="the driver's kernel time a decode step, by part")
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    ap.add_argument(
        "--sort",
        choices=["counting", "radix"],
        default="counting",
        help="how decode steps group routes by expert (moe.group_by_expert); radix: the sort of before",
    )
    ap.add_argument(
        "--moe-path",
        choices=["dense", "routed"],
        default=None,
        help="how the experts are computed (moe.py); default: the engine's (routed on an sm90 GPU)",
    )
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse(argv)
    size = args.tensor_parallel
    if args.sort == "radix":  # every rank: the spawned ones read the environment at import
        os.environ["ASCENT_MOE_COUNTING_SORT_MAX"] = "0"
        from ascent.rollout.fast import moe  # (after sys.path points at this checkout)

        moe.COUNTING_SORT_MAX = 0
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = multiprocessing.get_context("spawn")  # CUDA cannot be used in a forked child
    children = [ctx.Process(target=_child, args=(args, r, size, port), daemon=True) for r in range(1, size)]
    for child in children:
        child.start()
    res = run_rank(args, 0, size, port)
    for child in children:
        child.join(timeout=120)
    assert res is not None
    res = {"shape": args.shape, "tensor_parallel": size, "device": args.device, **res}
    res["child_exitcodes"] = [c.exitcode for c in children]
    print(report(res), flush=True)
    print(json.dumps(res))
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
    return res


def report(res: dict) -> str:
    """The step time against the floor, and the profile's table when there is one."""
    f = res["floor"]
    line = (
        f"{res['shape']} TP={res['tensor_parallel']} {res['moe_path']} (graphs {res['graphs']}, eager MoE "
        f"{res['eager_moe']}): {res['decode_ms_per_step']:.2f} ms/step; floor {f['floor_gb']:.2f} GB a step "
        f"(experts {f['experts_gb']:.2f} GB x {f['experts_hit']:.4f} hit, other weights "
        f"{f['other_weights_gb']:.2f} GB, KV {f['kv_gb']:.2f} GB)"
    )
    if "floor_ms" in f:
        line += f" = {f['floor_ms']:.2f} ms at {f['copy_bw_tbs']:.2f} TB/s: {f['pct_of_floor']:.0f}% of it"
    lines = [line]
    if "profile" in res:
        from step_profile import table  # bench/, beside this script

        busy = sum(res["profile"]["categories"].values())
        lines += [
            f"driver kernel time a decode step ({busy:.2f} ms of {res['decode_ms_per_step']:.2f} ms wall: the "
            "rest is the GPU waiting on the host or on the other ranks):",
            *table(res["profile"]),
            "costliest kernels:",
        ]
        lines += [f"  {ms:8.3f} ms {n:6.1f}x  {name}" for name, ms, n in res["profile"]["top"]]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
