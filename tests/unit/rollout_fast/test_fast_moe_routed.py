"""The routed mixture-of-experts path (`experts_forward_routed`: rows sorted by expert, grouped matmuls over
the chosen experts only) computes what the dense path computes (every expert on every token) in fp32, for
random and lopsided routings, and a fast engine on it generates the greedy tokens and records the routes the
dense engine does. The CUDA path (`torch._grouped_mm`, CUDA graphs) is tests/gpu/test_moe_routed_gpu.py."""

from __future__ import annotations

import pytest
import torch

from ascent.messages import GenerationRequest, SamplingParams
from ascent.models.tiny import make_tiny_moe_checkpoint
from ascent.rollout.fast import build_fast_engine
from ascent.rollout.fast.moe import (
    default_moe_path,
    experts_forward,
    experts_forward_routed,
    grouped_linear_loop,
    route,
)


def _experts(e: int, h: int, i: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(e, 2 * i, h, generator=g) / h**0.5, torch.randn(e, h, i, generator=g) / i**0.5


def _assert_paths_agree(h: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, seed: int = 0) -> None:
    gate_up, down = _experts(8, h.shape[1], 12, seed)
    want = experts_forward(h, ids, weights, gate_up, down)
    got = experts_forward_routed(h, ids, weights, gate_up, down)
    assert got.shape == want.shape and got.dtype == want.dtype
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("t", "k", "seed"), [(1, 2, 0), (7, 2, 1), (33, 3, 2), (5, 8, 3)])
def test_routed_equals_dense_for_routers_top_k(t, k, seed):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(t, 16, generator=g)
    ids, weights = route(torch.randn(t, 8, generator=g), k, normalize=True)
    _assert_paths_agree(h, ids, weights, seed)


def test_routed_equals_dense_for_lopsided_routings():
    g = torch.Generator().manual_seed(4)
    h, w = torch.randn(6, 16, generator=g), torch.rand(6, 2, generator=g)
    skewed = torch.tensor([[7, 3], [3, 7], [0, 7], [7, 0], [3, 0], [0, 3]])  # experts 1,2,4,5,6: no token
    _assert_paths_agree(h, skewed, w)
    one = torch.full((6, 1), 5)  # every token to one expert (k=1)
    _assert_paths_agree(h, one, w[:, :1])
    last = torch.tensor([[7, 6]] * 6)  # only the last two experts: earlier experts' ranges empty
    _assert_paths_agree(h, last, w)


def test_grouped_linear_loop_multiplies_each_row_range_by_its_expert():
    g = torch.Generator().manual_seed(5)
    x, w = torch.randn(6, 8, generator=g), torch.randn(3, 16, 8, generator=g)
    ends = torch.tensor([2, 2, 6], dtype=torch.int32)  # expert 1 has no rows
    want = torch.cat([x[:2] @ w[0].T, x[2:] @ w[2].T])
    torch.testing.assert_close(grouped_linear_loop(x, w, ends), want)


def test_torch_grouped_mm_reads_the_offsets_and_layout_the_cuda_path_passes():
    """The CUDA path calls `torch._grouped_mm(x, w.transpose(1, 2), offs=ends)`; where torch has a CPU
    kernel for it, that call gives the loop's result (dims 16-byte aligned, as the GPU needs)."""
    g = torch.Generator().manual_seed(6)
    x, w = torch.randn(10, 8, generator=g), torch.randn(4, 16, 8, generator=g)
    ends = torch.tensor([3, 3, 9, 10], dtype=torch.int32)
    try:
        got = torch._grouped_mm(x, w.transpose(1, 2), offs=ends, out_dtype=x.dtype)
    except (AttributeError, NotImplementedError, RuntimeError) as e:  # torch without a CPU kernel
        pytest.skip(f"torch._grouped_mm on CPU: {e}")
    torch.testing.assert_close(got, grouped_linear_loop(x, w, ends))


def test_unknown_moe_path_is_refused(tmp_path):
    with pytest.raises(ValueError, match="moe_path='sparse'"):
        build_fast_engine(model_path=tmp_path, dtype="fp32", device="cpu", moe_path="sparse")


def test_engine_on_the_routed_path_generates_and_routes_as_the_dense_one(tmp_path):
    path = make_tiny_moe_checkpoint(tmp_path, expert_scale=10.0, seed=2)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=10)
    reqs = [GenerationRequest(list(range(4, 4 + n)), greedy) for n in (1, 9, 23)]
    outs = {}
    for moe_path in ("dense", "routed"):
        kw = dict(dtype="fp32", device="cpu", page_size=16, max_model_len=64, max_batch_size=2)
        engine = build_fast_engine(model_path=path, moe_path=moe_path, **kw)
        assert (
            engine.runner.math.experts
            is {"dense": experts_forward, "routed": experts_forward_routed}[moe_path]
        )
        outs[moe_path] = [g for gs in engine.generate(reqs) for g in gs]
    for got, want in zip(outs["routed"], outs["dense"], strict=True):
        assert got.token_ids == want.token_ids and len(set(got.token_ids)) > 1
        assert torch.equal(got.routed_experts, want.routed_experts)


def test_default_path_off_cuda_is_dense():
    down = torch.zeros(8, 64, 32, dtype=torch.bfloat16)
    assert default_moe_path(torch.device("cpu"), down) == "dense"
    assert default_moe_path(torch.device("cpu"), None) == "dense"
