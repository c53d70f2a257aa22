"""The folded residual add (layers.py): each layer's MLP output stays pending until the next layer's
`attn_in` adds it. The layer stack must give bit for bit the hidden states of the unfolded arithmetic (the add
at the end of each layer), eager and compiled, with fp32 and with bf16 weights."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ascent.models import make_tiny_checkpoint
from ascent.rollout.fast import build_fast_engine
from ascent.rollout.fast.attention import prefill_attention
from ascent.rollout.fast.fp8 import linear
from ascent.rollout.fast.layers import rms_norm
from ascent.rollout.fast.runner import ModelRunner, compile_step

T = 12  # tokens of one prompt


@pytest.fixture(scope="module")
def four_layers(tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory.mktemp("fold"), num_layers=4, tie_word_embeddings=False)


def _unfold(runner: ModelRunner, compile: bool) -> None:
    """Make `runner` compute the layers as before the fold: `attn_out` adds the MLP output itself and
    returns nothing pending, so `attn_in` never adds."""
    math, eps, inter = runner.math, runner.spec.rms_eps, runner.spec.intermediate_size

    def attn_in(x, pending, cos, sin, ln_w, qkv_w, qkv_b, q_norm, k_norm):
        assert pending is None
        h = rms_norm(x, ln_w, eps).to(qkv_w[0].dtype)
        return (x, *math.qkv(h, cos, sin, qkv_w, qkv_b, q_norm, k_norm))

    def attn_out(x, attn, o_w, ln_w, gate_up_w, down_w):
        assert len(gate_up_w) == 1  # one fused gate/up matrix
        x = x + linear(attn, o_w)
        h = rms_norm(x, ln_w, eps).to(down_w.dtype)
        gate, up = F.linear(h, gate_up_w[0]).split(inter, dim=-1)
        return x + linear(F.silu(gate) * up, down_w), None

    runner.attn_in, runner.attn_out = (
        (compile_step(attn_in), compile_step(attn_out))
        if compile
        else (
            attn_in,
            attn_out,
        )
    )


def _hidden(runner: ModelRunner, ids: torch.Tensor) -> torch.Tensor:
    """The layer stack's output [T, H] on one causal prompt `ids` [T] (positions 0..T-1, no cache)."""
    spec = runner.spec
    nh, kvh, d = spec.num_heads, spec.num_kv_heads, spec.head_dim

    def attend(i, q, k, v):
        out = prefill_attention(q.view(1, T, nh, d), k.view(1, T, kvh, d), v.view(1, T, kvh, d), runner.scale)
        return out.reshape(T, nh * d)

    x = F.embedding(ids, runner.w.embed)
    return runner._layers(x, runner.cos[:T], runner.sin[:T], None, attend)


def check_fold(path, dtype: str, compile: bool, device: str = "cpu") -> None:
    """The layers of the checkpoint at `path` (4 layers) with the fold equal the unfolded arithmetic bit for
    bit, and the bf16 layers 1-3 (none in fp32) add a pending MLP output (tests/gpu runs this on CUDA)."""

    def runner() -> ModelRunner:
        engine = build_fast_engine(
            model_path=path,
            dtype=dtype,
            device=device,
            page_size=16,
            kv_cache_tokens=1024,  # two engines at once: a small cache each, not half the GPU
            compile=compile,
            cuda_graphs=False,
        )
        return engine.runner

    if compile:  # both sides compiled afresh, static shapes: graphs that other engines of this process
        torch._dynamo.reset()  # made dynamic would reduce in another order than the unfolded side's
    ids = torch.randint(0, 40, (T,), generator=torch.Generator().manual_seed(0)).to(device)
    folded, unfolded = runner(), runner()
    _unfold(unfolded, compile)
    pending, attn_in = [], folded.attn_in

    def counted(x, d, *rest):
        pending.append(d is not None)
        return attn_in(x, d, *rest)

    folded.attn_in = counted
    got, want = _hidden(folded, ids), _hidden(unfolded, ids)
    assert got.dtype == torch.float32 and torch.equal(got, want)
    # bf16: layers 1-3 add the layer before's MLP output; fp32 folds nothing (addmm keeps the add, layers.py)
    assert pending == [False, True, True, True] if dtype == "bf16" else [False] * 4


@pytest.mark.parametrize("compile", [False, True])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_folded_layers_equal_the_unfolded_arithmetic_bit_for_bit(four_layers, dtype, compile):
    check_fold(four_layers, dtype, compile)
