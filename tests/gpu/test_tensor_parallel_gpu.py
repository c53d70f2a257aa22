"""GPU check of tensor-parallel rollout over NCCL (skipped without two CUDA devices): a replica over two GPUs
generates the greedy tokens one GPU generates (fp32, TF32 off), logprobs within 1e-3, and a bf16 replica over
two GPUs agrees with one GPU on a greedy prefix."""

from __future__ import annotations

import pytest
import torch

from ascent.messages import GenerationRequest, SamplingParams
from ascent.models import make_tiny_checkpoint
from ascent.rollout.fast import build_fast_engine

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices"),
]


def _requests() -> list[GenerationRequest]:
    greedy = SamplingParams(temperature=0.0, max_new_tokens=24)
    return [GenerationRequest([1 + (7 * i + j) % 90 for j in range(5 + 3 * i)], greedy) for i in range(6)]


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_two_gpus_generate_what_one_gpu_generates(dtype, tmp_path):
    torch.backends.cuda.matmul.allow_tf32 = False
    path = make_tiny_checkpoint(tmp_path, hidden_size=128, num_layers=3, num_heads=4, num_kv_heads=2, seed=3)
    kw = {"model_path": path, "dtype": dtype, "device": "cuda:0", "kv_cache_tokens": 4096}
    one = build_fast_engine(**kw)
    expected = one.generate(_requests())
    del one
    torch.cuda.empty_cache()
    two = build_fast_engine(**kw, tensor_parallel=2, tp_allreduce="nccl")  # (the comm test takes "symm")
    try:
        got = two.generate(_requests())
    finally:
        two.shutdown()
    for e, g in zip(expected, got, strict=True):
        n = len(e[0].token_ids) if dtype == "fp32" else 4  # bf16: sums in another order, a greedy prefix
        assert g[0].token_ids[:n] == e[0].token_ids[:n]
        diff = (torch.tensor(g[0].logprobs[:n]) - torch.tensor(e[0].logprobs[:n])).abs().max().item()
        assert diff < (1e-3 if dtype == "fp32" else 5e-2), diff
