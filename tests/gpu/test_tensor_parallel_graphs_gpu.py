"""GPU check of a tensor-parallel replica's CUDA graphs (skipped without two CUDA devices): TP=2 replaying its
captured decode steps (broadcasts of the step inputs and all-reduces inside the graphs) generates the greedy
tokens TP=2 generates eagerly and one GPU generates (fp32, TF32 off; logprobs within 1e-3), over more samples
than decode rows (rows refilled mid-run, compaction to smaller buckets) and again after a sleep (every rank
recaptures)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from ascent.messages import GenerationRequest, SamplingParams
from ascent.models import make_tiny_checkpoint
from ascent.rollout.fast import build_fast_engine
from ascent.rollout.fast.weights import load_state_dict

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices"),
]
HEAD_SCALE = 10.0  # a sharper head than random init: varied, peaked greedy outputs


def _requests(k: int) -> list[GenerationRequest]:
    greedy = [SamplingParams(temperature=0.0, max_new_tokens=10 + 3 * i, n=1 + i % 3) for i in range(k)]
    return [GenerationRequest([1 + (7 * i + j) % 90 for j in range(5 + 3 * i)], greedy[i]) for i in range(k)]


def _run(engine, path: str) -> tuple[list, bool]:
    """A batch of 8 requests (16 samples over 8 rows), then a sleep and a smaller batch (recaptured) ->
    ([[(tokens, logprobs)] per request], whether graphs were captured)."""
    engine.update_weights([("lm_head.weight", load_state_dict(path)["lm_head.weight"] * HEAD_SCALE)])
    try:
        out = engine.generate(_requests(8))
        engine.sleep()
        out += engine.generate(_requests(3))
        captured = engine.graphs is not None and bool(engine.graphs.graphs)
    finally:
        if hasattr(engine, "shutdown"):
            engine.shutdown()
    return [[(g.token_ids, g.logprobs) for g in gens] for gens in out], captured


def test_graphs_generate_what_eager_and_one_gpu_generate(tmp_path):
    torch.backends.cuda.matmul.allow_tf32 = False
    path = make_tiny_checkpoint(
        tmp_path,
        hidden_size=128,
        num_layers=3,
        num_heads=4,
        num_kv_heads=2,
        tie_word_embeddings=False,
        seed=3,
    )
    kw: dict[str, Any] = {"model_path": path, "dtype": "fp32", "device": "cuda:0", "max_batch_size": 8}
    kw |= {"kv_cache_tokens": 4096, "max_model_len": 256}
    graphs, captured = _run(build_fast_engine(**kw, tensor_parallel=2, tp_allreduce="nccl"), str(path))
    assert captured  # the default on CUDA: the TP replica replays graphs
    eager, captured_eager = _run(
        build_fast_engine(**kw, tensor_parallel=2, tp_allreduce="nccl", cuda_graphs=False), str(path)
    )
    assert not captured_eager
    one, _ = _run(build_fast_engine(**kw), str(path))
    for other in (eager, one):
        assert [[t for t, _ in gens] for gens in graphs] == [[t for t, _ in gens] for gens in other]
        lp = torch.tensor([x for gens in graphs for _, lps in gens for x in lps])
        lp_other = torch.tensor([x for gens in other for _, lps in gens for x in lps])
        assert (lp - lp_other).abs().max().item() < 1e-3
    assert len({tuple(t) for gens in one for t, _ in gens}) > 4  # varied outputs, not one repeated string
