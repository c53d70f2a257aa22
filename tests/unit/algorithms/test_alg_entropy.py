"""Chunked entropy: values, dtypes, masked vocabulary entries and the custom backward."""

import math

import pytest
import torch

from ascent.algorithms import entropy_from_logits


def reference(logits):
    return torch.distributions.Categorical(logits=logits.double()).entropy()


@pytest.mark.parametrize("chunk", [1, 3, 256])
def test_matches_categorical(chunk):
    logits = torch.randn(7, 11, generator=torch.Generator().manual_seed(0)) * 3
    out = entropy_from_logits(logits, chunk_size=chunk)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), reference(logits), atol=1e-5, rtol=1e-5)


def test_uniform_and_bf16():
    assert entropy_from_logits(torch.zeros(2, 50)).tolist() == pytest.approx([math.log(50)] * 2)
    logits = torch.randn(5, 40).bfloat16()
    out = entropy_from_logits(logits, chunk_size=2)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), reference(logits.float()), atol=1e-5, rtol=1e-5)


def test_minus_inf_entries_are_finite():
    logits = torch.tensor([[0.0, -math.inf, 0.0], [5.0, -math.inf, -math.inf]], requires_grad=True)
    h = entropy_from_logits(logits)
    torch.testing.assert_close(h, torch.tensor([math.log(2), 0.0]))
    h.sum().backward()
    assert torch.isfinite(logits.grad).all()


def test_gradient_matches_autograd():
    logits = torch.randn(6, 9, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda z: entropy_from_logits(z, chunk_size=4), (logits,))
    w = torch.randn(6, dtype=torch.float64)
    (g,) = torch.autograd.grad((entropy_from_logits(logits, 2) * w).sum(), logits)
    (g_ref,) = torch.autograd.grad((reference(logits) * w).sum(), logits)
    torch.testing.assert_close(g, g_ref)


def test_bad_shape():
    with pytest.raises(ValueError, match=r"\[n, V\]"):
        entropy_from_logits(torch.zeros(2, 3, 4))
