"""`model.action_head`: a continuous action head on the policy (embodied RL; `ascent.models.action_head`),
and the rules of the runs that use one: what it is not wired into yet is refused up front (field, value, fix).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from ascent.config.section import Section
from ascent.config.sources import EnvSourceConfig

if TYPE_CHECKING:
    from ascent.config.schema import RunConfig


class ActionHeadConfig(Section):
    dim: int = Field(
        ge=1,
        description="Dimensions of one action (the simulator's Box action space, e.g. 1 for ReachContinuous).",
    )
    chunk: int = Field(
        1,
        ge=1,
        description="Actions per chunk: each model turn predicts `chunk` steps, which the simulator runs in order.",
    )
    init_std: float = Field(
        1.0,
        gt=0,
        description="The Gaussian's initial standard deviation (one learnable log-std per dimension).",
    )
    token_id: int = Field(
        0,
        ge=0,
        description="The token id that stands for an action in an episode's tokens (its placeholder: loss mask 1, "
        "the chunk's log-probability as its logprob); any id of the vocabulary works.",
    )


def action_head_rules(cfg: RunConfig) -> list[str]:
    """What a run with `model.action_head` cannot use yet, each with its fix (empty without a head)."""
    if cfg.model.action_head is None:
        return []
    a, r = cfg.algorithm, cfg.rollout
    why = "model.action_head is set"
    refused = [
        (
            r.engine == "fast" and r.tensor_parallel > 1,
            f"rollout.tensor_parallel={r.tensor_parallel}: {why} and the fast engine's head runs on one "
            "GPU; set rollout.tensor_parallel=1 (or rollout.engine=reference).",
        ),
        (
            not isinstance(r.source, EnvSourceConfig),
            f"rollout.source={r.source.name}: {why}, whose actions go to "
            "a simulator environment; use rollout.source.name=env with a gym task (env: gym).",
        ),
        (
            cfg.model.lora.rank > 0,
            f"model.lora.rank={cfg.model.lora.rank}: {why}, which trains with the full "
            "weights only; set model.lora.rank=0.",
        ),
        (
            cfg.cluster.num_trainer_workers > 1,
            f"cluster.num_trainer_workers={cfg.cluster.num_trainer_workers}: "
            f"{why}, which is not sharded; set it to 1.",
        ),
        (
            cfg.train.sharding != "none",
            f"train.sharding={cfg.train.sharding!r}: {why}, which is not sharded; set train.sharding=none.",
        ),
        (
            a.kl_loss_coef > 0 or a.kl_penalty_coef > 0,
            f"algorithm.kl_loss_coef={a.kl_loss_coef}, "
            f"kl_penalty_coef={a.kl_penalty_coef}: {why} and the reference model has no head to score actions "
            "with; set both to 0.",
        ),
        (
            a.advantage.name in ("distill", "optimal_token_baseline"),
            f"algorithm.advantage={a.advantage.name!r}: "
            f"{why} and it reads token distributions an action does not have; pick grpo, rloo or gae.",
        ),
        (
            cfg.replay.store is not None,
            f"replay.store={cfg.replay.store!r}: {why} and stored episodes keep no action chunks; set "
            "replay.store to null.",
        ),
    ]
    return [message for broken, message in refused if broken]
