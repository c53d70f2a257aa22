"""Shaping rewards: DAPO's overlong penalty and truncation masking (`shape_rewards`, applied by the
collector to every batch), and the KL penalty (`kl_penalty`: reference logprobs into per-token rewards with a
fixed or adaptive coefficient). Each step takes groups and returns new ones.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from ascent.algorithms import AdaptiveKLController, FixedKLController, kl_penalty_rewards
from ascent.algorithms.dapo import overlong_penalty
from ascent.config.schema import AlgorithmConfig
from ascent.messages import Episode, Group, flatten, regroup
from ascent.orchestrator import batch as B


@dataclass(frozen=True)
class Shaping:
    """DAPO's reward shaping (`algorithm.overlong_buffer`, `.overlong_penalty`, `.mask_truncated`) against the
    response budget `max_new_tokens` (`rollout.max_new_tokens`)."""

    max_new_tokens: int
    overlong_buffer: int = 0
    overlong_penalty: float = 1.0
    mask_truncated: bool = False


def shape_rewards(s: Shaping, groups: list[Group]) -> list[Group]:
    """The groups after DAPO's overlong penalty (added to the reward) and truncation masking (loss mask
    zeroed on responses that ended by length)."""
    episodes = flatten(groups)
    if s.overlong_buffer > 0:
        lengths = torch.tensor([len(e.response_ids) for e in episodes])
        penalty = overlong_penalty(lengths, s.max_new_tokens, s.overlong_buffer, s.overlong_penalty).tolist()
        episodes = [
            replace(e, reward=e.reward + p, reward_components=e.reward_components | {"overlong_penalty": p})
            for e, p in zip(episodes, penalty, strict=True)
        ]
    if s.mask_truncated:
        episodes = [
            replace(e, loss_mask=[0] * len(e.response_ids)) if e.finish_reason == "length" else e
            for e in episodes
        ]
    return regroup(groups, episodes)


KLController = FixedKLController | AdaptiveKLController


def make_kl_controller(algo_cfg: AlgorithmConfig) -> KLController | None:
    if algo_cfg.kl_penalty_coef <= 0:
        return None
    if algo_cfg.kl_target is None:
        return FixedKLController(algo_cfg.kl_penalty_coef)
    return AdaptiveKLController(algo_cfg.kl_penalty_coef, algo_cfg.kl_target, algo_cfg.kl_horizon)


def kl_penalty(
    controller: KLController | None,
    estimator: str,
    episodes: list[Episode],
    old_lp: list[list[float]] | None,
    ref_lp: list[list[float]] | None,
) -> tuple[torch.Tensor | None, dict[str, float]]:
    """Per-token KL-penalty rewards [B, T] (None when off) and the KL metrics; updates the `controller`
    (`estimator`: `algorithm.kl_penalty_estimator`)."""
    if controller is None or ref_lp is None:
        return None, {}
    assert old_lp is not None  # run_iteration computes them whenever a KL penalty is on
    width = max(1, max(len(t.response_ids) for t in episodes))
    lp, ref = B.padded(old_lp, width), B.padded(ref_lp, width)
    mask = B.padded([t.loss_mask for t in episodes], width)
    coef = controller.coef
    token_rewards = kl_penalty_rewards(lp, ref, mask, coef, estimator)
    kl = ((lp - ref) * mask).sum() / mask.sum().clamp(min=1)
    controller.update(kl.item(), len(episodes))
    return token_rewards, {"kl/penalty_coef": coef, "kl/policy_vs_ref": kl.item()}
