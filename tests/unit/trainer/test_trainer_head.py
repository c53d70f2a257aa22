"""The one-function LM head (`ascent.trainer.head`) equals autograd through `log_softmax`, in value and
grad."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ascent.trainer.head import chunk_stats, fusable_head, head_logprobs, logits_grad_


def _reference(head: nn.Linear, hidden, targets, temperature):
    """Full fp32 logits -> (logprobs [M], entropy [M]) by plain autograd ops."""
    z = head(hidden).float() / temperature
    logp_all = torch.log_softmax(z, -1)
    return logp_all.gather(-1, targets[:, None])[:, 0], -(logp_all.exp() * logp_all).sum(-1)


def _case(seed: int, m: int = 11, h: int = 16, v: int = 50):
    torch.manual_seed(seed)
    head = nn.Linear(h, v, bias=False)
    hidden = torch.randn(m, h, requires_grad=True)
    targets = torch.randint(0, v, (m,))
    w_lp, w_ent = torch.randn(m), torch.randn(m)
    return head, hidden, targets, w_lp, w_ent


def _grads(head, hidden, loss):
    head.zero_grad(set_to_none=True)
    hidden.grad = None
    loss.backward()
    return hidden.grad.clone(), head.weight.grad.clone()


@pytest.mark.parametrize("chunk", [1, 4, 64])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("compiled", [False, True])
def test_values_and_gradients_match_autograd(chunk, temperature, compiled):
    """Logprobs, entropy, and the gradients to hidden rows and head weight (entropy in the loss too)."""
    head, hidden, targets, w_lp, w_ent = _case(0)
    lp, ent = head_logprobs(
        head,
        hidden,
        targets,
        temperature=temperature,
        chunk_tokens=chunk,
        with_entropy=True,
        compiled=compiled,
    )
    ref_lp, ref_ent = _reference(head, hidden, targets, temperature)
    torch.testing.assert_close(lp, ref_lp, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ent, ref_ent, rtol=1e-5, atol=1e-6)
    got = _grads(head, hidden, (lp * w_lp).sum() + (ent * w_ent).sum())
    want = _grads(head, hidden, (ref_lp * w_lp).sum() + (ref_ent * w_ent).sum())
    for g, r, name in zip(got, want, ("hidden", "weight"), strict=True):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("compiled", [False, True])
def test_kept_logits_give_the_same_values_and_gradients(compiled):
    """keep_logits: the backward reads the forward's logits instead of recomputing them; same math, and the
    in-place stats must not touch the kept copy (temperature and entropy both write in place)."""
    head, hidden, targets, w_lp, w_ent = _case(3)
    kw = {
        "temperature": 0.7,
        "chunk_tokens": 4,
        "with_entropy": True,
        "compiled": compiled,
        "keep_logits": True,
    }
    lp, ent = head_logprobs(head, hidden, targets, **kw)
    ref_lp, ref_ent = _reference(head, hidden, targets, 0.7)
    torch.testing.assert_close(lp, ref_lp, rtol=1e-5, atol=1e-6)
    got = _grads(head, hidden, (lp * w_lp).sum() + (ent * w_ent).sum())
    want = _grads(head, hidden, (ref_lp * w_lp).sum() + (ref_ent * w_ent).sum())
    for g, r, name in zip(got, want, ("hidden", "weight"), strict=True):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-6, msg=name)


def test_entropy_as_a_metric_carries_no_gradient():
    head, hidden, targets, w_lp, _ = _case(1)
    lp, ent = head_logprobs(head, hidden, targets, with_entropy=True, entropy_grad=False, chunk_tokens=3)
    assert not ent.requires_grad and lp.requires_grad
    ref_lp, _ = _reference(head, hidden, targets, 1.0)
    got = _grads(head, hidden, (lp * w_lp).sum())
    want = _grads(head, hidden, (ref_lp * w_lp).sum())
    torch.testing.assert_close(got[1], want[1], rtol=1e-4, atol=1e-6)


def test_without_entropy_and_frozen_weight():
    """No entropy asked: an empty entropy; a frozen head (LoRA's base): no weight gradient, hidden's only."""
    head, hidden, targets, w_lp, _ = _case(2)
    head.weight.requires_grad_(False)
    lp, ent = head_logprobs(head, hidden, targets, chunk_tokens=5)
    assert ent.numel() == 0
    (lp * w_lp).sum().backward()
    assert head.weight.grad is None
    ref = hidden.grad.clone()
    hidden.grad = None
    (_reference(head, hidden, targets, 1.0)[0] * w_lp).sum().backward()
    torch.testing.assert_close(ref, hidden.grad, rtol=1e-4, atol=1e-6)


def test_weight_gradient_adds_to_an_existing_one():
    """Two micro-batches: .grad holds the sum, as with any parameter."""
    head, hidden, targets, w_lp, _ = _case(3)
    for _ in range(2):
        (head_logprobs(head, hidden, targets, chunk_tokens=4)[0] * w_lp).sum().backward()
    twice = head.weight.grad.clone()
    head.zero_grad(set_to_none=True)
    (_reference(head, hidden, targets, 1.0)[0] * w_lp).sum().backward()
    torch.testing.assert_close(twice, 2 * head.weight.grad, rtol=1e-4, atol=1e-6)


def test_bf16_autocast_runs_in_bf16_and_stays_close():
    """Under autocast the matmuls run in bf16; values stay within bf16 rounding of the fp32 reference."""
    head, hidden, targets, w_lp, _ = _case(4, m=33, h=32, v=97)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        lp, _ = head_logprobs(head, hidden, targets, chunk_tokens=8)
    assert lp.dtype == torch.float32
    ref_lp, _ = _reference(head, hidden, targets, 1.0)
    torch.testing.assert_close(lp, ref_lp, rtol=0, atol=0.1)
    (lp * w_lp).sum().backward()
    assert head.weight.grad.dtype == torch.float32 and hidden.grad.dtype == torch.float32


def test_formula_helpers_match_autograd():
    """`chunk_stats` gives log_softmax's values and `logits_grad_` its derivative (fp64 reference)."""
    torch.manual_seed(5)
    z = torch.randn(3, 7, dtype=torch.float64)
    t = torch.tensor([0, 3, 6])
    g_lp, g_ent = torch.randn(3, dtype=torch.float64), torch.randn(3, dtype=torch.float64)
    zz = z.clone().requires_grad_(True)
    logp_all = torch.log_softmax(zz / 0.8, -1)
    ref_lp, ref_ent = logp_all.gather(-1, t[:, None])[:, 0], -(logp_all.exp() * logp_all).sum(-1)
    (auto,) = torch.autograd.grad((ref_lp * g_lp).sum() + (ref_ent * g_ent).sum(), zz)
    lp, lse, ent = chunk_stats(z, t, 0.8, True)
    torch.testing.assert_close(lp.double(), ref_lp.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ent.double(), ref_ent.detach(), rtol=1e-5, atol=1e-6)
    mine = z.clone()
    logits_grad_(mine, t, lse.double(), ent.double(), g_lp, g_ent, 0.8)
    torch.testing.assert_close(mine, auto, rtol=1e-5, atol=1e-6)


def test_only_plain_linear_heads_are_fused():
    assert fusable_head(nn.Linear(4, 5, bias=False))
    assert not fusable_head(nn.Linear(4, 5))
    assert not fusable_head(nn.Sequential(nn.Linear(4, 5, bias=False)))
