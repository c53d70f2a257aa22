"""The optimal-token baseline (`optimal_token_baseline`) and Σπ² (`sum_pi_squared_from_logits`) on values
computed by hand."""

from __future__ import annotations

import math

import pytest
import torch

from ascent.algorithms import (
    ADVANTAGE_ESTIMATORS,
    AdvantageInputs,
    optimal_token_baseline,
    sum_pi_squared_from_logits,
)


def inputs(mask: list[list[float]], rewards: list[float], pi: list[list[float]], sq: list[list[float]]):
    return AdvantageInputs(
        rewards=torch.tensor(rewards),
        mask=torch.tensor(mask),
        group_ids=torch.zeros(len(rewards), dtype=torch.long),
        old_logprobs=torch.tensor(pi).log(),
        sum_pi_squared=torch.tensor(sq),
    )


def test_sum_pi_squared_by_hand():
    logits = torch.tensor([[0.0, 0.0], [math.log(3.0), 0.0], [5.0, 5.0]])
    # softmax: (1/2, 1/2) -> 1/2; (3/4, 1/4) -> 9/16 + 1/16; equal logits of any size -> 1/2
    torch.testing.assert_close(sum_pi_squared_from_logits(logits), torch.tensor([0.5, 0.625, 0.5]))
    big = torch.tensor([[1000.0, 0.0, 0.0]])  # no overflow: a one-hot distribution
    torch.testing.assert_close(sum_pi_squared_from_logits(big), torch.tensor([1.0]))


def test_the_baseline_weights_each_sample_by_its_realised_energy():
    # sample 1: pi = 1/2, sum pi^2 = 1/2 -> w = 1 - 1 + 1/2 = 1/2, W = (1/2, 1)
    # sample 2: pi = 1/4, sum pi^2 = 1/4 -> w = 1 - 1/2 + 1/4 = 3/4, W = (3/4, 3/2)
    # B_0 = (1 * 1/2 + 0) / (1/2 + 3/4) = 0.4, B_1 = (1 * 1) / (1 + 3/2) = 0.4 (GRPO's mean would be 0.5)
    inp = inputs([[1, 1], [1, 1]], [1.0, 0.0], [[0.5, 0.5], [0.25, 0.25]], [[0.5, 0.5], [0.25, 0.25]])
    out = optimal_token_baseline(inp)
    torch.testing.assert_close(out.advantages, torch.tensor([[0.6, 0.6], [-0.4, -0.4]]))
    torch.testing.assert_close(out.returns, torch.tensor([[1.0, 1.0], [0.0, 0.0]]))


def test_a_certain_sample_takes_no_weight_and_padding_none():
    # sample 2 is certain (pi = 1, sum pi^2 = 1: w = 0), so B = sample 1's return; sample 2 is one token long
    inp = inputs([[1, 1], [1, 0]], [1.0, 0.0], [[0.5, 0.5], [1.0, 0.7]], [[0.5, 0.5], [1.0, 99.0]])
    out = optimal_token_baseline(inp)
    torch.testing.assert_close(out.advantages, torch.tensor([[0.0, 0.0], [-1.0, 0.0]]), atol=1e-6, rtol=0)


def test_zero_tail_gives_the_longest_sample_no_baseline_past_the_others():
    # both w = 1/2; column 1 holds only sample 1: B_1 = its own return (A = 0), or 0 with otb_zero_tail
    inp = inputs([[1, 1], [1, 0]], [1.0, 0.0], [[0.5, 0.5], [0.5, 0.5]], [[0.5, 0.5], [0.5, 0.5]])
    plain = optimal_token_baseline(inp).advantages
    tail = optimal_token_baseline(inp, otb_zero_tail=True).advantages
    torch.testing.assert_close(plain, torch.tensor([[0.5, 0.0], [-0.5, 0.0]]), atol=1e-6, rtol=0)
    torch.testing.assert_close(tail, torch.tensor([[0.5, 1.0], [-0.5, 0.0]]), atol=1e-6, rtol=0)


def test_groups_are_apart_a_group_of_one_keeps_its_return_and_masked_garbage_stays_out():
    inp = AdvantageInputs(
        rewards=torch.tensor([1.0, 0.0, 2.0]),
        mask=torch.tensor([[1.0, 1.0], [1.0, 1.0], [1.0, 0.0]]),
        group_ids=torch.tensor([0, 0, 7]),
        old_logprobs=torch.tensor([[0.5, 0.5], [0.25, 0.25], [0.5, float("nan")]]).log(),
        sum_pi_squared=torch.tensor([[0.5, 0.5], [0.25, 0.25], [0.5, float("inf")]]),
    )
    out = ADVANTAGE_ESTIMATORS["optimal_token_baseline"](inp)
    torch.testing.assert_close(out.advantages, torch.tensor([[0.6, 0.6], [-0.4, -0.4], [2.0, 0.0]]))


def test_token_rewards_join_the_reward_to_go():
    inp = inputs([[1, 1], [1, 1]], [1.0, 0.0], [[0.5, 0.5], [0.5, 0.5]], [[0.5, 0.5], [0.5, 0.5]])
    inp.token_rewards = torch.tensor([[-0.1, -0.1], [0.0, -0.2]])
    out = optimal_token_baseline(inp)
    # G: sample 1 (0.8, 0.9), sample 2 (-0.2, -0.2); equal energies: B = the mean per column
    torch.testing.assert_close(out.returns, torch.tensor([[0.8, 0.9], [-0.2, -0.2]]))
    torch.testing.assert_close(out.advantages, torch.tensor([[0.5, 0.55], [-0.5, -0.55]]))


def test_without_the_trainer_statistics_it_says_what_is_missing():
    inp = AdvantageInputs(rewards=torch.ones(2), mask=torch.ones(2, 2), group_ids=torch.zeros(2))
    with pytest.raises(ValueError, match="old_logprobs and sum_pi_squared"):
        optimal_token_baseline(inp)
