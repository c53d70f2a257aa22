"""GPU checks of the routed mixture-of-experts path (skipped without CUDA): `torch._grouped_mm` over rows
sorted by expert computes in bf16 what the dense path computes (both within bf16 rounding of an fp32
reference), a CUDA graph captures it (no host sync) and its replays on new routings equal eager calls, and a
fast engine on a tiny Qwen3-MoE picks it by default and, with CUDA graphs, generates the greedy tokens the
dense path generates; so does a TP=2 replica (two devices), its MoE block compiled between the all-reduces
and its steps replayed from graphs."""

from __future__ import annotations

import gc

import pytest
import torch

from ascent.messages import GenerationRequest, SamplingParams
from ascent.models.tiny import make_tiny_moe_checkpoint
from ascent.rollout.fast import build_fast_engine, moe
from ascent.rollout.fast.moe import (
    experts_forward,
    experts_forward_routed,
    group_by_expert,
    route,
    sorting_group,
)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.skipif(
        torch.cuda.is_available() and torch.cuda.get_device_capability() < (9, 0),
        reason="torch._grouped_mm's bf16 kernel needs compute capability 9.0+",
    ),
]
E, K, H, INTER = 128, 8, 256, 64  # Qwen3-30B-A3B's expert count and top-k, smaller matrices


def _inputs(t: int, seed: int, dtype=torch.bfloat16) -> tuple[torch.Tensor, ...]:
    g = torch.Generator(device="cuda").manual_seed(seed)
    h = torch.randn(t, H, device="cuda", generator=g)
    logits = torch.randn(t, E, device="cuda", generator=g)
    ids, weights = route(logits, K, normalize=True)
    return h.to(dtype), ids, weights.to(dtype)


def _experts(dtype=torch.bfloat16) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator(device="cuda").manual_seed(0)
    gate_up = torch.randn(E, 2 * INTER, H, device="cuda", generator=g) / H**0.5
    down = torch.randn(E, H, INTER, device="cuda", generator=g) / INTER**0.5
    return gate_up.to(dtype), down.to(dtype)


@pytest.mark.parametrize("t", [1, 37, 512])
def test_routed_bf16_agrees_with_dense_within_rounding(t, monkeypatch):
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)  # an exact fp32 reference
    gate_up, down = _experts()
    h, ids, w = _inputs(t, seed=t)
    ref = experts_forward(h.float(), ids, w.float(), gate_up.float(), down.float())
    dense = experts_forward(h, ids, w, gate_up, down)
    routed = experts_forward_routed(h, ids, w, gate_up, down)
    assert routed.dtype == torch.bfloat16 and routed.shape == (t, H)
    scale = ref.abs().max().item()
    dense_err = (dense.float() - ref).abs().max().item()
    routed_err = (routed.float() - ref).abs().max().item()
    assert routed_err <= max(2 * dense_err, 0.02 * scale), (routed_err, dense_err, scale)


@pytest.mark.parametrize("t", [1, 128, 4096])  # 4096 x top-8 x 128 experts is above COUNTING_SORT_MAX
def test_compiled_grouping_on_cuda_is_the_stable_sorts(t):
    """The counting sort compiled as the TP MoE block is (dynamic shapes) gives the stable sort's order,
    inverse and ends on CUDA; above the threshold the compiled function sorts."""
    grouped = torch.compile(group_by_expert, dynamic=True)
    ids = _inputs(t, seed=t)[1].reshape(-1)
    for got, want in zip(grouped(ids, E), sorting_group(ids, E), strict=True):
        assert torch.equal(got, want)


def test_routed_bf16_is_bit_identical_counting_or_sorting(monkeypatch):
    gate_up, down = _experts()
    h, ids, w = _inputs(128, seed=3)
    counted = experts_forward_routed(h, ids, w, gate_up, down)
    monkeypatch.setattr(moe, "COUNTING_SORT_MAX", 0)
    assert torch.equal(counted, experts_forward_routed(h, ids, w, gate_up, down))


def test_a_cuda_graph_captures_the_routed_path():
    gate_up, down = _experts()
    h, ids, w = _inputs(64, seed=1)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up off the capture stream, as torch.cuda.graph asks
        experts_forward_routed(h, ids, w, gate_up, down)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = experts_forward_routed(h, ids, w, gate_up, down)
    for seed, lopsided in ((2, False), (3, True)):
        h2, ids2, w2 = _inputs(64, seed)
        if lopsided:  # every token to the same 8 experts: 120 experts without rows
            ids2 = torch.arange(K, device="cuda").expand(64, K).contiguous()
        h.copy_(h2), ids.copy_(ids2), w.copy_(w2)
        graph.replay()
        assert torch.equal(out, experts_forward_routed(h2, ids2, w2, gate_up, down))


def test_engine_defaults_to_routed_and_generates_as_dense(tmp_path):
    path = make_tiny_moe_checkpoint(tmp_path, expert_scale=10.0, seed=2)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=8)
    reqs = [GenerationRequest(list(range(4, 4 + n)), greedy) for n in (1, 9, 23, 40)]
    kw = dict(model_path=path, dtype="bf16", device="cuda", page_size=16, max_model_len=96, max_batch_size=4)
    routed = build_fast_engine(**kw)
    assert routed.runner.math.experts is experts_forward_routed  # the default on this GPU
    got = [g for gs in routed.generate(reqs) for g in gs]
    assert routed.graphs is not None and routed.graphs.graphs  # decode steps replayed captured graphs
    routed.sleep(release_weights=True)  # the fraction counts what the process holds: the dense engine
    del routed  # gets the card back
    gc.collect()
    torch.cuda.empty_cache()
    want = [g for gs in build_fast_engine(**kw, moe_path="dense").generate(reqs) for g in gs]
    _first_tokens_and_routes_agree(got, want)  # bf16: the paths' sums differ at rounding (moe.py)


def _first_tokens_and_routes_agree(got: list, want: list) -> None:
    """bf16 runs whose sums differ at rounding: the first 3 greedy tokens equal, layer 0's routes over the
    prompt and those tokens equal (its router reads no expert output), layer 1's at least 90% (near-ties
    may flip)."""
    for a, b in zip(got, want, strict=True):
        assert a.token_ids[:3] == b.token_ids[:3]
        seen = len(a.routed_experts) - len(a.token_ids) + 3
        first, second = a.routed_experts[:seen], b.routed_experts[:seen]
        assert torch.equal(first[:, 0], second[:, 0])
        assert (first[:, 1] == second[:, 1]).float().mean() >= 0.9


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_tensor_parallel_routed_with_compile_and_graphs_generates_as_one_gpu(tmp_path):
    path = make_tiny_moe_checkpoint(tmp_path, expert_scale=10.0, seed=2)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=8)
    reqs = [GenerationRequest(list(range(4, 4 + n)), greedy) for n in (1, 9, 23, 40)]
    kw = dict(
        model_path=path, dtype="bf16", device="cuda:0", page_size=16, max_model_len=96, max_batch_size=4
    )
    kw |= {"kv_cache_tokens": 2048}
    tp = build_fast_engine(**kw, tensor_parallel=2, tp_allreduce="nccl")  # (the comm test takes "symm")
    try:
        assert tp.runner.math.experts is experts_forward_routed
        assert "moe_mlp" in vars(tp.runner.math)  # the MoE block between the all-reduces is compiled
        got = [g for gs in tp.generate(reqs) for g in gs]
        assert tp.graphs is not None and tp.graphs.graphs  # TP decode steps replayed captured graphs
        tp.sleep(release_weights=True)
    finally:
        tp.shutdown()
    assert [c.exitcode for c in tp.children] == [0]
    del tp
    gc.collect()
    torch.cuda.empty_cache()
    want = [g for gs in build_fast_engine(**kw).generate(reqs) for g in gs]
    _first_tokens_and_routes_agree(got, want)
