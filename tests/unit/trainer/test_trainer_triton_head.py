"""The Triton logits-gradient kernel (`ascent.trainer.triton_head`) against autograd through `log_softmax`:
natively on a CUDA machine, under the Triton interpreter (TRITON_INTERPRET=1) on CPU."""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernel module is imported
pytest.importorskip("triton")

from ascent.trainer import head as head_mod  # noqa: E402
from ascent.trainer.triton_head import logits_grad_triton_  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _reference_grad(z: torch.Tensor, targets, g, e, temperature):
    """dL/dz of L = sum g * log p[target] + sum e * H, in fp32 by autograd; also lse and H."""
    zf = z.detach().float().requires_grad_(True)
    logp = torch.log_softmax(zf / temperature, -1)
    ent = -(logp.exp() * logp).sum(-1)
    loss = (g * logp.gather(-1, targets[:, None])[:, 0]).sum() + (e * ent).sum()
    (grad,) = torch.autograd.grad(loss, zf)
    lse = torch.logsumexp(zf.detach() / temperature, -1)
    return grad, lse, ent.detach()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("vocab", [5000, 4096])  # a partial last tile, and an exact one
def test_kernel_matches_autograd(dtype, temperature, vocab):
    torch.manual_seed(vocab)
    n = 6
    z = (torch.randn(n, vocab, device=DEVICE) * 4).to(dtype)
    z[0, :7] = 30.0  # a peaked row: p near 1 at a few entries
    targets = torch.randint(0, vocab, (n,), device=DEVICE)
    targets[0] = 3
    g, e = torch.randn(n, device=DEVICE), torch.randn(n, device=DEVICE)
    want, lse, ent = _reference_grad(z, targets, g, e, temperature)
    got = z.clone()
    logits_grad_triton_(got, targets, lse, ent, g, e, temperature)
    # one rounding to `dtype` at the end (bf16: 8 bits of mantissa)
    rel = 2**-7 if dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(got.float(), want, rtol=rel, atol=1e-6)


def test_empty_rows_and_strided_rows():
    empty = torch.zeros(0, 10, device=DEVICE)
    none = torch.zeros(0, device=DEVICE)
    logits_grad_triton_(empty, none.long(), none, none, none, none, 1.0)  # a no-op, no launch
    wide = torch.zeros(10, 4, device=DEVICE).T  # columns not contiguous
    rows = torch.zeros(4, device=DEVICE)
    with pytest.raises(ValueError, match="contiguous"):
        logits_grad_triton_(wide, rows.long(), rows, rows, rows, rows, 1.0)


def test_head_backward_through_the_kernel_matches_autograd(monkeypatch):
    """`head_logprobs` with its backward on the kernel: gradients to hidden rows and the head weight."""
    monkeypatch.setattr(head_mod, "_logits_grad_fn", lambda device, compiled: logits_grad_triton_)
    torch.manual_seed(1)
    m, h, v = 9, 16, 300
    head = nn.Linear(h, v, bias=False).to(DEVICE)
    hidden = torch.randn(m, h, device=DEVICE, requires_grad=True)
    targets = torch.randint(0, v, (m,), device=DEVICE)
    w_lp, w_ent = torch.randn(m, device=DEVICE), torch.randn(m, device=DEVICE)
    lp, ent = head_mod.head_logprobs(
        head, hidden, targets, temperature=0.8, chunk_tokens=4, with_entropy=True
    )
    got = torch.autograd.grad((lp * w_lp).sum() + (ent * w_ent).sum(), (hidden, head.weight))
    logp = torch.log_softmax(head(hidden).float() / 0.8, -1)
    ref_ent = -(logp.exp() * logp).sum(-1)
    ref = (w_lp * logp.gather(-1, targets[:, None])[:, 0]).sum() + (w_ent * ref_ent).sum()
    want = torch.autograd.grad(ref, (hidden, head.weight))
    for a, b, name in zip(got, want, ("hidden", "weight"), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6, msg=name)


def test_the_kernel_is_what_cuda_uses():
    assert head_mod._logits_grad_fn(torch.device("cuda"), False) is logits_grad_triton_
    assert head_mod._logits_grad_fn(torch.device("cpu"), False) is head_mod.logits_grad_


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("vocab", [5000, 8192, 300])  # partial last step, exact steps, under one step
def test_stats_kernel_matches_chunk_stats(monkeypatch, temperature, vocab):
    """One pass of online sums gives chunk_stats' logp, lse and entropy (fp32 reference) and the kept cast."""
    from ascent.trainer import triton_head
    from ascent.trainer.triton_head import chunk_stats_triton

    monkeypatch.setattr(triton_head, "BLOCK", 1024)  # the interpreter reduces lane by lane: fewer lanes

    torch.manual_seed(vocab)
    n = 5
    z = torch.randn(n, vocab, device=DEVICE) * 4
    z[0, :7] = 30.0  # peaked: entropy near zero, where cancellation would show
    z[1, -1] = 50.0  # the max in the last column (a partial step for 5000)
    z[2] = 0.25  # flat: entropy log V
    targets = torch.randint(0, vocab, (n,), device=DEVICE)
    targets[0], targets[1] = 3, vocab - 1
    want = head_mod.chunk_stats(z.clone(), targets, temperature, True)
    before = z.clone()
    logp, lse, ent, kept = chunk_stats_triton(z, targets, temperature, True, torch.bfloat16)
    for got, ref in zip((logp, lse, ent), want, strict=True):
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=2e-5)
    assert abs(float(ent[2]) - torch.log(torch.tensor(float(vocab)))) < 1e-4
    assert kept.dtype == torch.bfloat16  # within one bf16 step: the interpreter truncates, CUDA rounds
    torch.testing.assert_close(kept.float(), z.to(torch.bfloat16).float(), rtol=2**-7, atol=0)
    assert torch.equal(z, before)  # the input is read only
    without = chunk_stats_triton(z, targets, temperature, False)
    assert len(without) == 3 and without[2].numel() == 0
    torch.testing.assert_close(without[0], logp, rtol=0, atol=0)


def test_stats_kernel_on_no_rows_and_strided_rows():
    from ascent.trainer.triton_head import chunk_stats_triton

    logp, lse, ent, kept = chunk_stats_triton(
        torch.zeros(0, 10, device=DEVICE),
        torch.zeros(0, dtype=torch.long, device=DEVICE),
        1.0,
        True,
        torch.float32,
    )
    assert logp.shape == lse.shape == ent.shape == (0,) and kept.shape == (0, 10)
    with pytest.raises(ValueError, match="contiguous"):
        chunk_stats_triton(torch.zeros(10, 4, device=DEVICE).T, torch.zeros(4, dtype=torch.long), 1.0, True)


@pytest.mark.parametrize("keep", [False, True])
def test_head_with_the_stats_kernel_matches_the_default_stats(monkeypatch, keep):
    """head_logprobs (logprobs, entropy and both gradients) with the Triton stats in its forward, as CUDA
    runs it, against the same head with `chunk_stats`."""
    from ascent.trainer import triton_head
    from ascent.trainer.triton_head import chunk_stats_triton

    monkeypatch.setattr(triton_head, "BLOCK", 1024)  # as above
    torch.manual_seed(0)
    head = nn.Linear(32, 5000, bias=False).to(DEVICE)
    hidden = torch.randn(12, 32, device=DEVICE)
    targets = torch.randint(0, 5000, (12,), device=DEVICE)

    def run() -> list[torch.Tensor]:
        head.zero_grad()
        h = hidden.clone().requires_grad_(True)
        logp, ent = head_mod.head_logprobs(
            head, h, targets, temperature=0.9, chunk_tokens=5, with_entropy=True, keep_logits=keep
        )
        (logp.sum() + 0.1 * ent.sum()).backward()
        return [logp.detach(), ent.detach(), h.grad, head.weight.grad.clone()]

    monkeypatch.setattr(head_mod, "TRITON_STATS", False)
    want = run()
    monkeypatch.setattr(head_mod, "_stats_fn", lambda device, compiled, keep: chunk_stats_triton)
    got = run()
    for g, w in zip(got, want, strict=True):  # kept logits: one bf16 step apart under the interpreter
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)
