"""On-policy distillation as an advantage estimator (`ADVANTAGE_ESTIMATORS["distill"]`): a frozen teacher's
log-probabilities of the tokens the student sampled are the signal, per token.

Agarwal et al. 2024 ("On-Policy Distillation of Language Models: Learning from Self-Generated Mistakes",
GKD) and Thinking Machines' "On-Policy Distillation" (2025): the student samples, the teacher scores every
sampled token, and the per-token reverse KL estimate log pi_student(x_t) - log pi_teacher(x_t) is a penalty;
its negative is the token's advantage, used by the ordinary policy losses (ppo, reinforce with an importance
ratio). The student's logprobs are the SAMPLER's (`AdvantageInputs.sampler_logprobs`): the distribution the
tokens were drawn from, which makes the single-sample estimate unbiased, and needs no extra forward pass (the
trainer's old logprobs may not exist: `train.old_logprobs=auto`). Both are at the sampling temperature.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ascent.algorithms.advantage_types import AdvantageInputs, AdvantageOutputs, broadcast
from ascent.algorithms.utils import group_stats, safe_div


def distill(
    inp: AdvantageInputs, *, distill_coef: float = 1.0, reward_weight: float = 0.0, adv_eps: float = 1e-6
) -> AdvantageOutputs:
    """A_t = distill_coef * (teacher_logp_t - sampler_logp_t) + reward_weight * A_grpo on every policy token.

    inp.teacher_logprobs [B, T] and inp.sampler_logprobs [B, T] (required), inp.mask [B, T], inp.rewards [B],
    inp.group_ids [B] -> advantages [B, T] = returns [B, T], 0 where the mask is 0. No discounting: each token's
    advantage is its own reverse-KL term (Thinking Machines' discount 0). A_grpo is the GRPO outcome advantage
    (r_i - mean_g) / (std_g + adv_eps) of the trajectory (0 for a group of one or of equal rewards);
    reward_weight = 0 (the default) is pure distillation, and the rewards are not read.
    """
    if inp.teacher_logprobs is None or inp.sampler_logprobs is None:
        raise ValueError(
            "advantage=distill: AdvantageInputs needs teacher_logprobs and sampler_logprobs [B, T] (the loop "
            "passes them with advantage=distill and algorithm.teacher set)."
        )
    mask = inp.float_mask()
    gap = inp.teacher_logprobs.float() - inp.sampler_logprobs.float()
    adv = distill_coef * torch.where(mask > 0, gap, torch.zeros_like(gap))  # no garbage from behind the mask
    if reward_weight:
        rewards = inp.float_rewards()
        mean, std, _size = group_stats(rewards, inp.group_ids)
        adv = adv + reward_weight * broadcast(safe_div(rewards - mean, std + adv_eps), mask)
    return AdvantageOutputs(advantages=adv, returns=adv.clone())


def reverse_kl(student_logprobs: Tensor, teacher_logprobs: Tensor, mask: Tensor) -> Tensor:
    """student_logprobs [B, T], teacher_logprobs [B, T], mask [B, T] -> scalar: the mean over unmasked tokens
    of student - teacher (the per-token reverse KL estimate KL(student || teacher) on sampled tokens); 0 with
    no unmasked token."""
    m = mask != 0
    gap = student_logprobs.float() - teacher_logprobs.float()
    return torch.where(m, gap, torch.zeros_like(gap)).sum() / m.sum().clamp(min=1)
