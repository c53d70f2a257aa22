"""Collecting an iteration's groups and shaping their rewards: the DAPO and KL-penalty steps of the loop.

`collect_groups` samples prompts until `prompts_per_step` usable groups exist (with DAPO dynamic sampling,
groups whose rewards are all equal carry no signal and are replaced), scores them, applies the overlong
penalty and truncation masking, and for ReMax scores a greedy baseline per prompt. `kl_penalty` turns
reference logprobs into per-token rewards with a fixed or adaptive coefficient.
"""

from __future__ import annotations

from typing import Any

import torch

from ascent.algorithms import AdaptiveKLController, FixedKLController, kl_penalty_rewards
from ascent.algorithms.dapo import filter_groups_with_variance, overlong_penalty
from ascent.errors import AscentError
from ascent.orchestrator import batch as B
from ascent.orchestrator.sampling import generate, score


class DynamicSamplingError(AscentError):
    """Dynamic sampling could not fill the batch within `algorithm.max_sample_batches`."""


def collect_groups(ctx: Any, sampler: Any, it: int) -> tuple[list[Any], dict[str, float]]:
    """Sample, score and shape the trajectories of one iteration; returns them and rollout/reward metrics."""
    cfg, a = ctx.cfg, ctx.cfg.algorithm
    want = cfg.rollout.prompts_per_step
    kept: list[list[Any]] = []
    metrics: dict[str, float] = {}
    batches = 0
    while len(kept) < want:
        if batches >= a.max_sample_batches:
            raise DynamicSamplingError(
                f"algorithm.dynamic_sampling: after algorithm.max_sample_batches={a.max_sample_batches} batches "
                f"only {len(kept)} of rollout.prompts_per_step={want} prompts had rewards that differ within "
                "their group; the task is too easy or too hard for the policy. Raise max_sample_batches, "
                "raise rollout.samples_per_prompt, or turn dynamic sampling off."
            )
        items = [ctx.data.train[i] for i in sampler.next_batch()]
        seed = cfg.seed * 1_000_003 + it * 10_007 + batches * 101
        with ctx.timeline.phase("generate", iteration=it):
            trajs = generate(ctx, items, B.sampling_params(cfg.rollout), seed=seed, version=it - 1)
        with ctx.timeline.phase("reward", iteration=it):
            metrics = _merge(metrics, score(ctx, trajs), batches)
        shape_rewards(ctx, trajs)
        if a.advantage == "remax":
            attach_greedy_baseline(ctx, items, trajs, seed)
        groups = _groups(trajs)
        if a.dynamic_sampling:
            groups = _groups_with_signal(groups)
        kept.extend(groups)
        batches += 1
    trajs = [t for g in kept[:want] for t in g]
    for new_id, t in enumerate(trajs):
        t.group_id = new_id // cfg.rollout.samples_per_prompt
    metrics["rollout/sample_batches"] = float(batches)
    return trajs, metrics


def shape_rewards(ctx: Any, trajs: list[Any]) -> None:
    """DAPO overlong penalty (added to the reward) and truncation masking (loss mask zeroed), in place."""
    a, max_new = ctx.cfg.algorithm, ctx.cfg.rollout.max_new_tokens
    if a.overlong_buffer > 0:
        lengths = torch.tensor([len(t.response_ids) for t in trajs])
        penalty = overlong_penalty(lengths, max_new, a.overlong_buffer, a.overlong_penalty)
        for t, p in zip(trajs, penalty.tolist(), strict=True):
            t.reward += p
            t.reward_components["overlong_penalty"] = p
    if a.mask_truncated:
        for t in trajs:
            if t.finish_reason == "length":
                t.loss_mask = [0] * len(t.response_ids)


def attach_greedy_baseline(ctx: Any, items: list[Any], trajs: list[Any], seed: int) -> None:
    """ReMax: score one greedy response per prompt and store it as each trajectory's baseline reward."""
    from dataclasses import replace

    params = replace(B.sampling_params(ctx.cfg.rollout), temperature=0.0, n=1)
    greedy = generate(ctx, items, params, seed=seed, version=-1)
    score(ctx, greedy)
    shape_rewards(ctx, greedy)
    baseline = {g.group_id: g.reward for g in greedy}
    for t in trajs:
        t.baseline_reward = baseline[t.group_id]


def _groups(trajs: list[Any]) -> list[list[Any]]:
    groups: dict[int, list[Any]] = {}
    for t in trajs:
        groups.setdefault(t.group_id, []).append(t)
    return list(groups.values())


def _groups_with_signal(groups: list[list[Any]]) -> list[list[Any]]:
    flat = [t for g in groups for t in g]
    rewards = torch.tensor([t.reward for t in flat])
    ids = torch.tensor([t.group_id for t in flat])
    keep = filter_groups_with_variance(rewards, ids)
    kept_ids = {int(i) for i, k in zip(ids.tolist(), keep.tolist(), strict=True) if k}
    return [g for g in groups if g[0].group_id in kept_ids]


def _merge(old: dict[str, float], new: dict[str, float], n_before: int) -> dict[str, float]:
    """Running mean of per-batch metrics over the sample batches of one iteration."""
    return {k: (old.get(k, 0.0) * n_before + v) / (n_before + 1) for k, v in new.items()}


def make_kl_controller(algo_cfg: Any) -> FixedKLController | AdaptiveKLController | None:
    if algo_cfg.kl_penalty_coef <= 0:
        return None
    if algo_cfg.kl_target is None:
        return FixedKLController(algo_cfg.kl_penalty_coef)
    return AdaptiveKLController(algo_cfg.kl_penalty_coef, algo_cfg.kl_target, algo_cfg.kl_horizon)


def kl_penalty(
    ctx: Any, trajs: list[Any], old_lp: list[list[float]] | None, ref_lp: list[list[float]] | None
) -> tuple[torch.Tensor | None, dict[str, float]]:
    """Per-token KL-penalty rewards [B, T] (None when off) and the KL metrics; updates the controller."""
    if ctx.kl_controller is None or ref_lp is None:
        return None, {}
    assert old_lp is not None  # run_iteration computes them whenever a KL penalty is on
    width = max(1, max(len(t.response_ids) for t in trajs))
    lp, ref = B.padded(old_lp, width), B.padded(ref_lp, width)
    mask = B.padded([t.loss_mask for t in trajs], width)
    coef = ctx.kl_controller.coef
    token_rewards = kl_penalty_rewards(lp, ref, mask, coef, ctx.cfg.algorithm.kl_penalty_estimator)
    kl = ((lp - ref) * mask).sum() / mask.sum().clamp(min=1)
    ctx.kl_controller.update(kl.item(), len(trajs))
    return token_rewards, {"kl/penalty_coef": coef, "kl/policy_vs_ref": kl.item()}
