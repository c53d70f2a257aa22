"""GPU check of `train.compile` (skipped without CUDA): the compiled trainer (decoder layers around the
varlen attention kernel, fused logprob head) gives the eager trainer's logprobs, loss and update."""

from __future__ import annotations

import pytest
import torch

from ascent.models import varlen

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not varlen.available(), reason="needs CUDA and torch's varlen_attn"),
]


def test_compiled_trainer_matches_eager_on_gpu(tmp_path):
    from ascent.messages import TrainSample
    from ascent.models.tiny import make_tiny_checkpoint
    from ascent.trainer import OptimSettings, PolicyWorker, minibatch_totals

    path = make_tiny_checkpoint(
        tmp_path / "m",
        hidden_size=256,
        num_layers=3,
        num_heads=8,
        num_kv_heads=2,
        max_position_embeddings=1024,
    )
    g = torch.Generator().manual_seed(0)
    samples = [
        TrainSample(
            prompt_ids=torch.randint(3, 80, (p,), generator=g).tolist(),
            response_ids=torch.randint(3, 80, (r,), generator=g).tolist(),
            loss_mask=[1] * r,
            advantages=[(-1.0) ** i] * r,
        )
        for i, (p, r) in enumerate(((100, 300), (7, 1), (256, 512), (33, 90), (40, 200), (12, 64)))
    ]
    totals = dict(zip(("total_tokens", "total_seqs"), minibatch_totals(samples), strict=True))

    def run(mode: str):
        worker = PolicyWorker(
            path,
            device="cuda",
            dtype="bf16",
            compile=mode,
            seed=0,
            gradient_checkpointing=True,
            optim=OptimSettings(lr=1e-4),
            max_tokens_per_micro_batch=1024,
        )
        assert varlen.enable_for_training(worker.model, worker.device, worker.compute_dtype)
        before = torch.tensor([x for row in worker.compute_logprobs(samples, 1.0) for x in row])
        metrics = worker.update(samples, **totals)
        after = torch.tensor([x for row in worker.compute_logprobs(samples, 1.0) for x in row])
        return worker, before, metrics, after

    eager, compiled = run("off"), run("on")
    assert compiled[0].compiled and compiled[2]["micro_batches"] > 1
    for a, b in ((eager[1], compiled[1]), (eager[3], compiled[3])):
        assert (a - b).abs().mean() < 2e-2
    for key in ("loss/policy", "grad_norm", "entropy"):
        assert compiled[2][key] == pytest.approx(eager[2][key], rel=5e-2, abs=1e-3), key
