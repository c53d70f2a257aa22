"""DAPO pieces, trajectory filters and the clipped value loss."""

import pytest
import torch

from ascent.algorithms import (
    filter_groups_with_variance,
    length_filter,
    overlong_penalty,
    truncation_mask,
    value_clipfrac,
    value_loss,
    zero_advantage_filter,
)


def test_filter_groups_with_variance():
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 2.0, 2.0])
    groups = torch.tensor([0, 0, 1, 1, 2, 3])
    keep = filter_groups_with_variance(rewards, groups)
    assert keep.tolist() == [False, False, True, True, False, False]
    assert filter_groups_with_variance(torch.zeros(0), torch.zeros(0, dtype=torch.long)).numel() == 0


def test_overlong_penalty_linear_in_buffer():
    lengths = torch.tensor([50, 80, 90, 100, 120])
    out = overlong_penalty(lengths, max_len=100, buffer=20, penalty_factor=1.0)
    torch.testing.assert_close(out, torch.tensor([0.0, 0.0, -0.5, -1.0, -1.0]))
    out = overlong_penalty(lengths, max_len=100, buffer=20, penalty_factor=0.5)
    torch.testing.assert_close(out, torch.tensor([0.0, 0.0, -0.25, -0.5, -0.5]))
    out = overlong_penalty(lengths, max_len=100, buffer=0)
    torch.testing.assert_close(out, torch.tensor([0.0, 0.0, 0.0, 0.0, -1.0]))


def test_truncation_mask():
    out = truncation_mask(torch.tensor([True, False, True]))
    torch.testing.assert_close(out, torch.tensor([0.0, 1.0, 0.0]))


def test_zero_advantage_filter():
    adv = torch.tensor([[0.0, 0.0], [0.0, 0.3], [0.5, 0.0], [1.0, 1.0]])
    mask = torch.tensor([[1, 1], [1, 1], [0, 1], [0, 0]])
    assert zero_advantage_filter(adv, mask).tolist() == [False, True, False, False]


def test_length_filter():
    lengths = torch.tensor([0, 3, 10, 11])
    assert length_filter(lengths, min_len=1, max_len=10).tolist() == [False, True, True, False]
    assert length_filter(lengths).tolist() == [True, True, True, True]


def test_value_loss_clipped_hand_computed():
    v = torch.tensor([1.5, 1.1, 0.0], requires_grad=True)
    old = torch.tensor([1.0, 1.0, 0.0])
    ret = torch.tensor([2.0, 1.0, 1.0])
    loss = value_loss(v, old, ret, clip_range=0.2)
    # token 0: unclipped 0.25, clipped (1.2 - 2)^2 = 0.64 -> 0.32; token 1: 0.01 both -> 0.005; token 2: 0.5
    torch.testing.assert_close(loss, torch.tensor([0.32, 0.005, 0.5]))
    loss.sum().backward()
    torch.testing.assert_close(v.grad, torch.tensor([0.0, 0.1, -1.0]))
    assert value_clipfrac(v, old, ret, 0.2).tolist() == [1.0, 0.0, 0.0]
    assert value_loss(v, old, ret, clip_range=None)[0].item() == pytest.approx(0.125)
