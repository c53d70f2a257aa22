"""KL(policy || reference) estimators, the KL reward penalty and its coefficient controllers.

`KL_ESTIMATORS[name](logprobs [N], ref_logprobs [N]) -> kl [N]` works on any shape (flat or [B, T]) and is
used two ways: as a loss term in the trainer (`kl_loss_coef`, GRPO style) or as a per-token reward penalty
on the controller (`kl_penalty_rewards`, PPO/REINFORCE++ style, fed to the estimators as `token_rewards`).
Estimators follow Schulman, "Approximating KL Divergence" (2020); with x = ref - logp on samples of the
policy: k1 = -x (unbiased), k2 = x^2 / 2 (low variance, biased), k3 = e^x - x - 1 (unbiased, non-negative).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from ascent.algorithms.utils import clamp_log_ratio

K3_LOG_RATIO_CLAMP = 20.0
K3_MAX = 10.0


def kl_k1(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """[*], [*] -> [*]: k1 = logp - ref (its gradient is grad logp: pushes logp down, not toward ref)."""
    return logprobs - ref_logprobs


def kl_k2(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """[*], [*] -> [*]: k2 = 0.5 * (logp - ref)^2 (gradient (logp - ref) grad logp, the KL's true
    gradient)."""
    return 0.5 * (logprobs - ref_logprobs) ** 2


def kl_k3(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """[*], [*] -> [*]: k3 = exp(ref - logp) - (ref - logp) - 1, log-ratio clamped to +-20, value <= 10.

    Used as the KL loss of GRPO (Shao et al. 2024); the clamps keep +-50 log-ratios finite.
    """
    x = clamp_log_ratio(ref_logprobs - logprobs, K3_LOG_RATIO_CLAMP)
    return (torch.exp(x) - x - 1.0).clamp(max=K3_MAX)


def _straight_through(value: Tensor, k2: Tensor) -> Tensor:
    """Value of `value`, gradient of k2: k2 + (value - k2).detach()."""
    return k2 + (value - k2).detach()


def kl_k1_plus(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """[*], [*] -> [*]: straight-through k1+: the value of k1, the gradient of k2 (an unbiased KL
    gradient)."""
    return _straight_through(kl_k1(logprobs, ref_logprobs), kl_k2(logprobs, ref_logprobs))


def kl_k3_plus(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """[*], [*] -> [*]: straight-through k3+: the value of k3, the gradient of k2."""
    return _straight_through(kl_k3(logprobs, ref_logprobs), kl_k2(logprobs, ref_logprobs))


KL_ESTIMATORS: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "k1": kl_k1,
    "k2": kl_k2,
    "k3": kl_k3,
    "k1+": kl_k1_plus,
    "k3+": kl_k3_plus,
}


def kl_penalty_rewards(
    logprobs: Tensor,
    ref_logprobs: Tensor,
    mask: Tensor,
    coef: float,
    estimator: str | Callable[[Tensor, Tensor], Tensor] = "k1",
) -> Tensor:
    """logprobs [B, T], ref_logprobs [B, T], mask [B, T] -> token_rewards [B, T] = -coef * kl * mask
    (detached).

    The per-token KL reward of RLHF PPO (Ziegler et al. 2019; Ouyang et al. 2022), passed to the advantage
    estimators as `AdvantageInputs.token_rewards`. `estimator` is a KL_ESTIMATORS name or a callable.
    """
    fn = KL_ESTIMATORS[estimator] if isinstance(estimator, str) else estimator
    kl = fn(logprobs.detach(), ref_logprobs.detach())
    return torch.where(mask.bool(), -coef * kl, torch.zeros_like(kl))


class FixedKLController:
    """A constant KL coefficient: `.coef` never changes; `update` is a no-op (same interface as adaptive)."""

    def __init__(self, init_coef: float) -> None:
        self.coef = float(init_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """Does nothing (kept for interface parity with AdaptiveKLController)."""


class AdaptiveKLController:
    """The adaptive KL coefficient of Ziegler et al. 2019 ("Fine-Tuning LMs from Human Preferences").

    After each batch: e = clip(current_kl / target - 1, -0.2, 0.2); coef *= 1 + e * n_steps / horizon.
    The coefficient grows while the measured KL is above `target` and shrinks while below.
    """

    def __init__(self, init_coef: float, target: float, horizon: int) -> None:
        if target <= 0 or horizon <= 0:
            raise ValueError(f"AdaptiveKLController: target={target} and horizon={horizon} must be > 0.")
        self.coef = float(init_coef)
        self.target = float(target)
        self.horizon = int(horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        """Move `coef` toward the value that keeps the KL at `target`; n_steps = samples (or steps) seen."""
        error = min(max(float(current_kl) / self.target - 1.0, -0.2), 0.2)
        self.coef *= 1.0 + error * n_steps / self.horizon
