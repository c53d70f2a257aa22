"""`train.compile`: compiled decoder layers and logprob head give the eager trainer's numbers."""

from __future__ import annotations

import pytest
import torch
from trainer_helpers import make_samples

from ascent.trainer import OptimSettings, PolicyWorker, minibatch_totals
from ascent.trainer.compiled import compile_enabled
from ascent.trainer.logprobs import _chunk_logprobs, _fused_chunk_logprobs


def test_compile_setting():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert not compile_enabled("auto", cpu) and compile_enabled("auto", cuda)
    assert compile_enabled("on", cpu) and not compile_enabled("off", cuda)
    with pytest.raises(ValueError, match="train.compile='yes'"):
        compile_enabled("yes", cpu)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_fused_chunk_formula_equals_the_eager_one(temperature):
    torch.manual_seed(0)
    head = torch.nn.Linear(16, 50, bias=False)
    hidden = torch.randn(7, 16, requires_grad=True)
    targets = torch.randint(0, 50, (7,))
    lp, ent = _chunk_logprobs(head, hidden, targets, temperature, True)
    lp2, ent2 = _fused_chunk_logprobs(head, hidden, targets, temperature, True)
    torch.testing.assert_close(lp2, lp, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(ent2, ent, rtol=1e-6, atol=1e-6)
    (g,) = torch.autograd.grad(lp.sum(), hidden)
    (g2,) = torch.autograd.grad(lp2.sum(), hidden)
    torch.testing.assert_close(g2, g, rtol=1e-5, atol=1e-6)
    assert not ent2.requires_grad  # a metric on the fused path (entropy_coef != 0 runs eager)


def _run(path, compile_mode: str, samples):
    worker = PolicyWorker(
        path,
        device="cpu",
        compile=compile_mode,
        seed=0,
        optim=OptimSettings(lr=1e-3),
        gradient_checkpointing=True,
    )
    worker.max_tokens = max(s.num_tokens for s in samples) * 3  # several packed micro-batches
    before = worker.compute_logprobs(samples, 0.9)
    totals = dict(zip(("total_tokens", "total_seqs"), minibatch_totals(samples), strict=True))
    metrics = worker.update(samples, **totals)
    return worker, before, metrics, worker.compute_logprobs(samples, 0.9)


def test_compiled_trainer_matches_eager(tiny_path):
    """Layers compile once for all (no recompile per layer), and logprobs, loss, grad norm and the updated
    policy agree with the eager trainer to fp32 rounding (CPU, with gradient checkpointing)."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()  # graphs compiled by earlier tests of the session do not count
    samples = make_samples(8, seed=3)
    eager = _run(tiny_path, "off", samples)
    compiled = _run(tiny_path, "on", samples)
    assert compiled[0].compiled and not eager[0].compiled
    assert compiled[2]["micro_batches"] > 1
    for a, b in ((eager[1], compiled[1]), (eager[3], compiled[3])):
        flat_a = torch.tensor([x for row in a for x in row])
        flat_b = torch.tensor([x for row in b for x in row])
        torch.testing.assert_close(flat_b, flat_a, rtol=0, atol=2e-5)
    for key in ("loss/policy", "grad_norm", "entropy", "clipfrac"):
        assert compiled[2][key] == pytest.approx(eager[2][key], rel=1e-4, abs=1e-6), key
    assert 0 < torch._dynamo.utils.counters["stats"]["unique_graphs"] < 12
