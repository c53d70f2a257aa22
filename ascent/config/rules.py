"""Cross-field rules of the run config: batch sizes that divide, algorithm choices that fit together.

Each rule names the field, the value and the fix, in the style of the design:
`rollout.samples_per_prompt=1: GRPO compares samples within a group; set it to 2 or more.`
All broken rules are reported at once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ascent.config.schema import RunConfig

GROUP_ESTIMATORS = {"grpo", "rloo", "opo"}
CRITIC_ESTIMATORS = {"gae"}


def check_run_config(cfg: RunConfig) -> None:
    """Raise ValueError listing every broken cross-field rule of `cfg` (nothing when all hold)."""
    problems = _batch_rules(cfg) + _algorithm_rules(cfg)
    if problems:
        raise ValueError("\n".join(problems))


def _batch_rules(cfg: RunConfig) -> list[str]:
    r, t, c = cfg.rollout, cfg.train, cfg.cluster
    per_step = r.prompts_per_step * r.samples_per_prompt
    out = []
    if per_step % t.trajectories_per_update:
        out.append(
            f"train.trajectories_per_update={t.trajectories_per_update}: one iteration makes "
            f"rollout.prompts_per_step x rollout.samples_per_prompt = {per_step} trajectories, which must "
            f"split into whole mini-batches; set it to a divisor of {per_step} (e.g. {_divisor_near(per_step, t.trajectories_per_update)})."
        )
    if t.trajectories_per_update % c.num_trainer_workers:
        out.append(
            f"cluster.num_trainer_workers={c.num_trainer_workers}: each mini-batch of "
            f"train.trajectories_per_update={t.trajectories_per_update} trajectories is split evenly over "
            "the trainer workers; make the worker count a divisor of it."
        )
    needed = cfg.data.max_prompt_tokens + r.max_new_tokens
    if t.max_tokens_per_micro_batch < needed:
        out.append(
            f"train.max_tokens_per_micro_batch={t.max_tokens_per_micro_batch}: the longest trajectory can have "
            f"data.max_prompt_tokens + rollout.max_new_tokens = {needed} tokens and must fit one micro-batch; "
            f"raise it to at least {needed}."
        )
    return out


def _algorithm_rules(cfg: RunConfig) -> list[str]:
    a, r = cfg.algorithm, cfg.rollout
    out = []
    if a.advantage in GROUP_ESTIMATORS and r.samples_per_prompt < 2:
        out.append(
            f"rollout.samples_per_prompt={r.samples_per_prompt}: {a.advantage.upper()} compares samples within "
            "a group; set it to 2 or more."
        )
    if a.advantage in CRITIC_ESTIMATORS and not a.options.get("critic", True):
        out.append("algorithm.advantage=gae: GAE needs a critic; enable it or choose grpo/rloo/reinforce_pp.")
    if a.kl_loss_coef > 0 and cfg.model.lora.rank == 0 and a.kl_estimator not in {"k1", "k2", "k3", "k1+", "k3+"}:
        if ":" not in a.kl_estimator:
            out.append(
                f"algorithm.kl_estimator={a.kl_estimator!r}: unknown; use k1, k2, k3, k1+ or k3+ "
                "(or an import path)."
            )
    if a.std_over_batch and not a.scale_by_std:
        out.append(
            "algorithm.std_over_batch=true needs algorithm.scale_by_std=true (there is no std to take "
            "over the batch otherwise); set one of them differently."
        )
    return out


def _divisor_near(n: int, want: int) -> int:
    divisors = [d for d in range(1, n + 1) if n % d == 0]
    return min(divisors, key=lambda d: (abs(d - want), -d))
