"""The optimal-token baseline (OTB) as an advantage estimator (`ADVANTAGE_ESTIMATORS["optimal_token_baseline"]`),
and the per-token statistic it needs from the trainer's forward: the sum over the vocabulary of the squared
probabilities, Σπ² (`sum_pi_squared_from_logits`).

Li et al. 2026 ("Optimal Token Baseline", arXiv 2602.07078; verl's `optimal_token_baseline`): a baseline per
token instead of one per trajectory. For a trajectory's token t, the squared norm of the score function
∇_z log π(y_t) over the logits z is ||onehot - π||² = 1 - 2 π(y_t) + Σ_v π_v², the "logit-gradient proxy" of
the token's gradient energy; W_t, its running sum from the first policy token to t, is the trajectory's
"realized energy" up to t. The variance-minimising baseline of the reward-to-go G_t over a group of samples of
one prompt is then B*_t = Σ_i G_t^(i) W_t^(i) / Σ_i W_t^(i): trajectories that were uncertain so far count
more. Padding (and tool tokens, mask 0) add nothing to W and take no baseline.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ascent.algorithms.advantage_types import AdvantageInputs, AdvantageOutputs, token_level_rewards
from ascent.algorithms.utils import group_index


def sum_pi_squared_from_logits(logits: Tensor) -> Tensor:
    """logits [..., V] (already divided by the temperature) -> Σ_v softmax(logits)_v² [...], in fp32:
    exp(logsumexp(2 z) - 2 logsumexp(z)), no [.., V] probability tensor kept."""
    z = logits.float()
    return torch.exp(torch.logsumexp(2.0 * z, dim=-1) - 2.0 * torch.logsumexp(z, dim=-1))


EPS = 1e-8  # keeps B* finite where a column's energies sum to 0 (every sample there certain); verl's epsilon


def optimal_token_baseline(inp: AdvantageInputs, *, otb_zero_tail: bool = False) -> AdvantageOutputs:
    """A_t = G_t - B*_t on every policy token (see the module doc); returns [B, T] = G_t.

    inp.rewards [B], inp.mask [B, T], inp.group_ids [B], inp.old_logprobs [B, T] (the trainer's logprob of
    each sampled token, log π(y_t)) and inp.sum_pi_squared [B, T] (Σπ² of the same forward) -> advantages
    [B, T], 0 where the mask is 0. G_t is the reward-to-go of the token-level rewards (the outcome on the last
    policy token, earlier turn rewards where they sit, `token_rewards` such as a KL penalty on every token).
    w_t = 1 - 2 exp(old_logprob_t) + Σπ²_t, W_t = Σ_{j <= t, mask_j = 1} w_j,
    B*_t = Σ_{i in g, mask_it = 1} G_t^(i) W_t^(i) / (Σ_{i in g, mask_it = 1} W_t^(i) + EPS), taken per
    column t (tokens at the same position of the group's trajectories). A group of one keeps B = 0 (A = G).
    otb_zero_tail: where one trajectory of the group is strictly the longest, its tokens past the second
    longest get B = 0 (no other trajectory is there to compare with; verl's `handle_zero_tail`).
    """
    if inp.old_logprobs is None or inp.sum_pi_squared is None:
        raise ValueError(
            "advantage=optimal_token_baseline: AdvantageInputs needs old_logprobs and sum_pi_squared [B, T] "
            "(the loop's old-logprob pass produces both for this estimator)."
        )
    mask = inp.float_mask()
    rewards = token_level_rewards(inp.float_rewards(), mask, inp.token_rewards, inp.turn_rewards)
    returns = (rewards * mask).flip(-1).cumsum(-1).flip(-1)
    w = 1.0 - 2.0 * inp.old_logprobs.float().exp() + inp.sum_pi_squared.float()
    energy = torch.where(mask > 0, w, torch.zeros_like(w)).cumsum(-1) * mask  # nothing from behind the mask
    idx, g = group_index(inp.group_ids)
    baseline = torch.zeros_like(returns)
    for k in range(g):
        members = (idx == k).nonzero().squeeze(-1)
        if members.numel() < 2:
            continue
        num = (returns[members] * energy[members]).sum(0)
        den = energy[members].sum(0) + EPS
        baseline[members] = (num / den).expand(members.numel(), -1)
        if otb_zero_tail:
            _zero_tail(baseline, members, mask)
    adv = (returns - baseline) * mask
    return AdvantageOutputs(advantages=adv, returns=returns * mask)


def _zero_tail(baseline: Tensor, members: Tensor, mask: Tensor) -> None:
    """In place: when one member is strictly the longest of its group, its baseline past the second longest
    length is 0."""
    lengths = mask[members].sum(-1)
    ordered = torch.sort(lengths).values
    longest, second = int(ordered[-1]), int(ordered[-2])
    at_max = (lengths == longest).nonzero().squeeze(-1)
    if at_max.numel() == 1 and longest > second:
        baseline[members[at_max[0]], second:] = 0.0
