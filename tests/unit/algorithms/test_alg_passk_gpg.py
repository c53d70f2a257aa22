"""The pass@k estimators (grpo_passk, passk) and GPG on hand-computed groups."""

import math

import pytest
import torch

from ascent.algorithms import AdvantageInputs, gpg, grpo, grpo_passk, passk


def inputs(rewards, group_ids):
    rewards = torch.tensor(rewards, dtype=torch.float32)
    return AdvantageInputs(
        rewards=rewards, mask=torch.ones(len(rewards), 2), group_ids=torch.tensor(group_ids)
    )


def first_token(out):
    return out.advantages[:, 0]


def test_grpo_passk_only_the_best_learns_by_its_margin():
    # group 0: best 1.0, second 0.5 -> gain 0.5 over the unbiased std of [0.2, 1, 0.5, 0]; group 1: one member.
    inp = inputs([0.2, 1.0, 0.5, 0.0, 3.0], [0, 0, 0, 0, 1])
    std = torch.tensor([0.2, 1.0, 0.5, 0.0]).std().item()
    out = grpo_passk(inp, adv_eps=0.0)
    torch.testing.assert_close(first_token(out), torch.tensor([0.0, 0.5 / std, 0.0, 0.0, 0.0]))
    out = grpo_passk(inp, scale_by_std=False)
    torch.testing.assert_close(first_token(out), torch.tensor([0.0, 0.5, 0.0, 0.0, 0.0]))
    assert torch.equal(out.advantages[:, 1], out.advantages[:, 0])


def test_passk_analytical_advantage():
    # n = 4, one correct, k = 2: R = 1 - C(3,2)/C(4,2) = 0.5, sigma = 0.5; correct: 0.5/0.5 = 1;
    # wrong: (1 - 0.5 - C(2,1)/C(3,1)) / 0.5 = -1/3.
    out = passk(inputs([1.0, 0.0, 0.0, 0.0], [0, 0, 0, 0]), pass_k=2, adv_eps=0.0)
    torch.testing.assert_close(first_token(out), torch.tensor([1.0, -1 / 3, -1 / 3, -1 / 3]))


def test_passk_with_k_1_is_grpo_with_the_biased_std():
    rewards, groups = [1.0, 0.0, 0.0, 1.0, 1.0, 0.0], [0, 0, 0, 0, 0, 0]
    out = passk(inputs(rewards, groups), pass_k=1, adv_eps=0.0)
    unbiased = grpo(inputs(rewards, groups), adv_eps=0.0)
    n = len(rewards)
    torch.testing.assert_close(first_token(out), first_token(unbiased) * math.sqrt(n / (n - 1)))


def test_passk_zero_when_the_group_always_or_never_passes_and_k_capped_at_the_group():
    # all wrong; all right; 3 of 4 right with k = 2 (every pair holds a correct one: R = 1); k = 9 > n = 2.
    inp = inputs([0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0], [0, 0, 1, 1, 2, 2, 2, 2, 3, 3])
    out = first_token(passk(inp, pass_k=2))
    assert torch.equal(out[:8], torch.zeros(8))
    capped = first_token(passk(inp, pass_k=9))  # group 3 with k = 2 = n: R = 1, so 0 too
    assert torch.equal(capped[8:], torch.zeros(2))
    # k = 2 of n = 2 with one right: R = 1 - C(1,2)/C(2,2) = 1 -> 0; with k = 1 the group learns.
    assert first_token(passk(inp, pass_k=1))[8] > 0


def test_gpg_scales_by_the_share_of_valid_trajectories():
    # group 0 has a spread, group 1 none: M = 2 of B = 4, alpha = 2.
    inp = inputs([1.0, 0.0, 1.0, 1.0], [0, 0, 1, 1])
    torch.testing.assert_close(first_token(gpg(inp)), torch.tensor([1.0, -1.0, 0.0, 0.0]))
    torch.testing.assert_close(first_token(gpg(inp, gpg_alpha=False)), torch.tensor([0.5, -0.5, 0.0, 0.0]))
    none_valid = gpg(inputs([1.0, 1.0, 2.0], [0, 0, 1]))
    assert torch.equal(none_valid.advantages, torch.zeros(3, 2))


@pytest.mark.parametrize("fn", [gpg, grpo_passk, passk])
def test_group_of_one_gets_zero(fn):
    assert torch.equal(fn(inputs([1.0], [7])).advantages, torch.zeros(1, 2))
