"""Token-level return estimators: GAE and REINFORCE++ (with and without a group baseline), plus ReMax's
helper.

All recursions are multi-turn aware: a token with mask 0 (tool or environment output spliced into the
response) is not a step. The recursion runs from one policy token to the next policy token, carrying the
running return (and, for GAE, the next value) across the masked span unchanged. Rewards sitting on masked
tokens are ignored; the outcome reward lands on the last policy token.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ascent.algorithms.advantage_types import AdvantageInputs, AdvantageOutputs, token_level_rewards
from ascent.algorithms.utils import group_stats, masked, masked_whiten


def discounted_returns(rewards: Tensor, mask: Tensor, gamma: float) -> Tensor:
    """rewards [B, T], mask [B, T] -> returns [B, T]: G_t = r_t + gamma * G_next over policy tokens only.

    G_next is the return of the next token with mask 1 (0 after the last); masked positions get 0.
    """
    out = torch.zeros_like(rewards)
    carry = torch.zeros_like(rewards[:, 0])
    on = mask > 0
    for t in range(rewards.shape[1] - 1, -1, -1):
        carry = torch.where(on[:, t], rewards[:, t] + gamma * carry, carry)
        out[:, t] = carry
    return masked(out, mask)


def gae_advantages(values: Tensor, rewards: Tensor, mask: Tensor, gamma: float, lam: float) -> Tensor:
    """values [B, T], rewards [B, T], mask [B, T] -> advantages [B, T] (Schulman et al. 2016, "GAE").

    Over policy tokens t < t' (t' the next policy token, none after the last):
    delta_t = r_t + gamma * V_{t'} - V_t  (V after the last policy token is 0),
    A_t = delta_t + gamma * lam * A_{t'}. Masked positions get 0.
    """
    out = torch.zeros_like(rewards)
    next_value = torch.zeros_like(rewards[:, 0])
    next_adv = torch.zeros_like(rewards[:, 0])
    on = mask > 0
    for t in range(rewards.shape[1] - 1, -1, -1):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        adv = delta + gamma * lam * next_adv
        next_adv = torch.where(on[:, t], adv, next_adv)
        next_value = torch.where(on[:, t], values[:, t], next_value)
        out[:, t] = next_adv
    return masked(out, mask)


def gae(
    inp: AdvantageInputs,
    *,
    gamma: float = 1.0,
    lam: float = 1.0,
    gae_whiten: bool = True,
    shift_mean: bool = True,
    adv_eps: float = 1e-6,
) -> AdvantageOutputs:
    """PPO with a critic (Schulman et al. 2016/2017; Ouyang et al. 2022). Needs inp.values [B, T].

    Per-token reward = token_rewards (e.g. the KL penalty) + the outcome reward on the last policy token
    (a multi-turn episode's earlier turn rewards on the last token of their turns: inp.turn_rewards).
    advantages = GAE(gamma, lam) over policy tokens (tool tokens skipped), returns = advantages + values
    (taken before whitening); with gae_whiten the advantages are then whitened over all policy tokens
    (shift_mean=False adds their mean back: scaled, not centred; see `masked_whiten`).
    """
    if inp.values is None:
        raise ValueError("advantage=gae needs AdvantageInputs.values [B, T] from the critic.")
    mask = inp.float_mask()
    values = masked(inp.values.to(torch.float32), mask)
    rewards = token_level_rewards(inp.float_rewards(), mask, inp.token_rewards, inp.turn_rewards)
    adv = gae_advantages(values, rewards, mask, gamma, lam)
    returns = masked(adv + values, mask)
    if gae_whiten:
        adv = masked_whiten(adv, mask, adv_eps, shift_mean)
    return AdvantageOutputs(advantages=adv, returns=returns)


def _whitened_returns(
    outcome: Tensor, inp: AdvantageInputs, gamma: float, eps: float, shift_mean: bool
) -> AdvantageOutputs:
    mask = inp.float_mask()
    returns = discounted_returns(
        token_level_rewards(outcome, mask, inp.token_rewards, inp.turn_rewards), mask, gamma
    )
    return AdvantageOutputs(advantages=masked_whiten(returns, mask, eps, shift_mean), returns=returns)


def reinforce_pp(
    inp: AdvantageInputs, *, gamma: float = 1.0, shift_mean: bool = True, adv_eps: float = 1e-6
) -> AdvantageOutputs:
    """REINFORCE++ (Hu 2025): no critic, no group baseline; batch-normalised token returns.

    r_t = token_rewards_t (the KL penalty) + outcome on the last policy token; G_t = sum_{k>=t} gamma^(k-t)
    r_k over policy tokens; A = (G - mean(G)) / (std(G) + eps) over all policy tokens of the batch
    (shift_mean=False: A = that + mean(G), scaled but not centred). returns = G (unwhitened).
    """
    return _whitened_returns(inp.float_rewards(), inp, gamma, adv_eps, shift_mean)


def reinforce_pp_baseline(
    inp: AdvantageInputs, *, gamma: float = 1.0, shift_mean: bool = True, adv_eps: float = 1e-6
) -> AdvantageOutputs:
    """REINFORCE++-baseline (Hu 2025): subtract the group mean reward first, then as reinforce_pp.

    outcome_i = r_i - mean_{j in group(i)} r_j; then token returns with token_rewards and gamma, whitened
    over all policy tokens of the batch. A group of one has outcome 0.
    """
    rewards = inp.float_rewards()
    mean = group_stats(rewards, inp.group_ids)[0]
    return _whitened_returns(rewards - mean, inp, gamma, adv_eps, shift_mean)


def remax(inp: AdvantageInputs, *, gamma: float = 1.0) -> AdvantageOutputs:
    """ReMax (Li et al. 2023): the baseline is the reward of the greedy response to the same prompt.

    Needs inp.baseline_rewards [B]. r_t = token_rewards_t + (r_i - b_i) on the last policy token; A_t = G_t
    (discounted over policy tokens), so with gamma = 1 and no token rewards A = r_i - b_i on every token.
    """
    if inp.baseline_rewards is None:
        raise ValueError(
            "advantage=remax needs AdvantageInputs.baseline_rewards [B] (greedy-response rewards)."
        )
    mask = inp.float_mask()
    outcome = inp.float_rewards() - inp.baseline_rewards.to(torch.float32)
    adv = discounted_returns(
        token_level_rewards(outcome, mask, inp.token_rewards, inp.turn_rewards), mask, gamma
    )
    return AdvantageOutputs(advantages=adv, returns=adv.clone())
