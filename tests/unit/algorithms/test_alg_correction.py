"""Rollout correction weights (TIS / MIS at token, sequence and geometric level)."""

import math

import pytest
import torch

from ascent.algorithms import rollout_correction_weights

# log w = old - sampler = [0, log 3, log 0.5, (masked)]; tokens 0, 1 are sequence 0, token 2 sequence 1.
OLD = torch.tensor([0.0, math.log(3.0), math.log(0.5), 7.0])
SAMPLER = torch.zeros(4)
MASK = torch.tensor([1.0, 1.0, 1.0, 0.0])
SEQ = torch.tensor([0, 0, 1, 1])


def weights(**kw):
    return rollout_correction_weights(OLD, SAMPLER, MASK, SEQ, **kw)


def test_tis_token():
    w, m = weights(mode="tis", level="token", threshold=2.0)
    torch.testing.assert_close(w, torch.tensor([1.0, 2.0, 0.5, 0.0]))
    assert m["rollout_is_clipped_frac"].item() == pytest.approx(1 / 3)
    assert m["rollout_is_weight_mean"].item() == pytest.approx((1 + 3 + 0.5) / 3)


def test_mis_token_with_lower_bound():
    w, m = weights(mode="mis", level="token", threshold=2.0)
    torch.testing.assert_close(w, torch.tensor([1.0, 0.0, 0.5, 0.0]))
    assert m["rollout_is_masked_frac"].item() == pytest.approx(1 / 3)
    w, _ = weights(mode="mis", level="token", threshold=2.0, threshold_low=0.6)
    torch.testing.assert_close(w, torch.tensor([1.0, 0.0, 0.0, 0.0]))


def test_sequence_and_geometric_levels():
    w, _ = weights(mode="tis", level="sequence", threshold=2.0)  # seq 0: product 3 -> 2
    torch.testing.assert_close(w, torch.tensor([2.0, 2.0, 0.5, 0.0]))
    w, _ = weights(mode="mis", level="sequence", threshold=2.0)
    torch.testing.assert_close(w, torch.tensor([0.0, 0.0, 0.5, 0.0]))
    w, _ = weights(mode="tis", level="geometric", threshold=2.0)  # seq 0: sqrt(3)
    r3 = math.sqrt(3.0)
    torch.testing.assert_close(w, torch.tensor([r3, r3, 0.5, 0.0]))


def test_extreme_and_detached():
    old = torch.tensor([50.0, -50.0, 50.0], requires_grad=True)
    for level in ["token", "sequence", "geometric"]:
        for mode in ["tis", "mis"]:
            w, m = rollout_correction_weights(
                old,
                torch.zeros(3),
                torch.ones(3),
                torch.tensor([0, 0, 1]),
                mode=mode,
                level=level,
                threshold=2.0,
            )
            assert torch.isfinite(w).all() and not w.requires_grad
            assert all(torch.isfinite(v) for v in m.values())


def test_bad_mode_and_level():
    with pytest.raises(ValueError, match="tis or mis"):
        weights(mode="nope")
    with pytest.raises(ValueError, match="token, sequence or geometric"):
        weights(level="nope")


def test_trainer_usage_reweights_per_token_loss():
    from ascent.algorithms import LOSS_AGGREGATIONS

    w, _ = weights(mode="tis", threshold=2.0)
    per_token = torch.tensor([1.0, 1.0, 1.0, 1.0])
    loss = LOSS_AGGREGATIONS["token-mean"](per_token * w, MASK, SEQ, total_tokens=3, total_seqs=2, max_len=4)
    assert loss.item() == pytest.approx((1.0 + 2.0 + 0.5) / 3)


@pytest.mark.parametrize("level", ["token", "sequence", "geometric"])
@pytest.mark.parametrize("mode", ["tis", "mis"])
def test_an_observation_token_with_a_huge_gap_changes_nothing(mode, level):
    """A multi-turn episode's tool token (mask 0) has sampler logprob 0.0 and any trainer logprob: whatever
    the gap, the weights and metrics of the sampled tokens are those of the episode without it (a sequence's
    log-weight sums, or averages, its sampled tokens only)."""
    old = torch.tensor([-1.0, -0.5, -2.0, -1.2, -0.7])
    sampler = torch.tensor([-1.1, -0.4, -2.0, -1.0, -0.9])
    mask = torch.tensor([1.0, 1.0, 0.0, 1.0, 1.0])
    seq = torch.tensor([0, 0, 0, 1, 1])
    base_w, base_m = rollout_correction_weights(old, sampler, mask, seq, mode=mode, level=level)
    for gap in (-30.0, 30.0, float("nan")):
        w, m = rollout_correction_weights(
            old, sampler.clone().index_fill_(0, torch.tensor([2]), gap), mask, seq, mode=mode, level=level
        )
        assert torch.equal(w, base_w)
        assert all(torch.equal(m[k], base_m[k]) for k in base_m)
