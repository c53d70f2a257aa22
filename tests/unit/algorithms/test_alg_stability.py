"""Numerical edges: entropy of confident, large logits is never negative; PPO refuses a dual clip <= 1."""

from __future__ import annotations

import pytest
import torch

from ascent.algorithms import entropy_from_logits, ppo_loss
from ascent.trainer.head import chunk_stats


def confident_logits(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(64, 1000, generator=g) * 3 + 200.0  # large offsets: lse and E[z] are both ~200
    z[:, 0] += torch.rand(64, generator=g) * 40  # one dominant token per row, some rows nearly certain
    return z


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_entropy_of_confident_large_logits_is_nonnegative_and_exact(seed):
    z = confident_logits(seed)
    exact = -(z.double().log_softmax(-1).exp() * z.double().log_softmax(-1)).sum(-1)
    for got in (entropy_from_logits(z), chunk_stats(z, torch.zeros(64, dtype=torch.long), 1.0, True)[2]):
        assert (got >= 0).all()
        assert torch.allclose(got.double(), exact, atol=1e-5, rtol=1e-4)


def test_dual_clip_must_exceed_one():
    a, lp, mask, ids = (
        torch.tensor([-1.0, 1.0]),
        torch.zeros(2),
        torch.ones(2),
        torch.zeros(2, dtype=torch.long),
    )
    with pytest.raises(ValueError, match="dual_clip_c=1.0 must be > 1"):
        ppo_loss(lp, lp, a, mask, ids, dual_clip_c=1.0)
    assert torch.isfinite(ppo_loss(lp, lp, a, mask, ids, dual_clip_c=3.0)[0]).all()
