"""Sampling and scoring one batch of prompts: the two steps that training, DAPO collection and validation share.

`generate` spreads requests over the rollout workers and returns trajectories; `score` runs the reward
function on them in place. Both take the loop context (`ascent.orchestrator.train.LoopContext`).
"""

from __future__ import annotations

from typing import Any

from ascent.orchestrator import batch as B


def generate(ctx: Any, items: list[Any], params: Any, *, seed: int, version: int) -> list[Any]:
    """Sample `params.n` trajectories per prompt, spread over the rollout workers."""
    requests = B.make_requests([i.prompt_ids for i in items], params, seed)
    n = ctx.rollout.num_workers
    per = -(-len(requests) // n)
    shards = [requests[i * per : (i + 1) * per] for i in range(n)]
    results = ctx.rollout.call_split("generate", shards)
    generations = [g for shard in results for g in shard]
    return B.to_trajectories(items, generations, decode=ctx.decode, policy_version=version)


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
