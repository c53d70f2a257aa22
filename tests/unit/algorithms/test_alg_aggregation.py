"""Loss aggregation: hand values, the Dr. GRPO formula, and split invariance (micro-batches and workers)."""

import pytest
import torch

from ascent.algorithms import LOSS_AGGREGATIONS

LENGTHS = [3, 1, 7, 4, 2, 8, 5, 6]  # 8 sequences of different lengths
MAX_LEN = 8


def agg(name, loss, mask, seq, **totals):
    return LOSS_AGGREGATIONS[name](loss, mask, seq, **totals)


def test_hand_computed_values():
    loss = torch.tensor([1.0, 3.0, 4.0, 100.0])
    mask = torch.tensor([1.0, 1.0, 1.0, 0.0])
    seq = torch.tensor([0, 0, 1, 1])
    totals = dict(total_tokens=3, total_seqs=2, max_len=4)
    assert agg("token-mean", loss, mask, seq, **totals).item() == pytest.approx(8 / 3)
    assert agg("token-sum", loss, mask, seq, **totals).item() == pytest.approx(8.0)
    assert agg("seq-mean-token-sum", loss, mask, seq, **totals).item() == pytest.approx(4.0)
    assert agg("seq-mean-token-mean", loss, mask, seq, **totals).item() == pytest.approx(3.0)  # (2 + 4) / 2
    assert agg("seq-mean-token-sum-norm", loss, mask, seq, **totals).item() == pytest.approx(1.0)


@pytest.mark.parametrize("t", [5, 8])
def test_seq_mean_token_sum_norm_formula_for_every_length(t):
    g = torch.Generator().manual_seed(t)
    all_loss, all_mask, all_seq = [], [], []
    for length in range(1, t + 1):
        loss = torch.rand(t, generator=g)
        mask = (torch.arange(t) < length).float()
        one = agg(
            "seq-mean-token-sum-norm",
            loss,
            mask,
            torch.zeros(t, dtype=torch.long),
            total_tokens=length,
            total_seqs=1,
            max_len=t,
        )
        assert one.item() == pytest.approx(loss[:length].sum().item() / t)
        all_loss.append(loss), all_mask.append(mask), all_seq.append(torch.full((t,), length - 1))
    loss, mask, seq = torch.cat(all_loss), torch.cat(all_mask), torch.cat(all_seq)
    both = agg(
        "seq-mean-token-sum-norm", loss, mask, seq, total_tokens=int(mask.sum()), total_seqs=t, max_len=t
    )
    assert both.item() == pytest.approx((loss * mask).sum().item() / (t * t))


def make_sequences():
    """Per sequence: token features x [L + 1] (one masked padding token each) and mask [L + 1]."""
    g = torch.Generator().manual_seed(0)
    seqs = []
    for length in LENGTHS:
        x = torch.randn(length + 1, generator=g)
        mask = torch.ones(length + 1)
        mask[-1] = 0.0
        if length > 3:
            mask[1] = 0.0  # a tool token inside the response
        seqs.append((x, mask))
    return seqs


def shares_grad(name, seqs, split, theta0):
    """Sum the micro-batch shares of a split (list of lists of sequence indices) and return (value, grad)."""
    theta = theta0.clone().requires_grad_(True)
    total_tokens = int(sum(m.sum() for _, m in seqs))
    totals = dict(total_tokens=total_tokens, total_seqs=len(seqs), max_len=MAX_LEN)
    value = torch.zeros(())
    for micro in split:
        x = torch.cat([seqs[i][0] for i in micro])
        mask = torch.cat([seqs[i][1] for i in micro])
        seq = torch.cat([torch.full((len(seqs[i][0]),), j) for j, i in enumerate(micro)])
        per_token = (theta[0] * x + theta[1]) ** 2 + theta[2] * x  # a toy per-token loss
        value = value + agg(name, per_token, mask, seq, **totals)
    value.backward()
    return value.detach(), theta.grad


SPLITS = {
    "1x8": [list(range(8))],
    "8x1": [[i] for i in range(8)],
    "3+5": [[0, 1, 2], [3, 4, 5, 6, 7]],
    "shuffled 2+3+3": [[6, 1], [0, 7, 3], [5, 2, 4]],
}


@pytest.mark.parametrize("name", sorted(LOSS_AGGREGATIONS))
@pytest.mark.parametrize("split", sorted(SPLITS))
def test_gradient_is_split_invariant(name, split):
    seqs = make_sequences()
    theta0 = torch.tensor([0.7, -0.3, 1.1], dtype=torch.float64).float()
    full_value, full_grad = shares_grad(name, seqs, SPLITS["1x8"], theta0)
    value, grad = shares_grad(name, seqs, SPLITS[split], theta0)
    torch.testing.assert_close(value, full_value, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(grad, full_grad, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("name", sorted(LOSS_AGGREGATIONS))
def test_two_workers_shares_sum_to_full(name):
    seqs = make_sequences()
    theta0 = torch.tensor([0.2, 0.5, -0.4])
    full_value, full_grad = shares_grad(name, seqs, SPLITS["1x8"], theta0)
    v0, g0 = shares_grad(name, seqs, [[0, 1], [2, 3]], theta0)  # worker 0: two micro-batches
    v1, g1 = shares_grad(name, seqs, [[4, 5, 6, 7]], theta0)  # worker 1: one micro-batch
    torch.testing.assert_close(v0 + v1, full_value, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(g0 + g1, full_grad, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("name", sorted(LOSS_AGGREGATIONS))
def test_empty_and_fully_masked_are_zero_not_nan(name):
    loss = torch.tensor([float("nan"), float("inf")])
    out = agg(name, loss, torch.zeros(2), torch.tensor([0, -1]), total_tokens=0, total_seqs=0, max_len=0)
    assert out.item() == 0.0
    empty = torch.zeros(0)
    out = agg(name, empty, empty, torch.zeros(0, dtype=torch.long), total_tokens=0, total_seqs=0, max_len=8)
    assert out.item() == 0.0


@pytest.mark.parametrize("name", sorted(LOSS_AGGREGATIONS))
def test_tensor_totals_accepted(name):
    loss, mask, seq = torch.ones(3), torch.ones(3), torch.tensor([0, 0, 1])
    a = agg(name, loss, mask, seq, total_tokens=3, total_seqs=2, max_len=4)
    b = agg(
        name,
        loss,
        mask,
        seq,
        total_tokens=torch.tensor(3),
        total_seqs=torch.tensor(2),
        max_len=torch.tensor(4),
    )
    torch.testing.assert_close(a, b)
