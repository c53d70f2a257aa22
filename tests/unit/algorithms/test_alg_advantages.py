"""Group advantage estimators (grpo, rloo, opo) and the registry-wide edge cases."""

import math

import pytest
import torch

from ascent.algorithms import ADVANTAGE_ESTIMATORS, AdvantageInputs, grpo, opo, options_for, rloo


def inputs(rewards, group_ids, mask=None, **kw):
    rewards = torch.tensor(rewards, dtype=torch.float32)
    mask = torch.ones(len(rewards), 3) if mask is None else torch.tensor(mask, dtype=torch.float32)
    return AdvantageInputs(rewards=rewards, mask=mask, group_ids=torch.tensor(group_ids), **kw)


def first_token(out):
    return out.advantages[:, 0]


def test_grpo_hand_computed():
    # group 0: rewards 1, 0, 1 -> mean 2/3, unbiased std sqrt(1/3); groups 1 and 2 have one member.
    out = grpo(inputs([1.0, 0.0, 1.0, 1.0, 5.0], [0, 0, 0, 1, 2]), adv_eps=0.0)
    s = math.sqrt(1 / 3)
    expected = torch.tensor([(1 / 3) / s, (-2 / 3) / s, (1 / 3) / s, 0.0, 0.0])
    torch.testing.assert_close(first_token(out), expected)
    torch.testing.assert_close(out.returns, out.advantages)


def test_grpo_dr_grpo_and_batch_std():
    inp = inputs([1.0, 0.0, 3.0, 3.0], [0, 0, 1, 1])
    torch.testing.assert_close(
        first_token(grpo(inp, scale_by_std=False)), torch.tensor([0.5, -0.5, 0.0, 0.0])
    )
    # batch std of [1, 0, 3, 3] (unbiased) = 1.5
    out = grpo(inp, std_over_batch=True, adv_eps=0.0)
    torch.testing.assert_close(first_token(out), torch.tensor([1 / 3, -1 / 3, 0.0, 0.0]))


def test_grpo_identical_rewards_give_zero():
    out = grpo(inputs([0.7] * 4, [3, 3, 3, 3]))
    assert torch.equal(out.advantages, torch.zeros(4, 3))


def test_advantages_broadcast_over_mask_only():
    mask = [[1, 1, 0], [1, 0, 1]]
    out = grpo(inputs([1.0, 0.0], [0, 0], mask=mask), scale_by_std=False)
    torch.testing.assert_close(out.advantages, torch.tensor([[0.5, 0.5, 0.0], [-0.5, 0.0, -0.5]]))


def test_rloo_leave_one_out():
    out = rloo(inputs([1.0, 0.0, 2.0, 4.0], [0, 0, 0, 1]))
    torch.testing.assert_close(first_token(out), torch.tensor([0.0, -1.5, 1.5, 0.0]))


def test_opo_length_weighted_baseline():
    # lengths 3 and 1: b = (3 * 1 + 1 * 0) / 4 = 0.75
    out = opo(inputs([1.0, 0.0], [0, 0], mask=[[1, 1, 1], [1, 0, 0]]))
    torch.testing.assert_close(out.advantages, torch.tensor([[0.25, 0.25, 0.25], [-0.75, 0.0, 0.0]]))


def full_inputs(rewards, group_ids, mask):
    b, t = len(rewards), len(mask[0])
    return inputs(
        rewards,
        group_ids,
        mask=mask,
        values=torch.zeros(b, t),
        token_rewards=torch.zeros(b, t),
        baseline_rewards=torch.tensor(rewards, dtype=torch.float32),
        teacher_logprobs=torch.zeros(b, t),
        sampler_logprobs=torch.zeros(b, t),
        old_logprobs=torch.full((b, t), -0.7),
        sum_pi_squared=torch.full((b, t), 0.5),
    )


@pytest.mark.parametrize("name", sorted(ADVANTAGE_ESTIMATORS))
def test_groups_of_one_give_zero(name):
    out = ADVANTAGE_ESTIMATORS[name](full_inputs([1.0, 0.0, 3.0], [0, 1, 2], [[1, 1], [1, 0], [1, 1]]))
    if name in {"grpo", "rloo", "opo", "reinforce_pp_baseline", "remax"}:
        assert torch.allclose(out.advantages, torch.zeros(3, 2), atol=1e-6)
    assert torch.isfinite(out.advantages).all() and torch.isfinite(out.returns).all()


@pytest.mark.parametrize("name", sorted(ADVANTAGE_ESTIMATORS))
def test_equal_rewards_give_zero(name):
    out = ADVANTAGE_ESTIMATORS[name](full_inputs([2.0] * 4, [0, 0, 1, 1], [[1, 1]] * 4))
    if name in {"grpo", "rloo", "opo", "reinforce_pp_baseline", "remax"}:
        assert torch.equal(out.advantages, torch.zeros(4, 2))


@pytest.mark.parametrize("name", sorted(ADVANTAGE_ESTIMATORS))
def test_fully_masked_rows_are_zero_and_finite(name):
    inp = full_inputs([1.0, 0.0, 5.0], [0, 0, 0], [[1, 1, 0], [0, 0, 0], [0, 0, 0]])
    inp.values[1:] = float("nan")  # garbage behind the mask must not leak
    inp.token_rewards[1:] = float("inf")
    inp.teacher_logprobs[1:] = float("nan")
    inp.old_logprobs[1:] = float("nan")
    inp.sum_pi_squared[1:] = float("inf")
    fn = ADVANTAGE_ESTIMATORS[name]
    out = fn(inp, **options_for(fn, {"gamma": 0.9, "lam": 0.95}))
    assert torch.isfinite(out.advantages).all() and torch.isfinite(out.returns).all()
    assert torch.equal(out.advantages[1:], torch.zeros(2, 3))
    assert torch.equal(out.returns[1:], torch.zeros(2, 3))


@pytest.mark.parametrize("name", sorted(ADVANTAGE_ESTIMATORS))
def test_everything_masked_and_empty_batch(name):
    out = ADVANTAGE_ESTIMATORS[name](full_inputs([1.0, 2.0], [0, 0], [[0, 0], [0, 0]]))
    assert torch.equal(out.advantages, torch.zeros(2, 2))


@pytest.mark.parametrize("name", sorted(ADVANTAGE_ESTIMATORS))
def test_estimators_refuse_options_they_do_not_name(name):
    """The builder hands each estimator only its own options (`options_for`); a stray one is a caller's
    bug."""
    with pytest.raises(TypeError, match="not_an_option"):
        ADVANTAGE_ESTIMATORS[name](full_inputs([1.0, 0.0], [0, 0], [[1, 1]] * 2), not_an_option=3)
