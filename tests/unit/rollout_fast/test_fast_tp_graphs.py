"""The graph path of a tensor-parallel replica on CPU: with a stand-in for CUDA graphs (capture runs the step,
replay runs it again over the same persistent tensors, which is what a graph replays), two ranks capture
the same buckets in the same order, replay them by the driver's step commands (bucket-sized steps over idle
rows, inputs broadcast inside the step) and generate what one process generates. The real capture is
tests/gpu/test_tensor_parallel_graphs_gpu.py's."""

from __future__ import annotations

from typing import Any

import torch

import ascent.rollout.fast.engine as engine_module
from ascent.messages import GenerationRequest, SamplingParams
from ascent.models import make_tiny_checkpoint
from ascent.rollout.fast import build_fast_engine
from ascent.rollout.fast.graphs import GraphRunner, pick_bucket


class StepGraphs(GraphRunner):
    """GraphRunner with the step run for real in place of a capture and of each replay."""

    def capture(self, key: Any, up_to: int) -> None:
        top = pick_bucket(self.buckets, up_to)
        for b in sorted((b for b in self.buckets if b <= top), reverse=True):
            if (b, key) not in self.graphs:
                self.step(b, key)  # (a capture executes the step once)
                self.graphs[(b, key)] = None  # type: ignore[assignment]

    def replay(self, b: int, key: Any) -> None:
        assert (b, key) in self.graphs, (b, key)
        self.step(b, key)


def _requests() -> list[GenerationRequest]:
    g = torch.Generator().manual_seed(5)
    shapes = [(7, 3, 9), (4, 1, 12), (11, 2, 6)]  # (prompt, n, max_new): 6 samples over 4 rows
    return [
        GenerationRequest(
            torch.randint(4, 40, (p,), generator=g).tolist(),
            SamplingParams(temperature=0.0, max_new_tokens=m, n=n),
        )
        for p, n, m in shapes
    ]


def test_two_ranks_replaying_step_graphs_generate_what_one_process_generates(tmp_path, monkeypatch):
    monkeypatch.setattr(engine_module, "GraphRunner", StepGraphs)  # (the forked rank inherits it)
    monkeypatch.setattr(engine_module.gc, "freeze", lambda: None)  # (a first capture freezes the heap)
    path = make_tiny_checkpoint(tmp_path, tie_word_embeddings=False, seed=4)
    kw: dict[str, Any] = {"model_path": path, "dtype": "fp32", "device": "cpu", "page_size": 8}
    kw |= {"max_model_len": 64, "max_batch_size": 4, "cuda_graphs": True}
    engine = build_fast_engine(**kw, tensor_parallel=2)
    try:
        tp2 = engine.generate(_requests())
        assert isinstance(engine.graphs, StepGraphs) and {b for b, _ in engine.graphs.graphs} == {2, 4}
    finally:
        engine.shutdown()
    assert [c.exitcode for c in engine.children] == [0]
    tp1 = build_fast_engine(**kw).generate(_requests())
    for a, b in zip(tp2, tp1, strict=True):
        assert [g.token_ids for g in a] == [g.token_ids for g in b]
        lp_a = torch.tensor([x for g in a for x in g.logprobs])
        lp_b = torch.tensor([x for g in b for x in g.logprobs])
        assert torch.allclose(lp_a, lp_b, atol=1e-4)
