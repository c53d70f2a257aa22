"""The run's health checks, called by the loop (`loop.py`): is there a gradient to follow, is anything being
learned, has the run diverged.

- `steps_mini_batch`: the controller decides, from the mini-batch it is about to send, whether the
  trainer takes an optimizer step (the same answer reaches every rank). A mini-batch whose advantages are all
  zero on its sampled tokens has no policy gradient; stepping it would still move the weights (AdamW
  momentum, weight decay), so it is not stepped unless `train.step_on_zero_advantage` or another loss term
  (KL to the reference, entropy bonus) has a gradient of its own.
- `EqualRewardWatch`: several consecutive iterations whose every group had equal reward learn nothing;
  it warns once, with the likely causes.
- `DivergenceCheck`: after the update and before the iteration's checkpoint, a diverged run (non-finite
  loss or gradient, entropy risen to the uniform distribution's, a dead gradient) stops with
  `TrainingDiverged` (exit status 2) naming the metric, the last good checkpoint and the fix.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ascent.config.schema import RunConfig
from ascent.errors import AscentError
from ascent.messages import Group, TrainSample
from ascent.orchestrator.checkpointing import checkpoint_dirs

EQUAL_REWARD_PATIENCE = 3
"""Consecutive iterations of equal rewards in every group before `EqualRewardWatch` warns."""
ENTROPY_AT_MAX, ENTROPY_BELOW_MAX = 0.99, 0.9
"""The entropy has diverged at >= 99% of log(vocab), if the run's first iteration was below 90% of it (a
random-init model starts at the maximum; that is not a divergence)."""


class TrainingDiverged(AscentError):
    """The loss or the gradient diverged; the message names the metric, the last good checkpoint, the fix."""


@dataclass(frozen=True)
class RunFacts:
    """The settings the health messages name (and the one the divergence check reads), taken from the config
    once at setup (`of`)."""

    run_dir: str
    model_path: str
    fp16: bool  # model.dtype=fp16: a non-finite gradient is the loss scaler's, not a divergence
    lr: float
    max_grad_norm: float | None
    reward_source: str  # what rewards the episodes: `reward.fn=...` or the env or agent source
    samples_per_prompt: int
    temperature: float
    max_new_tokens: int

    @classmethod
    def of(cls, cfg: RunConfig) -> RunFacts:
        r = cfg.rollout
        return cls(
            run_dir=cfg.run_dir,
            model_path=cfg.model.path,
            fp16=cfg.model.dtype == "fp16",
            lr=cfg.train.lr,
            max_grad_norm=cfg.train.max_grad_norm,
            reward_source=r.source.label if r.multi_turn else f"reward.fn={cfg.reward.fn!r}",
            samples_per_prompt=r.samples_per_prompt,
            temperature=r.temperature,
            max_new_tokens=r.max_new_tokens,
        )


def has_policy_gradient(samples: Sequence[TrainSample]) -> bool:
    """True when some sampled token (loss mask 1) of the mini-batch has a nonzero advantage."""
    return any(a != 0.0 for s in samples for a, m in zip(s.advantages, s.loss_mask, strict=True) if m)


def steps_mini_batch(
    samples: Sequence[TrainSample], *, step_on_zero_advantage: bool, other_terms: bool
) -> bool:
    """Whether the trainer takes the optimizer step of this mini-batch: it has a policy gradient, another
    active loss term (`other_terms`: KL loss, entropy bonus) or the user asked for every step."""
    return step_on_zero_advantage or other_terms or has_policy_gradient(samples)


def zero_gradient(metrics: dict[str, float]) -> bool:
    """One stepped mini-batch's trainer metrics: its gradient is exactly zero though nothing explains it (not
    every token clipped by the policy loss nor masked by the rollout correction)."""
    explained = metrics.get("clipfrac", 0.0) >= 1.0 or metrics.get("rollout_is_masked_frac", 0.0) >= 1.0
    return metrics.get("grad_norm") == 0.0 and not explained


class EqualRewardWatch:
    """Counts consecutive iterations whose every group had equal reward; `observe` returns a warning once,
    when the count reaches `patience` (None otherwise, and ever after), naming the run's settings (`facts`)."""

    def __init__(self, facts: RunFacts, patience: int = EQUAL_REWARD_PATIENCE) -> None:
        self.facts, self.patience, self.count, self.warned = facts, patience, 0, False

    def observe(self, groups: Sequence[Group], it: int, truncated_frac: float) -> str | None:
        equal = all(_spread([e.reward for e in g.episodes]) == 0.0 for g in groups)
        self.count = self.count + 1 if equal else 0
        if self.warned or self.count < self.patience:
            return None
        self.warned = True
        rewards = sorted({e.reward for g in groups for e in g.episodes})
        return equal_reward_message(self.facts, it - self.count + 1, it, rewards, truncated_frac)


def _spread(values: list[float]) -> float:
    return max(values) - min(values) if values else 0.0


def equal_reward_message(
    facts: RunFacts, first: int, last: int, rewards: list[float], truncated_frac: float
) -> str:
    """The warning of `EqualRewardWatch`: what happened, and the likely causes with this run's settings."""
    shown = ", ".join(f"{x:g}" for x in rewards[:5]) + (", ..." if len(rewards) > 5 else "")
    return (
        f"iterations {first}-{last}: every group had equal rewards (rewards seen: {shown}), so every "
        "advantage is zero and nothing is learned (train/skipped_steps counts the steps not taken). Likely "
        f"causes: {facts.reward_source} returns the same value for every response (check it on a few); the answers "
        "are out "
        "of the model's reach (start from an SFT warm start, or easier rows); "
        f"rollout.samples_per_prompt={facts.samples_per_prompt} is too small for a group to differ; "
        f"rollout.temperature={facts.temperature} is too low for the samples to differ; "
        f"rollout.max_new_tokens={facts.max_new_tokens} cuts responses short "
        f"({truncated_frac:.0%} were truncated this iteration)."
    )


class DivergenceCheck:
    """`check(metrics, it)` after the update of iteration `it`: raises `TrainingDiverged` when the run
    diverged.

    Diverged: a non-finite loss; a non-finite gradient norm (not with fp16, whose loss scaler skips such
    steps and lowers its scale by design); the entropy risen to >= 99% of log(vocab) from below 90% of it at
    the first iteration checked; every stepped mini-batch with a nonzero advantage had a gradient of
    exactly 0.
    """

    def __init__(self, facts: RunFacts, vocab_size: int) -> None:
        self.facts = facts
        self.max_entropy = math.log(max(vocab_size, 2))
        self.first_entropy: float | None = None

    def diverged(self, metrics: dict[str, float]) -> tuple[str, float, str] | None:
        """(metric, value, what it means) of the first sign of divergence in `metrics`, or None."""
        loss = metrics.get("loss/total")
        if loss is not None and not math.isfinite(loss):
            return "loss/total", loss, "the loss is not finite"
        norm = metrics.get("grad_norm")
        if norm is not None and not math.isfinite(norm) and not self.facts.fp16:
            return "grad_norm", norm, "the gradient is not finite"
        entropy = metrics.get("entropy")
        if entropy is not None:
            if self.first_entropy is None:
                self.first_entropy = entropy
            started_below = self.first_entropy < ENTROPY_BELOW_MAX * self.max_entropy
            if started_below and entropy >= ENTROPY_AT_MAX * self.max_entropy:
                return (
                    "entropy",
                    entropy,
                    f"the policy is uniform over the vocabulary (log V = {self.max_entropy:.3f})",
                )
        if metrics.get("train/zero_grad_frac") == 1.0:
            return "grad_norm", 0.0, "the gradient is exactly zero although the advantages are not"
        return None

    def check(self, metrics: dict[str, float], it: int) -> None:
        found = self.diverged(metrics)
        if found is not None:
            raise TrainingDiverged(divergence_message(self.facts, it, *found))


def divergence_message(facts: RunFacts, it: int, metric: str, value: float, meaning: str) -> str:
    """What diverged, where the last good checkpoint is, and the fix."""
    good = checkpoint_dirs(facts.run_dir)
    clip = "set train.max_grad_norm (now null: no clipping; 1.0 clips the gradient norm)"
    if facts.max_grad_norm is not None:
        clip = f"lower train.max_grad_norm (now {facts.max_grad_norm})"
    if good:
        where = (
            f"the last good checkpoint is {str(good[-1])!r}: resume from it with `ascent train <config> "
            f"train.lr=<lower> --resume-from {Path(good[-1]).name} --accept-changes`"
        )
    else:
        where = f"no checkpoint was saved before it: start again from model.path={facts.model_path!r}"
    return (
        f"training diverged at iteration {it}: {metric}={value} ({meaning}). The run stopped before saving "
        f"this iteration's checkpoint; {where}. Fix: lower train.lr (now {facts.lr}) and {clip}."
    )
