r"""The trainer's attention, forward + backward, under the kernels torch offers (GPU; prints numbers).

One packed micro-batch of equal sequences (default 32 x 768 tokens, the e2e workload's), bf16, causal, with
a shape's heads. Each kernel is timed with CUDA events (median of --reps after warm-up) and checked against
the first one (the largest relative error, |a - b| / |b| in the 2-norm, of the output and of dq, dk, dv):

- `flash_gqa`: flash attention's varlen aten op with K/V at their own heads (`ascent.models.varlen`'s path
  on torch 2.11);
- `flash_repeat`: the same op with K/V repeated per query head (the path before);
- `sdpa_<backend>`: `scaled_dot_product_attention` on the dense [B, heads, S, dim] layout (the sequences
  are equal, so no packing is needed) with one backend forced: flash, cudnn (also with K/V repeated:
  `sdpa_cudnn_repeat`), efficient;
- `cudnn_varlen`: cuDNN's ragged op (`aten._cudnn_attention_forward` with sequence offsets), the kernel
  torch's nested tensors use, where this torch build runs it (forward and backward through autograd).

A kernel that fails prints why and the rest go on. TFLOP/s counts the causal half of the score matrix:
forward 2 matmuls x 2 x S^2/2 x dim x heads per sequence, backward 2.5x that.

    python3 bench/attention_kernels.py --shape 0.5b 1.5b --reps 20
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

SHAPES = {"0.5b": (14, 2, 64), "1.5b": (12, 2, 128), "7b": (28, 4, 128)}  # query heads, KV heads, dim


def flash_varlen(repeat: bool) -> Callable[..., Tensor]:
    def run(q: Tensor, k: Tensor, v: Tensor, cu: Tensor, s: int, b: int) -> Tensor:
        if repeat:
            k, v = (t.repeat_interleave(q.shape[1] // t.shape[1], dim=1) for t in (k, v))
        out = torch.ops.aten._flash_attention_forward(q, k, v, cu, cu, s, s, 0.0, True, False)
        return out[0]

    return run


def sdpa(backend: Any, gqa: bool) -> Callable[..., Tensor]:
    from torch.nn.attention import sdpa_kernel

    def run(q: Tensor, k: Tensor, v: Tensor, cu: Tensor, s: int, b: int) -> Tensor:
        if not gqa:
            k, v = (t.repeat_interleave(q.shape[1] // t.shape[1], dim=1) for t in (k, v))
        qd, kd, vd = (t.view(b, s, t.shape[1], t.shape[2]).transpose(1, 2) for t in (q, k, v))
        with sdpa_kernel(backend):
            out = F.scaled_dot_product_attention(qd, kd, vd, is_causal=True, enable_gqa=gqa)
        return out.transpose(1, 2).reshape(q.shape)

    return run


def cudnn_varlen(q: Tensor, k: Tensor, v: Tensor, cu: Tensor, s: int, b: int) -> Tensor:
    k, v = (t.repeat_interleave(q.shape[1] // t.shape[1], dim=1) for t in (k, v))
    out = torch.ops.aten._cudnn_attention_forward(q, k, v, None, cu, cu, s, s, True, 0.0, True, False)
    return out[0]


def kernels() -> dict[str, Callable[..., Tensor]]:
    from torch.nn.attention import SDPBackend

    return {
        "flash_gqa": flash_varlen(repeat=False),
        "flash_repeat": flash_varlen(repeat=True),
        "sdpa_flash": sdpa(SDPBackend.FLASH_ATTENTION, gqa=True),
        "sdpa_cudnn": sdpa(SDPBackend.CUDNN_ATTENTION, gqa=True),
        "sdpa_cudnn_repeat": sdpa(SDPBackend.CUDNN_ATTENTION, gqa=False),
        "sdpa_efficient": sdpa(SDPBackend.EFFICIENT_ATTENTION, gqa=True),
        "cudnn_varlen": cudnn_varlen,
    }


def time_ms(fn: Callable[[], Any], reps: int) -> float:
    """Median milliseconds of `fn` over `reps` runs after 3 warm-ups (CUDA events)."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def measure(name: str, kernel: Callable[..., Tensor], inputs: tuple, reps: int) -> dict[str, Any]:
    """Forward and forward + backward times of one kernel, and its outputs for the comparison."""
    q, k, v, cu, s, b = inputs
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    grad = torch.randn_like(q) * 0.1

    def fwd() -> Tensor:
        with torch.no_grad():
            return kernel(*[t.detach() for t in leaves], cu, s, b)

    def fwd_bwd() -> None:
        for t in leaves:
            t.grad = None
        kernel(*leaves, cu, s, b).backward(grad)

    result: dict[str, Any] = {"fwd_ms": time_ms(fwd, reps), "out": fwd(), "grads": None}
    try:
        out = kernel(*leaves, cu, s, b)
        out.backward(grad)
    except Exception as e:  # forward only (no backward in this build): say why
        result["bwd_error"] = f"{type(e).__name__}: {e}"[:300]
        return result
    result["grads"] = [t.grad.detach() for t in leaves]
    result["fwd_bwd_ms"] = time_ms(fwd_bwd, reps)
    return result


def run_shape(shape: str, seqs: int, seq_len: int, reps: int) -> list[dict[str, Any]]:
    heads, kv_heads, dim = SHAPES[shape]
    n = seqs * seq_len
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (
        torch.randn(n, h, dim, device="cuda", dtype=torch.bfloat16, generator=g)
        for h in (heads, kv_heads, kv_heads)
    )
    cu = torch.arange(0, n + 1, seq_len, device="cuda", dtype=torch.int32)
    inputs = (q, k, v, cu, seq_len, seqs)
    fwd_flop = seqs * 2 * 2 * (seq_len * seq_len / 2) * dim * heads
    rows, ref = [], None
    for name, kernel in kernels().items():
        try:
            r = measure(name, kernel, inputs, reps)
        except Exception as e:  # a kernel this build cannot run: say why, go on
            rows.append({"shape": shape, "kernel": name, "error": f"{type(e).__name__}: {e}"[:300]})
            print(f"{shape} {name:>15}: failed: {rows[-1]['error']}", flush=True)
            continue
        ref = ref or r
        rows.append(row_of(shape, name, r, ref, fwd_flop))
        print(line(rows[-1]), flush=True)
    return rows


def row_of(shape: str, name: str, r: dict, ref: dict, fwd_flop: float) -> dict[str, Any]:
    """One kernel's figures, its largest relative error against the first kernel's output (and gradients)."""
    pairs = [(r["out"], ref["out"])]
    if r["grads"] is not None and ref["grads"] is not None:
        pairs += list(zip(r["grads"], ref["grads"], strict=True))
    row = {
        "shape": shape,
        "kernel": name,
        "fwd_ms": r["fwd_ms"],
        "fwd_tflops": fwd_flop / r["fwd_ms"] / 1e9,
        "rel_err_vs_first": max(float((a.float() - b.float()).norm() / b.float().norm()) for a, b in pairs),
    }
    if "fwd_bwd_ms" in r:
        row["fwd_bwd_ms"] = r["fwd_bwd_ms"]
        row["fwd_bwd_tflops"] = 3.5 * fwd_flop / r["fwd_bwd_ms"] / 1e9
    else:
        row["bwd_error"] = r["bwd_error"]
    return row


def line(row: dict[str, Any]) -> str:
    head = f"{row['shape']} {row['kernel']:>18}: fwd {row['fwd_ms']:.3f} ms ({row['fwd_tflops']:.0f} TFLOP/s)"
    if "fwd_bwd_ms" in row:
        head += f", fwd+bwd {row['fwd_bwd_ms']:.3f} ms ({row['fwd_bwd_tflops']:.0f} TFLOP/s)"
    else:
        head += f", no backward ({row['bwd_error']})"
    return head + f", relative error vs first {row['rel_err_vs_first']:.1e}"


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", nargs="+", default=["0.5b", "1.5b"], choices=sorted(SHAPES))
    ap.add_argument("--seqs", type=int, default=32)
    ap.add_argument("--seq-len", type=int, default=768)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("bench/attention_kernels.py needs a CUDA device.")
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    rows = [row for shape in args.shape for row in run_shape(shape, args.seqs, args.seq_len, args.reps)]
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
