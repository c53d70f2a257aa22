"""A decode step's matmuls alone, in both orientations and both cuBLAS front ends, replayed in CUDA graphs.

    python bench/decode_gemms.py --shapes 0.5b,1.5b --rows 128,256

For each layer matmul of a Qwen2.5 shape (qkv, o, gate_up, down, the LM head with fp32 output) at a
decode batch of M rows: `x @ W.T` as the engine computes it (`F.linear`, output [M, N]) against the
transposed product `W @ x.T` (output [N, M], which a fused consumer can read as its transpose), each
under cuBLAS and cuBLASLt. The heuristics pick other tiles for the two orientations; at M = 256 a tile
that does not divide M wastes a share of the work. Prints us per call (median of
`triton.testing.do_bench_cudagraph`) and the share of the weight-bandwidth floor.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

SHAPES = {  # hidden, intermediate, q heads, kv heads, head dim
    "0.5b": (896, 4864, 14, 2, 64),
    "1.5b": (1536, 8960, 12, 2, 128),
    "7b": (3584, 18944, 28, 4, 128),
}
VOCAB = 151936


def ops(shape: str) -> dict[str, tuple[int, int]]:
    """op -> (N, K) of the weight [N, K]."""
    h, inter, nh, kvh, d = SHAPES[shape]
    return {
        "qkv": ((nh + 2 * kvh) * d, h),
        "o": (h, nh * d),
        "gate_up": (2 * inter, h),
        "down": (h, inter),
        "lm_head": (VOCAB, h),
    }


def variants(x: torch.Tensor, w: torch.Tensor, fp32: bool) -> dict:
    """name -> a call computing the product in one orientation."""
    kw = {"out_dtype": torch.float32} if fp32 else {}
    return {
        "x@W.T": lambda: torch.mm(x, w.T, **kw),
        "W@x.T": lambda: torch.mm(w, x.T, **kw),
    }


def main(argv: list[str] | None = None) -> list[dict]:
    import triton.testing as tt

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="0.5b,1.5b")
    ap.add_argument("--rows", default="128,256")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    from rollout import copy_bandwidth  # bench/rollout.py, beside this script

    dev = torch.device("cuda")
    bw = copy_bandwidth(dev)
    print(f"device {torch.cuda.get_device_name(dev)}, copy bandwidth {bw / 1e12:.2f} TB/s", flush=True)
    out = []
    for shape in args.shapes.split(","):
        for name, (n, k) in ops(shape).items():
            w = torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02
            for m in (int(r) for r in args.rows.split(",")):
                x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
                floor_us = 1e6 * w.numel() * 2 / bw
                cells = []
                for lib in ("cublas", "cublaslt"):
                    torch.backends.cuda.preferred_blas_library(lib)
                    for vname, fn in variants(x, w, name == "lm_head").items():
                        fn()
                        us = 1e3 * tt.do_bench_cudagraph(fn, rep=50, return_mode="median")
                        out.append(dict(shape=shape, op=name, rows=m, lib=lib, variant=vname, us=us))
                        cells.append(f"{lib}/{vname} {us:6.1f}")
                best = min(out[-4:], key=lambda r: r["us"])
                print(
                    f"{shape:5s} {name:8s} M={m:4d} N={n:6d} K={k:5d}: "
                    + "  ".join(cells)
                    + f"  | best {best['lib']}/{best['variant']} ({floor_us:.1f} us weight floor)",
                    flush=True,
                )
                del x
            del w
    torch.backends.cuda.preferred_blas_library("cublas")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
