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
