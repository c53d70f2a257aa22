"""What the fused decode GEMMs compute (torch references) and with which tiles (a static table).

triton_gemm.py runs a dense decoder layer's four matrix products as three kinds of Triton kernels, each with
the elementwise work around it fused into its epilogue (`EngineOptions.fused_gemm`, layers.py):
- "gate_up": h [T, K] times the fused gate/up weight [2I, K] -> silu(g) * u [T, I], the [T, 2I] product
  never written;
- "residual": a [T, K] times w [N, K] plus the fp32 residual x [T, N] -> [T, N] fp32 (o_proj, down_proj);
- "qkv_rope": h [T, K] times the fused q/k/v weight (+ bias) -> [T, (nh + 2 kvh) d] with q and k rotated.
The references below are the arithmetic the unfused path (layers.py under torch.compile) performs, rounding
for rounding: they are the kernels' tests and their fallback (rows past `MAX_ROWS`: a long prefill, where
cuBLAS beats a decode-shaped tile).

Tiles are picked without run-time autotuning (decode steps are captured in CUDA graphs, and benchmarks must
not run during capture): `TILES` holds measured configs by (arch, op, weight rows, K), bench/gemm_sweep.py
prints entries to paste, and `default_tile` is the fallback rule. This module imports no triton.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

OPS = ("gate_up", "residual", "qkv_rope")
MAX_ROWS = 1024  # past this many rows the references run (cuBLAS + elementwise): prefill-sized products


class Tile(NamedTuple):
    """One launch configuration. `block_n` counts the columns of ONE accumulator (gate_up and qkv_rope keep
    two); `split_k` > 1 splits K over programs, the last one of a tile summing the partials in order."""

    block_m: int
    block_n: int
    block_k: int
    split_k: int
    num_warps: int
    num_stages: int


# (arch, op, weight rows, K) -> {rows: Tile as a tuple}: the config for up to that many rows (the smallest
# key >= T; past the largest key, the largest). bench/gemm_sweep.py prints entries in this form.
TILES: dict[tuple[str, str, int, int], dict[int, tuple[int, int, int, int, int, int]]] = {}

SMEM_BYTES = 200 * 1024  # what a Hopper SM gives one program, with room for the epilogue's scratch


def arch_of(device: torch.device) -> str:
    """'sm90' for an H100, 'cpu' for the interpreter: the first key of `TILES`."""
    if device.type != "cuda":
        return "cpu"
    major, minor = torch.cuda.get_device_capability(device)
    return f"sm{major}{minor}"


def pick_tile(op: str, rows: int, w_rows: int, k: int, device: torch.device, sms: int) -> Tile:
    """The tile for `op` over `rows` x the weight [w_rows, K]: `TILES`'s entry (its row block no taller
    than the rows need: fewer rows than the entry was measured at), else `default_tile`."""
    table = TILES.get((arch_of(device), op, w_rows, k))
    if table:
        fits = [r for r in table if r >= rows]
        tile = Tile(*table[min(fits) if fits else max(table)])
        return tile._replace(block_m=min(tile.block_m, max(16, _pow2(rows))))
    return default_tile(op, rows, w_rows, k, sms)


def default_tile(op: str, rows: int, w_rows: int, k: int, sms: int) -> Tile:
    """A rule for decode shapes: row blocks of the batch's size (16..128), the widest column block that
    still gives every SM a program, then K split until the programs fill the SMs about twice, each
    walking at least 4 K blocks (a decode GEMM is bound by how fast each SM streams its share of the
    weight, so idle SMs are idle bandwidth)."""
    accs = 1 if op == "residual" else 2
    cols = w_rows // accs  # columns of one accumulator
    bm = min(max(16, _pow2(rows)), 64 if rows <= 128 else 128)
    bk = 128 if bm <= 64 else 64
    bn = 128 if accs == 1 else 64
    tiles = lambda n: -(-rows // bm) * -(-cols // n)  # noqa: E731
    while bn > (32 if bm < 128 else 64) and tiles(bn) < sms:  # many rows: wide tiles, or A is re-read
        bn //= 2
    k_blocks = -(-k // bk)
    split = 1
    while split < 16 and tiles(bn) * split * 2 <= 2 * sms and k_blocks // (split * 2) >= 4:
        split *= 2
    warps = 8 if bm * bn * accs >= 128 * 128 else 4
    stages = 4
    while stages > 2 and stages * (bm + accs * bn) * bk * 2 > SMEM_BYTES:
        stages -= 1
    return Tile(bm, bn, bk, split, warps, stages)


def _pow2(n: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(n, 1))))


def gate_up_silu_ref(h: Tensor, w: Tensor) -> Tensor:
    """h [T, K], w [2I, K] (gate rows, then up rows) -> silu(g) * u [T, I] in h's dtype: the product rounded
    to h's dtype, then SiLU*up in fp32 rounded once (what inductor fuses after the cuBLAS matmul)."""
    gate, up = F.linear(h, w).chunk(2, dim=-1)
    act = F.silu(gate.float(), inplace=True)  # in place on the fp32 copy: a long prefill's memory
    return act.mul_(up).to(h.dtype)


def linear_residual_ref(a: Tensor, w: Tensor, x: Tensor) -> Tensor:
    """a [T, K], w [N, K], x [T, N] fp32 residual -> x + a @ w.T rounded to a's dtype, [T, N] fp32."""
    return x + F.linear(a, w).float()


def qkv_rope_ref(
    h: Tensor, w: Tensor, bias: Tensor | None, cos: Tensor, sin: Tensor, rot_heads: int, head_dim: int
) -> Tensor:
    """h [T, K], w [(nh + 2 kvh) d, K], bias [(nh + 2 kvh) d] | None, cos/sin [T, d] fp32 -> [T, (nh+2kvh) d]
    in h's dtype: the biased product rounded to h's dtype, then the first `rot_heads` (= nh + kvh) heads
    rotated in fp32 (rotate-half, as layers.apply_rope) and rounded once; the v heads as they are."""
    qkv = F.linear(h, w, bias)
    t, d = qkv.shape[0], head_dim
    qk = qkv[:, : rot_heads * d].view(t, rot_heads, d).float()
    c, s = cos[:, None, :].float(), sin[:, None, :].float()
    q1, q2 = qk.chunk(2, dim=-1)
    rotated = (qk * c + torch.cat((-q2, q1), dim=-1) * s).to(h.dtype)
    return torch.cat([rotated.view(t, -1), qkv[:, rot_heads * d :]], dim=-1)
