"""Collecting an iteration's groups and shaping their rewards: the DAPO and KL-penalty steps of the loop.

`collect_groups` samples prompts until `prompts_per_step` usable groups exist (with DAPO dynamic sampling,
groups whose rewards are all equal carry no signal and are replaced), scores them, applies the overlong
penalty and truncation masking, and for ReMax scores a greedy baseline per prompt. Each step takes groups and
returns new ones; a group's identity is its place in the list `collect_groups` returns. The groups a step
leaves out (stale, without reward signal, surplus) go to the experience store (`experience.record_left_out`).
`kl_penalty` turns reference logprobs into per-token rewards with a fixed or adaptive coefficient.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from ascent.algorithms import AdaptiveKLController, FixedKLController, kl_penalty_rewards
from ascent.algorithms.dapo import filter_groups_with_variance, overlong_penalty
from ascent.config.rollout import RolloutConfig
from ascent.config.schema import AlgorithmConfig, RunConfig
from ascent.data.sampler import PromptSampler
from ascent.errors import AscentError
from ascent.messages import Episode, Group, flatten, regroup
from ascent.orchestrator import batch as B
from ascent.orchestrator import experience
from ascent.orchestrator.collector import Collector, batch_seed, item_of
from ascent.orchestrator.experience import ExperienceLog
from ascent.orchestrator.sources import PromptSource
from ascent.tracking import Timeline


class DynamicSamplingError(AscentError):
    """Dynamic sampling could not fill the batch within `algorithm.max_sample_batches`."""


def collect_groups(
    cfg: RunConfig,
    collector: Collector,
    prompts: PromptSource,
    timeline: Timeline,
    log: ExperienceLog,
    sampler: PromptSampler,
    it: int,
) -> tuple[list[Group], dict[str, float]]:
    """Sample, score and shape the groups of one iteration; returns them and the rollout/reward metrics.
    Batches come from the `collector` (prefetched or fresh) and are scored by its source; groups over the
    staleness bound and, with DAPO dynamic sampling, groups without reward signal are replaced until
    `prompts_per_step` remain; what is left out goes to the experience `log`. ReMax's greedy baselines are
    sampled from the single-turn `prompts`."""
    a = cfg.algorithm
    want = cfg.rollout.prompts_per_step
    kept: list[Group] = []
    metrics: dict[str, float] = {}
    batches, dropped, idle = 0, 0, 0.0
    while len(kept) < want:
        if batches >= a.max_sample_batches:
            raise DynamicSamplingError(_too_many_batches(a.max_sample_batches, len(kept), want, dropped))
        with timeline.phase("generate", iteration=it):
            groups, stats = collector.next_batch(sampler, it, batches)
        idle += stats.engine_idle_s
        with timeline.phase("reward", iteration=it):
            groups, batch_metrics = collector.source.score(groups)
            metrics = _merge(metrics, batch_metrics | stats.metrics, batches)
        shaped = shape_rewards(a, cfg.rollout.max_new_tokens, groups)
        groups, stale = collector.split_stale(shaped, trainer_version=it - 1)
        experience.record_left_out(log, it, shaped, groups, "dropped_stale", _stale_reason(cfg.rollout))
        dropped += stale
        if a.advantage.name == "remax":
            groups = with_greedy_baseline(cfg, prompts, groups, it, batches)
        if a.dynamic_sampling:
            before, groups = groups, _groups_with_signal(groups)
            experience.record_left_out(log, it, before, groups, "filtered", "dynamic_sampling: equal rewards")
        kept.extend(groups)
        batches += 1
    metrics |= {"rollout/sample_batches": float(batches), "rollout/dropped_stale": float(dropped),
                "time/engine_idle": idle}  # fmt: skip
    experience.record_left_out(log, it, kept, kept[:want], "surplus", "prompts_per_step already filled")
    return kept[:want], metrics


def _stale_reason(r: RolloutConfig) -> str:
    return f"older than rollout.max_staleness={r.max_staleness} (stale_groups={r.stale_groups})"


def _too_many_batches(limit: int, have: int, want: int, dropped: int) -> str:
    stale = f" ({dropped} episodes were over rollout.max_staleness)" if dropped else ""
    return (
        f"algorithm.max_sample_batches={limit}: after {limit} prompt batches only {have} of "
        f"rollout.prompts_per_step={want} groups were usable{stale}. With algorithm.dynamic_sampling the "
        "task may be too easy or too hard for the policy (groups whose rewards are all equal are replaced): "
        "raise max_sample_batches or rollout.samples_per_prompt, or turn dynamic sampling off."
    )


def shape_rewards(a: AlgorithmConfig, max_new: int, groups: list[Group]) -> list[Group]:
    """The groups after DAPO's overlong penalty (added to the reward) and truncation masking (loss mask
    zeroed on responses cut at `max_new` tokens, `rollout.max_new_tokens`)."""
    episodes = flatten(groups)
    if a.overlong_buffer > 0:
        lengths = torch.tensor([len(e.response_ids) for e in episodes])
        penalty = overlong_penalty(lengths, max_new, a.overlong_buffer, a.overlong_penalty).tolist()
        episodes = [replace(e, reward=e.reward + p, reward_components=e.reward_components | {"overlong_penalty": p})
                    for e, p in zip(episodes, penalty, strict=True)]  # fmt: skip
    if a.mask_truncated:
        episodes = [replace(e, loss_mask=[0] * len(e.response_ids)) if e.finish_reason == "length" else e
                    for e in episodes]  # fmt: skip
    return regroup(groups, episodes)


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
