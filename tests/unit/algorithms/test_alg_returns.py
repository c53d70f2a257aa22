"""Token-level estimators: GAE (multi-turn aware), REINFORCE++ (+baseline), ReMax."""

from dataclasses import replace

import pytest
import torch

from ascent.algorithms import AdvantageInputs, gae, reinforce_pp, reinforce_pp_baseline, remax
from ascent.algorithms.returns import discounted_returns, gae_advantages
from ascent.algorithms.utils import masked_whiten


def test_gae_skips_masked_tool_token():
    # Policy tokens 0, 2, 3; token 1 is tool output (mask 0) with a garbage value that must be skipped.
    # gamma = 0.9, lam = 0.8, outcome reward 1 on token 3.
    # t=3: delta = 1 - 0.4 = 0.6, A = 0.6
    # t=2: delta = 0.9 * 0.4 - 0.2 = 0.16, A = 0.16 + 0.72 * 0.6 = 0.592
    # t=0: next policy token is 2: delta = 0.9 * 0.2 - 0.5 = -0.32, A = -0.32 + 0.72 * 0.592 = 0.10624
    inp = AdvantageInputs(
        rewards=torch.tensor([1.0]),
        mask=torch.tensor([[1, 0, 1, 1]]),
        group_ids=torch.tensor([0]),
        values=torch.tensor([[0.5, 9.0, 0.2, 0.4]]),
    )
    out = gae(inp, gamma=0.9, lam=0.8, gae_whiten=False)
    torch.testing.assert_close(out.advantages, torch.tensor([[0.10624, 0.0, 0.592, 0.6]]))
    torch.testing.assert_close(out.returns, torch.tensor([[0.60624, 0.0, 0.792, 1.0]]))


def test_gae_lambda_one_gamma_one_is_return_minus_value():
    values = torch.tensor([[0.1, 0.2, 0.3], [0.5, 0.0, 0.0]])
    rewards = torch.tensor([[0.0, 0.0, 1.0], [2.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    adv = gae_advantages(values, rewards, mask, gamma=1.0, lam=1.0)
    torch.testing.assert_close(adv, torch.tensor([[0.9, 0.8, 0.7], [1.5, 0.0, 0.0]]))


def test_gae_adds_token_rewards_and_whitens():
    inp = AdvantageInputs(
        rewards=torch.tensor([1.0, 0.0]),
        mask=torch.ones(2, 3),
        group_ids=torch.tensor([0, 1]),
        values=torch.zeros(2, 3),
        token_rewards=torch.full((2, 3), -0.1),
    )
    raw = gae(inp, gamma=1.0, lam=1.0, gae_whiten=False)
    torch.testing.assert_close(raw.advantages[0], torch.tensor([0.7, 0.8, 0.9]))
    white = gae(inp, gamma=1.0, lam=1.0)
    assert abs(white.advantages.mean().item()) < 1e-6
    torch.testing.assert_close(white.returns, raw.returns)


def test_gae_needs_values():
    with pytest.raises(ValueError, match="values"):
        gae(AdvantageInputs(torch.ones(1), torch.ones(1, 2), torch.zeros(1)))


def test_discounted_returns_skip_masked_tokens():
    r = torch.tensor([[-0.1, 5.0, 1.8]])
    g = discounted_returns(r, torch.tensor([[1.0, 0.0, 1.0]]), gamma=0.5)
    torch.testing.assert_close(g, torch.tensor([[0.8, 0.0, 1.8]]))


def test_reinforce_pp_hand_computed():
    # r_t = token_rewards + outcome (2) at the last policy token; the masked token's reward 5 is ignored.
    # G = [0.8, -, 1.8]; whitened over the 2 policy tokens: mean 1.3, std sqrt(0.5).
    inp = AdvantageInputs(
        rewards=torch.tensor([2.0]),
        mask=torch.tensor([[1, 0, 1]]),
        group_ids=torch.tensor([0]),
        token_rewards=torch.tensor([[-0.1, 5.0, -0.2]]),
    )
    out = reinforce_pp(inp, gamma=0.5, adv_eps=0.0)
    torch.testing.assert_close(out.returns, torch.tensor([[0.8, 0.0, 1.8]]))
    s = 0.5**0.5
    torch.testing.assert_close(out.advantages, torch.tensor([[-0.5 / s, 0.0, 0.5 / s]]))


def test_reinforce_pp_baseline_subtracts_group_mean_then_whitens():
    inp = AdvantageInputs(
        rewards=torch.tensor([1.0, 0.0, 10.0, 10.0]),
        mask=torch.ones(4, 2),
        group_ids=torch.tensor([0, 0, 1, 1]),
    )
    out = reinforce_pp_baseline(inp, adv_eps=0.0)
    torch.testing.assert_close(out.returns[:, 0], torch.tensor([0.5, -0.5, 0.0, 0.0]))
    std = torch.tensor([0.5, 0.5, -0.5, -0.5, 0.0, 0.0, 0.0, 0.0]).std()
    torch.testing.assert_close(out.advantages[:, 1], torch.tensor([0.5, -0.5, 0.0, 0.0]) / std)


def test_shift_mean_false_scales_without_centring():
    # G = [1, 3, 5] (one policy token each, plus a padded slot): mean 3, std 2 -> [-1, 0, 1] centred, and
    # [2, 3, 4] with the mean added back. Padding stays 0 either way.
    inp = AdvantageInputs(
        rewards=torch.tensor([1.0, 3.0, 5.0]),
        mask=torch.tensor([[1, 0], [1, 0], [1, 0]]),
        group_ids=torch.tensor([0, 1, 2]),
    )
    kept = torch.tensor([[2.0, 0.0], [3.0, 0.0], [4.0, 0.0]])
    torch.testing.assert_close(reinforce_pp(inp, adv_eps=0.0, shift_mean=False).advantages, kept)
    torch.testing.assert_close(reinforce_pp(inp, adv_eps=0.0).advantages, kept - 3.0 * inp.mask)
    values = torch.zeros(3, 2)
    out = gae(replace(inp, values=values), adv_eps=0.0, shift_mean=False)
    torch.testing.assert_close(out.advantages, kept)
    x, m = torch.tensor([1.0, 3.0, 5.0, 100.0]), torch.tensor([1.0, 1.0, 1.0, 0.0])
    torch.testing.assert_close(masked_whiten(x, m, 0.0, shift_mean=False), torch.tensor([2.0, 3.0, 4.0, 0.0]))


def test_remax_subtracts_greedy_baseline():
    inp = AdvantageInputs(
        rewards=torch.tensor([1.0, 0.0]),
        mask=torch.tensor([[1, 1], [1, 0]]),
        group_ids=torch.tensor([0, 0]),
        baseline_rewards=torch.tensor([0.5, 0.5]),
    )
    torch.testing.assert_close(remax(inp).advantages, torch.tensor([[0.5, 0.5], [-0.5, 0.0]]))
    with pytest.raises(ValueError, match="baseline_rewards"):
        remax(AdvantageInputs(torch.ones(1), torch.ones(1, 2), torch.zeros(1)))


def test_turn_rewards_move_from_the_outcome_to_their_turns_and_keep_the_sum():
    from ascent.algorithms.advantage_types import token_level_rewards, turn_end_rewards

    mask = [1, 1, 0, 1, 1, 0, 1]
    placed = turn_end_rewards([0.5, -0.25, 2.0], mask)
    assert placed == [0, 0.5, 0, 0, -0.25, 0, 0]  # the last turn's reward stays with the outcome
    assert turn_end_rewards([1.0, 1.0, 1.0, 1.0], mask) is None  # more rewards than sampled turns
    assert turn_end_rewards([0.0, 0.0, 1.0], mask) is None  # only the last turn rewarded: outcome as before
    m = torch.tensor([mask], dtype=torch.float32)
    kl = torch.full((1, 7), -0.1)
    out = token_level_rewards(torch.tensor([2.25]), m, kl, torch.tensor([placed]))
    assert out[0].tolist() == pytest.approx([-0.1, 0.4, 0, -0.1, -0.35, 0, 1.9])
    assert out.sum() == pytest.approx(2.25 - 0.5)


def test_gae_discounts_per_env_step_when_each_action_is_one_token():
    """A VLA's episode: three one-token action turns with observation tokens between, reward 1 per step
    (each on its turn's token). GAE's gamma then discounts per environment step: with zero values and
    lam = 1 the advantages are the discounted returns 1 + 0.9 + 0.81, 1 + 0.9, 1."""
    from ascent.algorithms.advantage_types import turn_end_rewards

    mask = [1, 0, 0, 1, 0, 0, 1]
    turns = turn_end_rewards([1.0, 1.0, 1.0], mask)
    inp = AdvantageInputs(
        rewards=torch.tensor([3.0]),
        mask=torch.tensor([mask], dtype=torch.float32),
        group_ids=torch.tensor([0]),
        values=torch.zeros(1, 7),
        turn_rewards=torch.tensor([turns]),
    )
    out = gae(inp, gamma=0.9, lam=1.0, gae_whiten=False)
    assert out.advantages[0].tolist() == pytest.approx([2.71, 0, 0, 1.9, 0, 0, 1.0])
