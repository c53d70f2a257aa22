"""The collector: each iteration's prompt batches, generated ahead of training within a per-episode
staleness bound.

`Collector.collect` gathers one iteration's groups: batches from the run's episode source
(`ascent.orchestrator.sources`), scored by it, shaped (`shaping.shape_rewards`), taken out when stale, run
through the group hooks of `reward.group_hooks` (`group_hooks.apply_group_hooks`: shaping, and filters whose
dropped groups are replaced), and with DAPO dynamic sampling replaced when their rewards are all equal (no
signal), until `prompts_per_step` remain; ReMax adds a greedy baseline per prompt. A group's identity is its
place in the list; the groups a step leaves out (stale, filtered, without signal, surplus) go to the
experience store (`experience.record_left_out`).

Policy versions count weight publications: the trainer's weights after iteration `it` are version `it`, and
the engines get them at the end of that iteration. An episode sampled with version `v` and trained on in
iteration `it` (trainer at version `it - 1`) is `it - 1 - v` versions stale; its oldest token counts.

`rollout.max_staleness=0` is synchronous RL: an iteration samples its prompts when it starts, with the
weights of the previous iteration. With a bound k >= 1 the collector submits the first prompt batch of the
next k iterations as soon as an iteration's groups are in, so the replicas sample while the trainer computes
logprobs, updates and publishes (on Ray with `cluster.placement=split`, or colocated with
`cluster.engine_sleeps=false`, the two overlap; inline, or colocated with the engine asleep through the
update, the same schedule runs one step after the other). On such replicas with the fast engine
a publication reaches each replica between two decode steps of the generate call in flight
(`rollout.swap_mid_generation`): the trainer waits one step, not the rest of the call, and the call's
sequences go on with the new weights (or restart); elsewhere (or with `off`) a replica runs one call at a
time and a publication waits for the call in flight. Either way every token records the version that
sampled it, so a sequence's versions may change mid-way and its staleness is its oldest token's. When an
iteration takes a batch, a group with any episode more than k versions
behind is stale: `drop` replaces it with fresh prompts, `regenerate` samples the same prompts again with the
current weights. Importance correction (TIS/MIS, against the sampler's own logprobs) covers the gap kept.

Multi-turn episodes (an environment's or an agent's) are played ahead the same way, on a thread of the
controller when the replicas generate alongside the trainer (`ClusterConfig.generates_alongside`); weights
can then change between two turns of an episode, and each turn's tokens carry the version that sampled
them. Otherwise an iteration ahead is played when it is prefetched.

The prompt sampler is drawn in the same order as in synchronous RL (prefetching happens after an iteration's
own draws), and a checkpoint saves the sampler as it was before the prefetched draws, so a resumed run
draws them again.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from ascent.algorithms.dapo import filter_groups_with_variance
from ascent.config.rollout import RolloutConfig
from ascent.config.schema import RunConfig
from ascent.data.sampler import PromptSampler
from ascent.errors import AscentError
from ascent.messages import Episode, Group, SamplingParams, flatten
from ascent.orchestrator import batch as B
from ascent.orchestrator import experience
from ascent.orchestrator.experience import ExperienceLog
from ascent.orchestrator.group_hooks import GroupHook, HookTally, apply_group_hooks
from ascent.orchestrator.sampling import RolloutStats
from ascent.orchestrator.shaping import shape_rewards
from ascent.orchestrator.sources import EpisodeSource, Pending, PromptSource
from ascent.tracking import Timeline


def batch_seed(seed: int, it: int, batch: int) -> int:
    """The sampling seed of prompt batch `batch` of iteration `it` (the same in sync and async runs)."""
    return seed * 1_000_003 + it * 10_007 + batch * 101


class DynamicSamplingError(AscentError):
    """Dynamic sampling could not fill the batch within `algorithm.max_sample_batches`."""


@dataclass(frozen=True)
class _Ahead:
    """A first batch submitted before its iteration, and the sampler's state before it was drawn."""

    submitted: Pending  # generation in flight, or episodes being played (or played)
    sampler_state: dict[str, Any]


class Collector:
    """Hands each iteration its prompt batches: prefetched, fresh, or regenerated (see module docstring)."""

    def __init__(
        self,
        source: EpisodeSource,
        items: Sequence[Any],
        params: SamplingParams,
        seed: int,
        max_staleness: int,
        stale_groups: str,
        hooks: Sequence[GroupHook] = (),
    ) -> None:
        """Batches of the training prompts `items` (`PromptItem`s) from `source`, sampled with `params`
        and seeds derived from `seed` (`batch_seed`); `hooks`: the run's group hooks
        (`group_hooks.build_group_hooks`)."""
        self.source, self.items, self.params, self.seed = source, items, params, seed
        self.max_staleness, self.stale_groups = max_staleness, stale_groups
        self.hooks = list(hooks)
        self._ahead: dict[int, _Ahead] = {}
        self._redo: list[Any] = []  # prompts of stale groups to sample again (stale_groups=regenerate)
        self._waited = 0.0  # controller seconds spent starting and awaiting generation (take_waited)

    def next_batch(self, sampler: PromptSampler, it: int, batch: int) -> tuple[list[Group], RolloutStats]:
        """Batch `batch` of iteration `it`: the prefetched one if there is one, else sampled now."""
        t0 = time.perf_counter()
        ahead = self._ahead.pop(it, None) if batch == 0 else None
        if ahead is not None:
            pending = ahead.submitted
        else:
            items = self._redo or [self.items[i] for i in sampler.next_batch()]
            self._redo = []
            pending = self.source.submit(items, self.params, batch_seed(self.seed, it, batch))
        out = pending.result()
        self._waited += time.perf_counter() - t0
        return out

    def prefetch(self, sampler: PromptSampler, it: int, last: int) -> None:
        """After iteration `it` has its groups: submit the first batch of iterations it+1..it+k (<= last).

        On Ray this returns at once; inline, the generation runs here (nothing overlaps in one process)."""
        t0 = time.perf_counter()
        for ahead in range(it + 1, min(it + self.max_staleness, last) + 1):
            if ahead not in self._ahead:
                state = sampler.state_dict()
                items = [self.items[i] for i in sampler.next_batch()]
                seed = batch_seed(self.seed, ahead, 0)
                self._ahead[ahead] = _Ahead(self.source.submit(items, self.params, seed, ahead=True), state)
        self._waited += time.perf_counter() - t0

    def close(self) -> None:
        """Stop the source (waiting for episodes being played ahead)."""
        self.source.close()

    def collect(
        self,
        cfg: RunConfig,
        prompts: PromptSource,
        timeline: Timeline,
        log: ExperienceLog,
        sampler: PromptSampler,
        it: int,
    ) -> tuple[list[Group], dict[str, float]]:
        """Sample, score and shape the groups of one iteration; returns them and the rollout/reward metrics.
        Batches come from `next_batch` (prefetched or fresh) and are scored by the source; groups over the
        staleness bound and, with DAPO dynamic sampling, groups without reward signal are replaced until
        `prompts_per_step` remain; what is left out goes to the experience `log`. ReMax's greedy baselines are
        sampled from the single-turn `prompts`."""
        a = cfg.algorithm
        want = cfg.rollout.prompts_per_step
        kept: list[Group] = []
        metrics: dict[str, float] = {}
        tally = HookTally()  # the group hooks' metrics, over the batches
        batches, dropped, idle = 0, 0, 0.0
        while len(kept) < want:
            if batches >= a.max_sample_batches:
                raise DynamicSamplingError(_too_many_batches(a.max_sample_batches, len(kept), want, dropped))
            with timeline.phase("generate", iteration=it):
                groups, stats = self.next_batch(sampler, it, batches)
            idle += stats.engine_idle_s
            with timeline.phase("reward", iteration=it):
                groups, batch_metrics = self.source.score(groups)
                metrics = _merge(metrics, batch_metrics | stats.metrics, batches)
            shaped = shape_rewards(a, cfg.rollout.max_new_tokens, groups)
            groups, stale = self.split_stale(shaped, trainer_version=it - 1)
            experience.record_left_out(log, it, shaped, groups, "dropped_stale", _stale_reason(cfg.rollout))
            dropped += stale
            if self.hooks:
                groups = self._hooked(groups, log, it, tally)
            if a.advantage.name == "remax":
                groups = with_greedy_baseline(cfg, prompts, groups, it, batches)
            if a.dynamic_sampling:
                before, groups = groups, _groups_with_signal(groups)
                experience.record_left_out(
                    log, it, before, groups, "filtered", "dynamic_sampling: equal rewards"
                )
            kept.extend(groups)
            batches += 1
        metrics |= tally.metrics() | {
            "rollout/sample_batches": float(batches),
            "rollout/dropped_stale": float(dropped),
            "time/engine_idle": idle,
        }
        experience.record_left_out(log, it, kept, kept[:want], "surplus", "prompts_per_step already filled")
        return kept[:want], metrics

    def _hooked(self, groups: list[Group], log: ExperienceLog, it: int, tally: HookTally) -> list[Group]:
        """The groups after the run's group hooks (their metrics go to `tally`); what they dropped goes to
        the experience `log`."""
        out = apply_group_hooks(self.hooks, groups, tally)
        for group, reason in out.dropped:
            experience.record_left_out(log, it, [group], [], "filtered", reason)
        return out.kept

    def take_waited(self) -> float:
        """Seconds the controller (so the trainer) waited on generation since the last call; resets."""
        waited, self._waited = self._waited, 0.0
        return waited

    def sampler_state(self, sampler: PromptSampler, it: int) -> dict[str, Any]:
        """The sampler as a checkpoint after iteration `it` saves it: before any prefetched draw."""
        ahead = self._ahead.get(it + 1)
        return ahead.sampler_state if ahead is not None else sampler.state_dict()

    def split_stale(self, groups: list[Group], trainer_version: int) -> tuple[list[Group], int]:
        """Groups within the bound, and how many episodes were in stale ones (queued again for
        `regenerate`)."""
        fresh, dropped = [], 0
        for group in groups:
            if max(staleness(e, trainer_version) for e in group.episodes) > self.max_staleness:
                dropped += len(group.episodes)
                if self.stale_groups == "regenerate":
                    self._redo.append(item_of(group.episodes[0]))
            else:
                fresh.append(group)
        return fresh, dropped


def _stale_reason(r: RolloutConfig) -> str:
    return f"older than rollout.max_staleness={r.max_staleness} (stale_groups={r.stale_groups})"


def _too_many_batches(limit: int, have: int, want: int, dropped: int) -> str:
    stale = f" ({dropped} episodes were over rollout.max_staleness)" if dropped else ""
    return (
        f"algorithm.max_sample_batches={limit}: after {limit} prompt batches only {have} of "
        f"rollout.prompts_per_step={want} groups were usable{stale}. With algorithm.dynamic_sampling the "
        "task may be too easy or too hard for the policy (groups whose rewards are all equal are replaced): "
        "raise max_sample_batches or rollout.samples_per_prompt, or turn dynamic sampling off (the filters of "
        "reward.group_hooks replace the groups they drop the same way: widen them)."
    )


def with_greedy_baseline(
    cfg: RunConfig, prompts: PromptSource, groups: list[Group], it: int, batch: int
) -> list[Group]:
    """ReMax: the groups, each with the (shaped) reward of one greedy response to its task, sampled with the
    current weights, as its baseline."""
    params = replace(B.sampling_params(cfg.rollout), temperature=0.0, n=1)
    items = [item_of(g.episodes[0]) for g in groups]
    greedy = prompts.generate(items, params, seed=batch_seed(cfg.seed, it, batch))
    greedy = shape_rewards(cfg.algorithm, cfg.rollout.max_new_tokens, prompts.score(greedy)[0])
    return [replace(g, baseline_reward=b.episodes[0].reward) for g, b in zip(groups, greedy, strict=True)]


def _groups_with_signal(groups: list[Group]) -> list[Group]:
    if not groups:
        return groups
    rewards = torch.tensor([e.reward for e in flatten(groups)])
    ids = B.group_ids(groups)
    keep = filter_groups_with_variance(rewards, ids)
    kept_ids = {int(i) for i, k in zip(ids.tolist(), keep.tolist(), strict=True) if k}
    return [g for i, g in enumerate(groups) if i in kept_ids]


def _merge(old: dict[str, float], new: dict[str, float], n_before: int) -> dict[str, float]:
    """Running mean of per-batch metrics over the sample batches of one iteration."""
    return {k: (old.get(k, 0.0) * n_before + v) / (n_before + 1) for k, v in new.items()}


def staleness(t: Episode, trainer_version: int) -> int:
    """Versions between the trainer's weights and the oldest weights that sampled a token of `t`."""
    return trainer_version - min(t.token_versions, default=t.policy_version)


@dataclass(frozen=True)
class _Item:
    """A prompt to sample again: what `submit` and `to_groups` read of a data item."""

    prompt_ids: list[int]
    row_id: int
    metadata: dict[str, Any]


def item_of(t: Episode) -> _Item:
    """The prompt `t` answered, as a data item to sample again (regenerate, ReMax's greedy baseline)."""
    return _Item(list(t.prompt_ids), t.row_id, t.metadata)


def staleness_metrics(episodes: list[Episode], trainer_version: int) -> dict[str, float]:
    """rollout/staleness_mean|max over the episodes an iteration trains on."""
    s = [staleness(t, trainer_version) for t in episodes]
    return {"rollout/staleness_mean": sum(s) / len(s), "rollout/staleness_max": float(max(s))}


def record_episodes(run_dir: str, iteration: int, groups: list[Group], trainer_version: int) -> None:
    """Append one line per trained episode to `episodes.jsonl`: its group (place in the iteration), where it
    came from, the versions its tokens were sampled with, its staleness, reward, finish reason and length
    (no text: see the samples log)."""
    rows = [
        {
            "iteration": iteration,
            "group": g,
            "row_id": t.row_id,
            "version_min": min(t.token_versions, default=t.policy_version),
            "version_max": max(t.token_versions, default=t.policy_version),
            "trainer_version": trainer_version,
            "staleness": staleness(t, trainer_version),
            "reward": t.reward,
            "finish": t.finish_reason,
            "response_len": len(t.response_ids),
        }
        for g, group in enumerate(groups)
        for t in group.episodes
    ]
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    with open(Path(run_dir) / "episodes.jsonl", "a") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)


def trim_after(run_dir: str, iteration: int) -> None:
    """On resume from `iteration`: drop the lines of later iterations from the per-iteration JSONL logs
    (`episodes.jsonl`, `logprob_outliers.jsonl`), which the resumed run writes again."""
    for name in ("episodes.jsonl", "logprob_outliers.jsonl"):
        path = Path(run_dir) / name
        if path.exists():
            keep = [
                line
                for line in path.read_text().splitlines(keepends=True)
                if line.strip() and json.loads(line)["iteration"] <= iteration
            ]
            tmp = path.with_suffix(".jsonl.tmp")
            tmp.write_text("".join(keep))
            tmp.replace(path)
