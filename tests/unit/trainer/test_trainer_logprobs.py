"""Chunked logprobs/entropy equal the naive full-logits computation, in value and in gradient."""

from __future__ import annotations

import pytest
import torch
from trainer_helpers import make_samples

from ascent.algorithms import entropy_from_logits
from ascent.trainer.logprobs import token_logprobs
from ascent.trainer.packing import pack


def _naive(model, packed, temperature):
    """Full logits [N, V] of the packed row -> (logprobs [M], entropy [M])."""
    out = model(input_ids=packed.input_ids, position_ids=packed.position_ids, use_cache=False)
    logits = out.logits[0].float()[packed.logit_index] / temperature
    logp = torch.log_softmax(logits, -1).gather(-1, packed.targets[:, None])[:, 0]
    p = torch.softmax(logits, -1)
    return logp, -(p * torch.log_softmax(logits, -1)).sum(-1)


@pytest.mark.parametrize("chunk", [1, 7, 4096])
def test_chunked_values_match_full_logits(tiny_model, chunk):
    packed = pack(make_samples(6, seed=5))
    with torch.no_grad():
        lp, ent = token_logprobs(tiny_model, packed, temperature=0.7, chunk_tokens=chunk, with_entropy=True)
        ref_lp, ref_ent = _naive(tiny_model, packed, 0.7)
    torch.testing.assert_close(lp, ref_lp, atol=1e-5, rtol=0)
    torch.testing.assert_close(ent, ref_ent, atol=1e-5, rtol=0)
    assert lp.dtype == torch.float32


def test_chunked_gradients_match_full_logits(tiny_model):
    packed = pack(make_samples(6, seed=6))
    w = torch.randn(packed.targets.shape[0], generator=torch.Generator().manual_seed(0))

    def grads(fn):
        tiny_model.zero_grad(set_to_none=True)
        lp, ent = fn()
        ((lp * w).sum() + 0.1 * ent.sum()).backward()
        return {n: p.grad.clone() for n, p in tiny_model.named_parameters()}

    chunked = grads(
        lambda: token_logprobs(tiny_model, packed, temperature=0.9, chunk_tokens=5, with_entropy=True)
    )
    naive = grads(lambda: _naive(tiny_model, packed, 0.9))
    for name, g in naive.items():
        torch.testing.assert_close(chunked[name], g, atol=1e-5, rtol=1e-4, msg=name)


def test_without_entropy_returns_none_and_empty_batch(tiny_model):
    packed = pack(make_samples(2))
    _, ent = token_logprobs(tiny_model, packed)
    assert ent is None
    packed.logit_index, packed.targets = packed.logit_index[:0], packed.targets[:0]
    lp, ent = token_logprobs(tiny_model, packed, with_entropy=True)
    assert lp.shape == (0,) and ent.shape == (0,)


def test_entropy_helper_is_the_algorithms_one():
    logits = torch.randn(3, 11)
    p = torch.softmax(logits, -1)
    torch.testing.assert_close(entropy_from_logits(logits), -(p * p.log()).sum(-1))


def test_temperature_must_be_positive(tiny_model):
    with pytest.raises(ValueError, match="temperature=0"):
        token_logprobs(tiny_model, pack(make_samples(1)), temperature=0)
