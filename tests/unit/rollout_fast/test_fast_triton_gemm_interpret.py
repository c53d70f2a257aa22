"""The fused decode GEMMs (triton_gemm.py) under the CPU interpreter (TRITON_INTERPRET=1), against their
torch references (fused_gemm.py), and LayerMath with fused_gemm on against off.

Skipped as test_fast_triton_interpret.py is: without triton, on CUDA machines (tests/gpu runs the compiled
kernels) and on numpy >= 2.4. In fp16 the interpreter rounds as the GPU does, so the kernels must equal the
references exactly; triton 3.6's interpreter truncates fp32 -> bf16 casts (the GPU rounds to nearest), so
bf16 results may differ by an ulp of bf16 per rounding from the references.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

if torch.cuda.is_available():
    pytest.skip("tests/gpu covers the compiled kernels", allow_module_level=True)
os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")
pytestmark = pytest.mark.skipif(
    np.lib.NumpyVersion(np.__version__) >= "2.4.0" or os.environ["TRITON_INTERPRET"] != "1",
    reason="needs the triton interpreter with numpy < 2.4",
)

# (block_m, block_n, block_k, split_k, warps, stages): small blocks so odd shapes leave ragged edges, and
# K splits (3 over 5 K blocks: one split walks fewer blocks) whose last program sums the partials
TILES = [(16, 32, 32, 1, 4, 2), (16, 16, 32, 3, 4, 2), (32, 16, 64, 2, 4, 2)]
SHAPES = [(7, 96, 40), (19, 160, 24), (5, 100, 36)]  # (T, K, columns): T, K, columns off every block


def _close(got, want, dtype):
    """fp16: equal but for rare one-ulp flips; bf16: within a few ulps (the interpreter truncates casts)."""
    got, want = got.float(), want.float()
    if dtype == torch.float16:
        assert torch.allclose(got, want, rtol=2**-10, atol=1e-5)
        assert (got != want).float().mean() < 0.02
    else:
        assert torch.allclose(got, want, rtol=2**-5, atol=1e-2)


def _data(t, k, n, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(t, k, generator=g).to(dtype)
    w = (torch.randn(n, k, generator=g) / k**0.5).to(dtype)
    return g, h, w


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape,tile", list(zip(SHAPES, TILES, strict=True)))
def test_gate_up_silu_matches_reference(dtype, shape, tile):
    from ascent.rollout.fast.fused_gemm import Tile, gate_up_silu_ref
    from ascent.rollout.fast.triton_gemm import gate_up_silu_launch

    t, k, i = shape
    _, h, w = _data(t, k, 2 * i, dtype)
    _close(gate_up_silu_launch(h, w, Tile(*tile)), gate_up_silu_ref(h, w), dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape,tile", list(zip(SHAPES, TILES, strict=True)))
def test_linear_residual_matches_reference(dtype, shape, tile):
    from ascent.rollout.fast.fused_gemm import Tile, linear_residual_ref
    from ascent.rollout.fast.triton_gemm import linear_residual_launch

    t, k, n = shape
    g, a, w = _data(t, k, n, dtype)
    x = torch.randn(t, n, generator=g) * 4  # the fp32 residual: its low bits must survive
    got = linear_residual_launch(a, w, x, Tile(*tile))
    assert got.dtype == torch.float32
    _close(got - x, linear_residual_ref(a, w, x) - x, dtype)  # the product's rounding, x added exactly


def _rope(t, d, g):
    angles = torch.rand(t, 1, generator=g) * 50 * torch.rand(d // 2, generator=g)
    return torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize(
    "heads,tile", [((3, 1, 16), TILES[0]), ((4, 2, 32), TILES[1]), ((2, 1, 8), TILES[2])]
)
def test_qkv_rope_matches_reference(dtype, bias, heads, tile):
    """q and k heads rotated, v heads as they are; a column block that is not a multiple of a half-head
    (16 columns over d/2 = 4 or 16) and one that is."""
    from ascent.rollout.fast.fused_gemm import Tile, qkv_rope_ref
    from ascent.rollout.fast.triton_gemm import qkv_rope_launch

    nh, kvh, d = heads
    n = (nh + 2 * kvh) * d
    g, h, w = _data(11, 96, n, dtype)
    b = torch.randn(n, generator=g).to(dtype) if bias else None
    cos, sin = _rope(11, d, g)
    got = qkv_rope_launch(h, w, b, cos, sin, nh + kvh, d, Tile(*tile))
    _close(got, qkv_rope_ref(h, w, b, cos, sin, nh + kvh, d), dtype)


def test_custom_ops_pick_their_tiles_and_trace(monkeypatch):
    """The registered ops (default tiles, K split for a small product on many SMs) equal the references,
    their fake implementations let dynamo trace a function calling them whole (fullgraph), and past
    MAX_ROWS rows they are the references."""
    from ascent.rollout.fast import triton_gemm as ops
    from ascent.rollout.fast.fused_gemm import gate_up_silu_ref, linear_residual_ref, pick_tile

    assert pick_tile("residual", 3, 64, 2048, torch.device("cpu"), 132).split_k > 1
    g, h, w = _data(3, 2048, 64, torch.float16)
    x = torch.randn(3, 64, generator=g)
    _close(ops.linear_residual(h, w, x) - x, linear_residual_ref(h, w, x) - x, torch.float16)

    def block(h, w, x):
        return ops.linear_residual(ops.gate_up_silu(h, w), w[:32, :32], x[:, :32])

    traced = torch.compile(block, backend="aot_eager", fullgraph=True)
    want = linear_residual_ref(gate_up_silu_ref(h, w), w[:32, :32], x[:, :32])
    _close(traced(h, w, x) - x[:, :32], want - x[:, :32], torch.float16)
    torch.library.opcheck(ops.gate_up_silu, (h, w), test_utils=("test_schema", "test_faketensor"))
    monkeypatch.setattr(ops, "MAX_ROWS", 2)  # more rows: the references (cuBLAS's path on a GPU) run
    assert torch.equal(ops.gate_up_silu(h, w), gate_up_silu_ref(h, w))


def _spec(nh=4, kvh=2, d=16, hidden=64, inter=96):
    from ascent.rollout.fast.spec import ModelSpec

    return ModelSpec("qwen2", 100, hidden, inter, 1, nh, kvh, d, 1e-6, 128, False)


def test_layer_math_fused_matches_unfused():
    """attn_in and attn_out of a Qwen2-shaped layer (q/k/v bias, fp32 residual and RoPE tables, half
    weights) with the fused kernels equal the unfused path to rounding; a Qwen3 layer (q/k norms) takes
    the unfused path (identical results)."""
    from ascent.rollout.fast.layers import LayerMath

    spec, t, dt = _spec(), 9, torch.float16
    g = torch.Generator().manual_seed(3)
    nq = spec.q_size + 2 * spec.kv_size
    w = lambda *s: (torch.randn(*s, generator=g) / s[-1] ** 0.5).to(dt)  # noqa: E731
    x = torch.randn(t, spec.hidden_size, generator=g)
    ln1, ln2 = 1 + 0.1 * torch.randn(2, spec.hidden_size, generator=g)
    qkv_w, qkv_b = w(nq, spec.hidden_size), w(nq, 1)[:, 0]
    cos, sin = _rope(t, spec.head_dim, g)
    plain, fused = LayerMath(spec), LayerMath(spec, fused_gemm=True)
    args = (x, cos, sin, ln1, (qkv_w,), (qkv_b,), None, None)
    for got, want in zip(fused.attn_in(*args), plain.attn_in(*args), strict=True):
        assert got.shape == want.shape
        _close(got, want, dt)
    q_norm = 1 + 0.1 * torch.randn(spec.head_dim, generator=g)
    qwen3 = (x, cos, sin, ln1, (qkv_w,), (None,), q_norm, q_norm)
    for got, want in zip(fused.attn_in(*qwen3), plain.attn_in(*qwen3), strict=True):
        assert torch.equal(got, want)
    attn = torch.randn(t, spec.q_size, generator=g).to(dt)
    mlp = (attn, w(spec.hidden_size, spec.q_size), ln2, (w(2 * spec.intermediate_size, spec.hidden_size),))
    down = w(spec.hidden_size, spec.intermediate_size)
    got, want = fused.attn_out(x, *mlp, down), plain.attn_out(x, *mlp, down)
    # eager torch rounds silu(g) before the product with u, the kernel (as inductor) once after it
    assert got.dtype == torch.float32 and torch.allclose(got, want, atol=1e-2)
    assert (got - want).abs().mean() < 1e-3
    gate, up = mlp[3][0].chunk(2)  # gate and up apart (shared trainer weights): o and down still fuse
    apart = (*mlp[:3], (gate, up))
    assert torch.allclose(fused.attn_out(x, *apart, down), plain.attn_out(x, *apart, down), atol=1e-2)
    traced = torch.compile(fused.attn_out, backend="aot_eager", fullgraph=True)  # dynamo through the ops
    assert torch.equal(traced(x, *mlp, down), got)
    traced_in = torch.compile(fused.attn_in, backend="aot_eager", fullgraph=True)
    for a, b in zip(traced_in(*args), fused.attn_in(*args), strict=True):
        assert torch.equal(a, b)
