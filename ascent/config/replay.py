"""The config of replay (`replay`): training on groups stored by an earlier run (or this one) in an experience
store, mixed with fresh groups (`ascent.orchestrator.replay` consumes it). Imports without torch.

    replay:
      store: runs/first            # a run directory or its experience.db
      ratio: 0.25                  # of rollout.prompts_per_step groups, this share comes from the store
      score: reward_variance       # uniform | reward_variance | recent | pkg.module:function

Stored episodes are off-policy: they keep the sampler logprobs and token versions they were sampled with (the
versions of the run that stored them), so replay needs importance correction against those logprobs
(`algorithm.rollout_correction` tis or mis).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from ascent.config.section import Section

if TYPE_CHECKING:
    from ascent.config.schema import RunConfig

REPLAY_SCORES = ("uniform", "reward_variance", "recent")  # ascent.orchestrator.replay.SCORES (a test checks)


class ReplayConfig(Section):
    store: str | None = Field(
        None,
        description="Replay groups from this experience store: a run directory or its experience.db (null: "
        "no replay). Whole trained groups of rollout.samples_per_prompt episodes are read once at start.",
    )
    ratio: float = Field(
        0.25,
        gt=0,
        lt=1,
        description="The share of each iteration's rollout.prompts_per_step groups drawn from the store; "
        "ratio * prompts_per_step must be a whole number (the rest are sampled fresh).",
    )
    score: str = Field(
        "uniform",
        description="Each stored group's draw weight: uniform, reward_variance (groups with reward signal), "
        "recent (newer policy versions) or an import path `pkg.module:function` (group -> float >= 0; "
        "groups scored 0 are never drawn).",
    )


def replay_groups(cfg: RunConfig) -> int:
    """The groups of each iteration drawn from the store (0: no replay)."""
    if cfg.replay.store is None:
        return 0
    return round(cfg.replay.ratio * cfg.rollout.prompts_per_step)


def replay_rules(cfg: RunConfig) -> list[str]:
    """Replay fits the run: a whole number of groups, fresh groups left, importance correction on."""
    r, pps = cfg.replay, cfg.rollout.prompts_per_step
    if r.store is None:
        changed = [f for f in ("ratio", "score") if getattr(r, f) != ReplayConfig.model_fields[f].default]
        return [
            f"replay.{f}={getattr(r, f)!r}: replay.store is not set, so nothing replays; set it or remove {f}."
            for f in changed
        ]
    problems = []
    count = r.ratio * pps
    if abs(count - round(count)) > 1e-9 or not 1 <= round(count) < pps:
        problems.append(
            f"replay.ratio={r.ratio}: with rollout.prompts_per_step={pps} that is {count:g} stored groups per "
            f"iteration; choose a ratio that gives a whole number from 1 to {pps - 1} (e.g. {1 / pps:g})."
        )
    if cfg.algorithm.rollout_correction == "none":
        problems.append(
            f"replay.store={r.store!r}: replayed episodes were sampled by other weights; set "
            "algorithm.rollout_correction to tis or mis (importance correction against their stored logprobs)."
        )
    if cfg.algorithm.advantage.name == "remax":
        problems.append(
            "replay.store is set with algorithm.advantage=remax: stored groups have no greedy baseline; use "
            "another estimator or remove replay."
        )
    return problems
