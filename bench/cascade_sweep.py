"""Shared-prefix decode attention's prefix kernel across its settings, against the plain decode kernel.

One layer's decode attention at the rollout benchmark's state (bench/rollout.py: 256 rows = 32 prompts x 8
samples, 512-token prompts in pages of 64, each row 1..512 tokens past its prompt, bf16, RoPE and the
new-token write in the kernel as the engine runs them), timed as CUDA-graph replays (the engine replays
graphs, so launch overhead is left out): the plain kernel (`paged_decode_attention`), then
`cascade_decode_attention` for every setting of the prefix kernel (block of tokens a step, splits,
warps, stages) or, with `--part split`, of the split kernel that continues over each row's own tokens.
Prints one line per setting, fastest first, and `BEST <shape> <attn_options JSON>` per shape, which
`bench/rollout.py --attn-options` takes.

    python3 bench/cascade_sweep.py --shape 0.5b 1.5b [--part split]
"""

from __future__ import annotations

import argparse
import itertools
import json
from typing import Any

import torch

from ascent.rollout.fast.prefix_groups import find_groups, pack_groups, shareable_pages

SHAPES = {"0.5b": (14, 2, 64), "1.5b": (12, 2, 128)}  # query heads, KV heads, head dim (Qwen2.5)
GRIDS = {  # --part: the prefix kernel's settings, or the split kernel's (it covers each row's own tokens)
    "prefix": {
        "prefix_block_n": (64, 128, 256),
        "prefix_splits": (1, 2, 4),
        "prefix_warps": (4, 8),
        "prefix_stages": (2, 3),
    },
    "split": {  # (block_n and num_warps would also be the prefix kernel's: its own stay pinned)
        "splits": (1, 2),
        "block_n": (32, 64),
        "num_warps": (2, 4, 8),
        "num_stages": (2, 3, 4),
        "prefix_block_n": (64,),
        "prefix_warps": (4,),
    },
}


def workload(nh, kvh, d, ps, dtype, prompts=32, samples=8, prompt_len=512, max_new=512, loners=8, seed=0):
    """The decode state of a GRPO batch part-way: `prompts` x `samples` rows whose prompts' full pages are
    shared, each row `prompt_len` + 1..max_new tokens in, plus `loners` rows in no group (and one idle).
    -> q [B, nh, d], caches, block tables [B, P], contexts [B], the group table (prefix_groups.py) and the
    rows in no group, on the GPU."""
    g = torch.Generator().manual_seed(seed)
    width = -(-(prompt_len + max_new) // ps)
    b = prompts * samples + loners + 1
    full = prompt_len // ps
    pool = (torch.randperm(b * width + 1, generator=g) + 1).tolist()
    tables, ctxs, keys = [], [], []
    for _ in range(prompts):
        shared = [pool.pop() for _ in range(full)]
        for _ in range(samples):
            tables.append(shared + [pool.pop() for _ in range(width - full)])
            ctxs.append(prompt_len + int(torch.randint(1, max_new + 1, (), generator=g)))
            keys.append(shareable_pages(tables[-1], prompt_len, ps))  # taken at admission
    for _ in range(loners):
        tables.append([pool.pop() for _ in range(width)])
        ctxs.append(int(torch.randint(1, prompt_len + max_new + 1, (), generator=g)))
        keys.append(())
    tables.append([0] * width)
    ctxs.append(0)
    keys.append(())
    order = torch.randperm(b, generator=g).tolist()  # rows of a running batch are not sorted by prompt
    tables, ctxs, keys = [tables[i] for i in order], [ctxs[i] for i in order], [keys[i] for i in order]
    dev = torch.device("cuda")
    bt = torch.tensor(tables, dtype=torch.int32, device=dev)
    ctx = torch.tensor(ctxs, dtype=torch.int32, device=dev)
    table = torch.tensor(pack_groups(find_groups(keys), b), dtype=torch.int32, device=dev)
    kc, vc = torch.randn(2, int(bt.max()) + 1, kvh, ps, d, generator=g).to(dev, dtype)
    q = torch.randn(b, nh, d, generator=g).to(dev, dtype)
    return q, kc, vc, bt, ctx, table, [i for i, k in enumerate(keys) if not k]


def graph_us(fn, reps: int = 28) -> float:
    """Microseconds per call of `fn`, `reps` calls captured in one CUDA graph, median of 5 replays."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            fn()
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / reps)
    return sorted(times)[2]


def sweep(shape: str, part: str) -> list[tuple[float, str, dict[str, Any]]]:
    """(us, name, attn_options) for the plain kernel, the default cascade and every setting of GRIDS[part]."""
    from ascent.rollout.fast.triton_cascade import cascade_decode_attention
    from ascent.rollout.fast.triton_decode import paged_decode_attention

    nh, kvh, d = SHAPES[shape]
    q, kc, vc, bt, ctx, table, _ = workload(nh, kvh, d, 64, torch.bfloat16)
    b = len(q)
    new = (torch.randn(b, kvh, d, device="cuda", dtype=q.dtype),) * 2
    angle = torch.rand(b, d, device="cuda")
    rope = (angle.cos(), angle.sin())
    scale = d**-0.5
    rows = [
        (graph_us(lambda: paged_decode_attention(q, kc, vc, bt, ctx, scale, new, rope=rope)), "plain", {})
    ]
    rows.append(
        (
            graph_us(lambda: cascade_decode_attention(q, kc, vc, bt, ctx, scale, table, new, rope=rope)),
            "default",
            {},
        )
    )
    grid = GRIDS[part]
    for values in itertools.product(*grid.values()):
        opts = dict(zip(grid, values, strict=True))
        run = lambda o=opts: cascade_decode_attention(q, kc, vc, bt, ctx, scale, table, new, rope=rope, **o)  # noqa: E731
        try:
            rows.append((graph_us(run), "cascade", opts))
        except Exception as e:  # a setting the chip cannot hold (shared memory): reported, not fatal
            print(f"{shape} {opts}: {type(e).__name__}: {str(e)[:120]}", flush=True)
    return sorted(rows, key=lambda r: r[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", nargs="+", choices=sorted(SHAPES), default=sorted(SHAPES))
    ap.add_argument("--part", choices=sorted(GRIDS), default="prefix", help="whose settings to sweep")
    args = ap.parse_args()
    for shape in args.shape:
        rows = sweep(shape, args.part)
        for us, name, opts in rows:
            print(f"{shape} {us:7.1f} us  {name:8s} {json.dumps(opts)}", flush=True)
        best = next(opts for _, name, opts in rows if name == "cascade")
        print(f"BEST {shape} {json.dumps(best)}", flush=True)


if __name__ == "__main__":
    main()
