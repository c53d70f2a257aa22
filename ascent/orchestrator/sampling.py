"""Sampling and scoring one batch of prompts: the two steps that training, DAPO collection and validation share.

`submit` spreads requests over the rollout replicas and returns at once; `finish` waits for them and turns
their generations into trajectories, each token stamped with the policy version it was sampled with;
`generate` is the two in a row. `score` runs the reward function on trajectories in place. All take the
loop context (`ascent.orchestrator.train.LoopContext`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ascent.cluster.base import PendingCall
from ascent.orchestrator import batch as B
from ascent.orchestrator.workers import RolloutWorker
from ascent.types import Rollout, SamplingParams, Trajectory


@dataclass(frozen=True)
class Submitted:
    """Generation in flight: the prompts and the replicas' pending results."""

    items: list[Any]
    pending: PendingCall[Rollout]


@dataclass(frozen=True)
class RolloutStats:
    """How one batch's generation went: the replicas' idle time before it (mean over replicas). The time the
    controller waited for it is the collector's (`Collector.take_waited`)."""

    engine_idle_s: float


def submit(ctx: Any, items: list[Any], params: SamplingParams, *, seed: int) -> Submitted:
    """Start sampling `params.n` responses per prompt on the rollout replicas (contiguous shards)."""
    requests = B.make_requests([i.prompt_ids for i in items], params, seed)
    n = ctx.rollout.num_workers
    per = -(-len(requests) // n)
    shards = [requests[i * per : (i + 1) * per] for i in range(n)]
    return Submitted(items, ctx.rollout.call_split_async(RolloutWorker.generate, shards))


def finish(ctx: Any, sub: Submitted) -> tuple[list[Trajectory], RolloutStats]:
    """Wait for a submitted batch -> its trajectories (per prompt, in order) and the replicas' idle time."""
    rollouts = sub.pending.get()
    generations = [g for r in rollouts for g in r.generations]
    trajs = B.to_trajectories(sub.items, generations, decode=ctx.decode)
    idle = sum(r.idle_s for r in rollouts) / len(rollouts)
    return trajs, RolloutStats(engine_idle_s=idle)


def generate(ctx: Any, items: list[Any], params: SamplingParams, *, seed: int) -> list[Trajectory]:
    """Sample `params.n` trajectories per prompt with the weights the replicas hold now."""
    return finish(ctx, submit(ctx, items, params, seed=seed))[0]


def score(ctx: Any, trajs: list[Any]) -> dict[str, float]:
    """Score every trajectory in place; return the reward runner's metrics (reward/mean, /std, failures)."""
    from ascent.rewards import RewardInput

    inputs = [
        RewardInput(
            prompt=ctx.decode(t.prompt_ids),
            response=t.response_text,
            response_ids=t.response_ids,
            metadata=t.metadata,
            row_id=t.row_id,
        )
        for t in trajs
    ]
    result = ctx.rewards.score(inputs)
    for t, r, comp in zip(trajs, result.rewards, result.components, strict=True):
        t.reward, t.reward_components = r, comp
    return result.metrics
