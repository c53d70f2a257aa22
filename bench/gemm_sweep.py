"""Fused decode GEMMs (ascent/rollout/fast/triton_gemm.py) against the current path, per tile config.

    python bench/gemm_sweep.py                        # 0.5b, 1.5b, 7b x rows 64..512, ~3 min on an H100
    python bench/gemm_sweep.py --shapes 0.5b --rows 128,256 --json out.json

For each model shape, decode batch (rows) and product -- qkv (+bias +RoPE), o (+residual), gate_up
(+SiLU*up), down (+residual) -- times the current path (cuBLAS through F.linear plus the same elementwise
work under torch.compile, as layers.py runs it) and the fused kernel with each candidate tile (CONFIGS, K
split as the default rule would for that tile, and unsplit) and with the tile the engine would pick now.
Times are CUDA-graph replays of many calls cycling over copies of the weight that together overflow L2, so
each call streams its weight from HBM as a decode step does (24+ layers of weights never stay in L2).
Prints a table (us per call, TB/s of weight bytes, speed-up over the current path) and the best tile per
(shape, op, rows) as a `TILES` literal ready to paste into ascent/rollout/fast/fused_gemm.py.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from ascent.rollout.fast.fused_gemm import SMEM_BYTES, Tile, arch_of, default_tile, pick_tile
from ascent.rollout.fast.layers import apply_rope
from ascent.rollout.fast.runner import compile_step  # the engine's torch.compile settings

# (hidden, q heads, kv heads, head_dim, intermediate)
SHAPES = {
    "0.5b": (896, 14, 2, 64, 4864),
    "1.5b": (1536, 12, 2, 128, 8960),
    "7b": (3584, 28, 4, 128, 18944),
}
# (block_m, block_n, block_k, warps, stages): plausible Hopper tiles for 16..512 rows; block_n counts one
# accumulator's columns (gate_up and qkv_rope hold two)
CONFIGS = [
    (16, 64, 128, 4, 4),
    (16, 128, 128, 4, 4),
    (16, 64, 256, 4, 3),
    (32, 64, 128, 4, 4),
    (32, 128, 128, 4, 3),
    (64, 32, 128, 4, 4),
    (64, 64, 128, 4, 4),
    (64, 128, 64, 4, 4),
    (64, 128, 128, 8, 3),
    (128, 64, 64, 4, 4),
    (128, 64, 64, 8, 3),
    (128, 128, 64, 8, 3),
    (64, 256, 64, 8, 3),
    (128, 256, 64, 8, 3),
]
L2_FLUSH_BYTES = 160 << 20  # weight copies cycled per graph: more than an H100's 50 MB L2
CALLS = 48  # calls per timed graph replay


def layer_weights(shape: str, device: torch.device) -> dict:
    """The four products of one layer of `shape`: name -> (op, copies of the weight [N, K] in bf16)."""
    hidden, nh, kvh, d, inter = SHAPES[shape]
    g = torch.Generator(device=device).manual_seed(0)

    def mats(n, k):
        copies = max(1, math.ceil(L2_FLUSH_BYTES / (n * k * 2)))
        return [
            (torch.randn(n, k, device=device, generator=g) / k**0.5).to(torch.bfloat16) for _ in range(copies)
        ]

    return {
        "qkv": ("qkv_rope", mats((nh + 2 * kvh) * d, hidden)),
        "o": ("residual", mats(hidden, nh * d)),
        "gate_up": ("gate_up", mats(2 * inter, hidden)),
        "down": ("residual", mats(hidden, inter)),
    }


def layer_inputs(shape: str, rows: int, device: torch.device) -> dict:
    """name -> the product's other inputs at `rows` (activations, bias, RoPE tables, fp32 residual)."""
    hidden, nh, kvh, d, inter = SHAPES[shape]
    g = torch.Generator(device=device).manual_seed(1)

    def act(k):
        return torch.randn(rows, k, device=device, generator=g).to(torch.bfloat16)

    ang = torch.rand(rows, d // 2, device=device, generator=g) * 100
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
    x = torch.randn(rows, hidden, device=device, generator=g)
    bias = torch.randn((nh + 2 * kvh) * d, device=device, generator=g).to(torch.bfloat16)
    return {
        "qkv": (act(hidden), bias, cos, sin, nh + kvh, d),
        "o": (act(nh * d), x),
        "gate_up": (act(hidden),),
        "down": (act(inter), x),
    }


def current_path(op: str):
    """What layers.py computes today for `op`, to be torch.compiled: (weight, *inputs) -> outputs."""

    def qkv_rope(w, h, bias, cos, sin, rot_heads, d):
        qkv = F.linear(h, w, bias)
        t = qkv.shape[0]
        qk = apply_rope(qkv[:, : rot_heads * d].view(t, rot_heads, d), cos, sin, qkv.dtype)
        return qk, qkv[:, rot_heads * d :]

    def residual(w, a, x):
        return x + F.linear(a, w)

    def gate_up(w, h):
        gate, up = F.linear(h, w).chunk(2, dim=-1)
        return F.silu(gate) * up

    return {"qkv_rope": qkv_rope, "residual": residual, "gate_up": gate_up}[op]


def fused_call(op: str, tile):
    from ascent.rollout.fast import triton_gemm as tg  # deferred: triton (the script parses args without it)

    if op == "qkv_rope":
        return lambda w, h, bias, cos, sin, rh, d: tg.qkv_rope_launch(h, w, bias, cos, sin, rh, d, tile)
    if op == "residual":
        return lambda w, a, x: tg.linear_residual_launch(a, w, x, tile)
    return lambda w, h: tg.gate_up_silu_launch(h, w, tile)


def graph_us(fn, weights: list, inputs: tuple) -> float:
    """Microseconds per call of fn(w, *inputs), replayed from a CUDA graph of CALLS calls cycling `weights`."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for w in weights[:2]:
            fn(w, *inputs)  # compile / autotune outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for i in range(CALLS):
            fn(weights[i % len(weights)], *inputs)
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / CALLS)
    return sorted(times)[len(times) // 2]


def candidates(op: str, rows: int, n: int, k: int, sms: int, device: torch.device) -> list:
    """CONFIGS that suit `rows` (no row block over twice the rows), each unsplit and split as the rule
    would split it, plus the tile the engine picks today."""
    accs = 1 if op == "residual" else 2
    cols = n // accs
    out = {pick_tile(op, rows, n, k, device, sms)}
    for bm, bn, bk, w, st in CONFIGS:
        if bm > max(16, 2 * rows) or st * (bm + accs * bn) * bk * 2 > SMEM_BYTES + 32 * 1024:
            continue
        tiles = -(-rows // bm) * -(-cols // bn)
        split = 1
        while split < 16 and tiles * split * 2 <= 2 * sms and -(-k // bk) // (split * 2) >= 4:
            split *= 2
        out |= {Tile(bm, bn, bk, s, w, st) for s in {1, split}}
    out.add(default_tile(op, rows, n, k, sms))
    return sorted(out)


def sweep(args, device: torch.device) -> list[dict]:
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    compiled = {op: compile_step(current_path(op)) for op in ("qkv_rope", "residual", "gate_up")}
    start, results = time.perf_counter(), []
    for shape in args.shapes:
        layer = layer_weights(shape, device)
        for rows in args.rows:
            for name, inputs in layer_inputs(shape, rows, device).items():
                op, weights = layer[name]
                n, k = weights[0].shape
                row = dict(shape=shape, rows=rows, name=name, op=op, n=n, k=k, weight_mb=n * k * 2 / 1e6)
                row["current_us"] = graph_us(compiled[op], weights, inputs)
                chosen = pick_tile(op, rows, n, k, device, sms)
                row["configs"] = {}
                for tile in candidates(op, rows, n, k, sms, device):
                    if time.perf_counter() - start > args.budget_s and tile != chosen:
                        continue  # out of time: only the engine's own pick from here on
                    try:
                        row["configs"][tuple(tile)] = graph_us(fused_call(op, tile), weights, inputs)
                    except Exception as e:  # a tile the compiler refuses (shared memory): skip it
                        print(f"  {shape} {name} rows={rows} {tuple(tile)}: {type(e).__name__}", flush=True)
                row["chosen"], row["chosen_us"] = tuple(chosen), row["configs"].get(tuple(chosen))
                best = min(row["configs"], key=row["configs"].get)
                row["best"], row["best_us"] = best, row["configs"][best]
                results.append(row)
                print(line(row), flush=True)
    return results


def line(r: dict) -> str:
    tbs = lambda us: r["weight_mb"] / us if us else float("nan")  # noqa: E731  (MB per us is TB/s)
    chosen = r["chosen_us"] or float("nan")
    return (
        f"{r['shape']:5s} {r['name']:8s} rows {r['rows']:4d} w {r['weight_mb']:7.1f} MB | current "
        f"{r['current_us']:7.1f} us {tbs(r['current_us']):5.2f} TB/s | picked {chosen:7.1f} us | best "
        f"{r['best_us']:7.1f} us {tbs(r['best_us']):5.2f} TB/s x{r['current_us'] / r['best_us']:4.2f} "
        f"{r['best']}"
    )


def tiles_literal(results: list[dict], arch: str) -> str:
    """The best tile per (op, weight rows, K) and rows, as fused_gemm.TILES entries."""
    table: dict = {}
    for r in results:
        table.setdefault((arch, r["op"], r["n"], r["k"]), {})[r["rows"]] = r["best"]
    body = "".join(f"    {key!r}: {dict(sorted(v.items()))!r},\n" for key, v in sorted(table.items()))
    return "TILES.update({\n" + body + "})"


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", type=lambda s: s.split(","), default=list(SHAPES))
    ap.add_argument("--rows", type=lambda s: [int(x) for x in s.split(",")], default=[64, 128, 256, 512])
    ap.add_argument("--budget-s", type=float, default=200.0, help="stop trying candidates after this")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    unknown = [s for s in args.shapes if s not in SHAPES]
    if unknown:
        ap.error(f"--shapes {unknown}: use some of {list(SHAPES)}")
    return args


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse(argv)
    device = torch.device("cuda")
    print(f"device: {torch.cuda.get_device_name(device)}  torch {torch.__version__}", flush=True)
    results = sweep(args, device)
    speedups = [r["current_us"] / r["best_us"] for r in results]
    picked = [r["current_us"] / r["chosen_us"] for r in results if r["chosen_us"]]
    print(f"geomean speed-up: best tile {math.prod(speedups) ** (1 / len(speedups)):.2f}x, ", end="")
    print(f"picked tile {math.prod(picked) ** (1 / max(1, len(picked))):.2f}x")
    print("# paste into ascent/rollout/fast/fused_gemm.py:")
    print(tiles_literal(results, arch_of(device)))
    if args.json:
        rows = [dict(r, configs={str(k): v for k, v in r["configs"].items()}) for r in results]
        args.json.write_text(json.dumps(rows, indent=1))
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
