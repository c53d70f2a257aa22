"""Sampling and scoring one batch of prompts: the two steps that training, DAPO collection and validation
share.

`submit` spreads requests over the rollout replicas and returns at once; `finish` waits for them and turns
their generations into one group of episodes per prompt, each token stamped with the policy version it was
sampled with; `generate` is the two in a row. `Scorer` returns the groups with the reward function's rewards, plus the
weighted scores of a reward model and a judge when the run has them (`reward_models.ComponentScorer`).
Each takes what it uses: the rollout worker group, the tokenizer's `decode`, the reward runner.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ascent.cluster.base import PendingCall, WorkerGroup
from ascent.messages import Group, Rollout, SamplingParams, flatten, regroup
from ascent.orchestrator import batch as B
from ascent.orchestrator.reward_models import ComponentScorer, summary
from ascent.orchestrator.workers import RolloutWorker
from ascent.rewards import RewardInput, RewardResult, RewardRunner

Decode = Callable[[Sequence[int]], str]


@dataclass(frozen=True)
class Submitted:
    """Generation in flight: the prompts and the replicas' pending results."""

    items: list[Any]
    pending: PendingCall[Rollout]


@dataclass(frozen=True)
class RolloutStats:
    """How one batch's generation went: the replicas' idle time before it (mean over replicas). The time the
    controller waited for it is the collector's (`Collector.take_waited`). `metrics`: what the batch's
    source reports of itself (an agent's plays: `agent/*`)."""

    engine_idle_s: float
    metrics: dict[str, float] = field(default_factory=dict)


def submit(
    rollout: WorkerGroup[RolloutWorker], items: list[Any], params: SamplingParams, *, seed: int
) -> Submitted:
    """Start sampling `params.n` responses per prompt on the rollout replicas (contiguous shards)."""
    requests = B.make_requests([i.prompt_ids for i in items], params, seed, [B.item_images(i) for i in items])
    shards = B.shard(requests, rollout.num_workers)
    return Submitted(items, rollout.call_split_async(RolloutWorker.generate, shards))


def finish(sub: Submitted, decode: Decode) -> tuple[list[Group], RolloutStats]:
    """Wait for a submitted batch -> its groups (one per prompt, in order) and the replicas' idle time."""
    rollouts = sub.pending.get()
    generations = [g for r in rollouts for g in r.generations]
    groups = B.to_groups(sub.items, generations, decode=decode)
    idle = sum(r.idle_s for r in rollouts) / len(rollouts)
    return groups, RolloutStats(engine_idle_s=idle)


def generate(
    rollout: WorkerGroup[RolloutWorker],
    decode: Decode,
    items: list[Any],
    params: SamplingParams,
    *,
    seed: int,
) -> list[Group]:
    """Sample a group of `params.n` episodes per prompt with the weights the replicas hold now."""
    return finish(submit(rollout, items, params, seed=seed), decode)[0]


@dataclass(frozen=True)
class Scorer:
    """Scores single-turn episodes with the reward function (`rewards`) on the decoded prompt and response.

    With `components` (a reward model, a judge) an episode's reward is `fn_weight * fn + sum of weight *
    score` (`fn_weight=0`: the function is not called); each term is also a reward component of the episode
    (`fn`, `reward_model`, `judge`) and has its metrics (`reward/fn/mean`, `reward/judge/failures`, ...)."""

    rewards: RewardRunner
    decode: Decode
    components: tuple[ComponentScorer, ...] = ()
    fn_weight: float = 1.0

    def __call__(self, groups: list[Group]) -> tuple[list[Group], dict[str, float]]:
        """The groups with every episode's reward and reward components set, and the reward runner's
        metrics (reward/mean, /std, failures)."""
        trajs = flatten(groups)
        prompts: dict[tuple[int, ...], str] = {}  # a group's episodes share their prompt: decode it once
        inputs = [
            RewardInput(
                prompt=_cached(prompts, t.prompt_ids, self.decode),
                response=t.response_text,
                response_ids=t.response_ids,
                metadata=t.metadata,
                row_id=t.row_id,
            )
            for t in trajs
        ]
        result = self._score(inputs) if self.components else self.rewards.score(inputs)
        scored = [
            replace(t, reward=r, reward_components=dict(c))
            for t, r, c in zip(trajs, result.rewards, result.components, strict=True)
        ]
        return regroup(groups, scored), result.metrics

    def _score(self, inputs: list[RewardInput]) -> RewardResult:
        """The reward function's result, weighted, plus every component's weighted score."""
        n = len(inputs)
        metrics: dict[str, float] = {}
        totals, parts = [0.0] * n, [dict[str, float]() for _ in range(n)]
        if self.fn_weight != 0:
            fn = self.rewards.score(inputs)
            metrics |= {k: v for k, v in fn.metrics.items() if k not in ("reward/mean", "reward/std")}
            metrics |= summary("fn", fn.rewards, int(fn.metrics["reward/failures"]))
            for i, (r, extras) in enumerate(zip(fn.rewards, fn.components, strict=True)):
                totals[i], parts[i] = self.fn_weight * r, {**extras, "fn": r}
        for scorer in self.components:
            out = scorer.score(inputs)
            metrics |= out.metrics
            for i, value in enumerate(out.scores):
                totals[i] += scorer.weight * value
                parts[i][scorer.name] = value
        if n:
            metrics |= {"reward/mean": statistics.fmean(totals), "reward/std": statistics.pstdev(totals)}
        return RewardResult(rewards=totals, components=parts, metrics=metrics)


def _cached(texts: dict[tuple[int, ...], str], ids: Sequence[int], decode: Decode) -> str:
    key = tuple(ids)
    if key not in texts:
        texts[key] = decode(ids)
    return texts[key]
