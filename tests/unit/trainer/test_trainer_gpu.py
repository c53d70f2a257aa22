"""The trainer on CUDA: packed attention, fused AdamW with bf16 autocast, and the memory bound of chunked
logprobs.

Marked `gpu`; skipped on machines without CUDA (CI). Run on the GPU machine with
`python -m pytest tests/unit/trainer -m gpu`.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from trainer_helpers import make_samples

from ascent.trainer import LossSettings, OptimSettings, PolicyWorker, minibatch_totals
from ascent.trainer.logprobs import logprobs_from_hidden

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def test_packed_logprobs_on_cuda_match_separate_forwards(tiny_path):
    worker = PolicyWorker(tiny_path, device="cuda", max_tokens_per_micro_batch=40)
    samples = make_samples(8, seed=2)
    got = worker.compute_logprobs(samples, temperature=0.9)
    with torch.no_grad():
        for s, lp in zip(samples, got, strict=True):
            ids = torch.tensor([s.prompt_ids + s.response_ids], device="cuda")
            logits = worker.model(input_ids=ids, use_cache=False).logits[0].float() / 0.9
            p = len(s.prompt_ids)
            tgt = torch.tensor(s.response_ids, device="cuda")
            want = torch.log_softmax(logits[p - 1 : -1], -1).gather(-1, tgt[:, None])[:, 0]
            torch.testing.assert_close(torch.tensor(lp, device="cuda"), want, atol=1e-4, rtol=0)


def test_bf16_update_uses_fused_adamw_and_fp32_master_weights(tiny_path):
    worker = PolicyWorker(
        tiny_path,
        device="cuda",
        dtype="bf16",
        gradient_checkpointing=True,
        optim=OptimSettings(lr=1e-3),
        loss=LossSettings(kl_loss_coef=0.1),
    )
    assert worker.optimizer.defaults["fused"] is True
    samples = make_samples(8, seed=3)
    refs = worker.compute_logprobs(samples, which="reference")
    samples = [replace(s, ref_logprobs=r) for s, r in zip(samples, refs, strict=True)]
    tokens, seqs = minibatch_totals(samples)
    m = worker.update(samples, total_tokens=tokens, total_seqs=seqs)
    assert all(torch.isfinite(torch.tensor(v)) for v in m.values()) and m["skipped"] == 0
    assert all(p.dtype == torch.float32 and p.is_cuda for p in worker.model.parameters())
    assert all(t.dtype == torch.bfloat16 for _, t in worker.named_weights(torch.bfloat16))


def _peak_bytes(n: int, hidden: int = 512, vocab: int = 151936, chunk: int = 1024) -> int:
    """Peak extra CUDA memory of chunked logprobs + entropy, forward and backward, for n tokens."""
    head = torch.nn.Linear(hidden, vocab, bias=False, device="cuda", dtype=torch.bfloat16)
    h = torch.randn(n, hidden, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    targets = torch.randint(0, vocab, (n,), device="cuda")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    lp, ent = logprobs_from_hidden(head, h, targets, temperature=0.7, chunk_tokens=chunk, with_entropy=True)
    (lp.sum() + ent.sum()).backward()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def test_chunked_logprobs_never_hold_full_logits():
    """16k tokens x 151936 vocab: fp32 logits alone would be 9.3 GiB; the chunked peak does not grow with
    n."""
    small, large = _peak_bytes(4096), _peak_bytes(16384)
    full_logits = 16384 * 151936 * 4
    print(f"peak 4k tokens {small / 2**30:.2f} GiB, 16k tokens {large / 2**30:.2f} GiB")
    assert large - small < 2**28  # only [n, hidden]-sized terms grow (< 256 MiB here)
    assert large < full_logits / 3


def test_fused_head_sums_weight_gradients_in_fp32_on_cuda():
    """bf16 autocast on CUDA: the one-function head (fp32-output matmuls for the weight gradient) is at least
    as close to the fp32 reference as the per-chunk checkpointed path, whose chunk gradients round to bf16."""
    from ascent.trainer import logprobs as L
    from ascent.trainer.head import _fp32_out_matmul

    assert _fp32_out_matmul("cuda")
    torch.manual_seed(0)
    head = torch.nn.Linear(256, 32000, bias=False, device="cuda")
    hidden = torch.randn(4096, 256, device="cuda", requires_grad=True)
    targets = torch.randint(0, 32000, (4096,), device="cuda")
    w = torch.randn(4096, device="cuda")

    def weight_grad(fused: bool, autocast: bool) -> torch.Tensor:
        head.zero_grad(set_to_none=True)
        saved = L.fusable_head
        L.fusable_head = (lambda h: True) if fused else (lambda h: False)
        try:
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
                lp, _ = L.logprobs_from_hidden(head, hidden, targets, chunk_tokens=256, compiled=True)
            (lp * w).sum().backward()
        finally:
            L.fusable_head = saved
        return head.weight.grad.clone()

    ref = weight_grad(False, autocast=False)
    err = {f: float((weight_grad(f, True) - ref).norm() / ref.norm()) for f in (True, False)}
    print(f"weight-grad relative error vs fp32: fused {err[True]:.2e}, checkpointed {err[False]:.2e}")
    assert err[True] <= err[False] * 1.05 and err[True] < 2e-2
