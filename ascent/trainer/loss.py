"""The loss of one packed micro-batch, and the metric sums that the update averages over micro-batches.

`micro_batch_loss` glues the pure math of `ascent.algorithms` to the packed layout:

    per_token = POLICY_LOSSES[policy_loss](logprobs, old, advantages, mask, seq_ids, **loss_opts)
    per_token *= rollout_correction_weights(old, sampler, ...)        (when rollout_correction is set)
    loss = agg(per_token) + kl_loss_coef * agg(KL(logprobs, ref)) - entropy_coef * agg(entropy)

with `agg = LOSS_AGGREGATIONS[loss_aggregation]` using the MINI-BATCH totals, so the returned loss is this
micro-batch's share: summing shares (micro-batches x workers) gives the mini-batch loss and its gradient.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast

import torch
from torch import Tensor

from ascent.algorithms import KL_ESTIMATORS, LOSS_AGGREGATIONS, POLICY_LOSSES
from ascent.algorithms.correction import rollout_correction_weights
from ascent.messages import TrainSample
from ascent.plugins import resolve
from ascent.trainer.packing import PackedBatch


@dataclass(frozen=True)
class LossSettings:
    """Flat loss options (built from AlgorithmConfig by `ascent.orchestrator.specs.loss_settings`).

    `loss_opts` go to the policy loss (clip_ratio_low/high, dual_clip_c, plug-in options). `max_len` is the
    Dr. GRPO length divisor (None: the longest response of the mini-batch). `rollout_correction` is None,
    "tis" or "mis"; `correction_opts` are its level/threshold/threshold_low.
    """

    policy_loss: str = "ppo"
    loss_aggregation: str = "token-mean"
    loss_opts: dict[str, Any] = field(default_factory=dict)
    kl_loss_coef: float = 0.0
    kl_estimator: str = "k3"
    entropy_coef: float = 0.0
    max_len: int | None = None
    rollout_correction: str | None = None
    correction_opts: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        resolve(POLICY_LOSSES, self.policy_loss, "algorithm.policy_loss")
        resolve(LOSS_AGGREGATIONS, self.loss_aggregation, "algorithm.loss_aggregation")
        if self.kl_loss_coef > 0:
            resolve(KL_ESTIMATORS, self.kl_estimator, "algorithm.kl_estimator")
        if self.rollout_correction not in (None, "tis", "mis"):
            raise ValueError(
                f"algorithm.options.rollout_correction={self.rollout_correction!r}: use tis, mis or none."
            )


class MetricSums:
    """Accumulates metric numerators and denominators as tensors; `result()` divides once at the end.

    Kinds: "sum" (add up), "mean" (sum of values / sum of weights), "max". Keeping everything as tensors
    avoids a device sync per micro-batch and lets workers all-reduce one vector (`reduce`).
    """

    def __init__(self) -> None:
        self.sums: dict[str, Tensor] = {}
        self.weights: dict[str, Tensor] = {}
        self.maxes: dict[str, Tensor] = {}

    def add(self, key: str, value: Tensor, weight: Tensor | float | None = None) -> None:
        value = value.detach().float().reshape(())
        self.sums[key] = self.sums.get(key, 0.0) + value
        if weight is not None:
            self.weights[key] = self.weights.get(key, 0.0) + torch.as_tensor(weight, dtype=torch.float32)

    def add_max(self, key: str, value: Tensor) -> None:
        value = value.detach().float().reshape(())
        self.maxes[key] = torch.maximum(self.maxes[key], value) if key in self.maxes else value

    def reduce(
        self, all_reduce_sum: Callable[[Tensor], Tensor], all_reduce_max: Callable[[Tensor], Tensor]
    ) -> None:
        """Combine with the other workers in place (two collectives, fixed key order)."""
        keys = sorted(self.sums)
        wkeys = sorted(self.weights)
        if keys:
            device = self.sums[keys[0]].device
            parts = [self.sums[k] for k in keys] + [self.weights[k] for k in wkeys]
            flat = all_reduce_sum(torch.stack([t.to(device) for t in parts]))
            self.sums = dict(zip(keys, flat[: len(keys)], strict=True))
            self.weights = dict(zip(wkeys, flat[len(keys) :], strict=True))
        mkeys = sorted(self.maxes)
        if mkeys:
            self.maxes = dict(
                zip(mkeys, all_reduce_max(torch.stack([self.maxes[k] for k in mkeys])), strict=True)
            )

    def result(self) -> dict[str, float]:
        out = {
            k: float(v / self.weights[k].clamp(min=1e-12)) if k in self.weights else float(v)
            for k, v in self.sums.items()
        }
        out.update({k: float(v) for k, v in self.maxes.items()})
        return out


def micro_batch_loss(
    logprobs: Tensor,
    entropy: Tensor | None,
    packed: PackedBatch,
    settings: LossSettings,
    *,
    total_tokens: float,
    total_seqs: float,
    max_len: float,
    metrics: MetricSums,
) -> Tensor:
    """logprobs [M] (with grad), entropy [M] | None -> this micro-batch's scalar share of the mini-batch loss.

    Missing `old_logprobs` means on-policy data: old = logprobs.detach() (ratio 1). Adds to `metrics`.
    """
    mask, seq_ids = packed.loss_mask, packed.seq_ids
    old = packed.old_logprobs if packed.old_logprobs is not None else logprobs.detach()
    if packed.old_logprobs is None and packed.sampler_logprobs is not None:
        _sampler_mismatch(old, packed.sampler_logprobs, mask, metrics)
    policy_fn = resolve(POLICY_LOSSES, settings.policy_loss, "algorithm.policy_loss")
    per_token, loss_metrics = policy_fn(logprobs, old, packed.advantages, mask, seq_ids, **settings.loss_opts)
    if settings.rollout_correction:
        per_token = per_token * _correction(old, packed, settings, metrics)
    agg_fn = resolve(LOSS_AGGREGATIONS, settings.loss_aggregation, "algorithm.loss_aggregation")

    def agg(x: Tensor) -> Tensor:
        return agg_fn(x, mask, seq_ids, total_tokens=total_tokens, total_seqs=total_seqs, max_len=max_len)

    count = mask.sum()
    policy_share = agg(per_token)
    loss = policy_share
    metrics.add("loss/policy", policy_share)
    for name, per_tok in loss_metrics.items():
        metrics.add(name, (per_tok.detach() * mask).sum(), count)
    if settings.kl_loss_coef > 0:
        loss = loss + settings.kl_loss_coef * _kl_share(logprobs, packed, settings, agg, metrics)
    if entropy is not None:
        metrics.add("entropy", (entropy.detach() * mask).sum(), count)
        if settings.entropy_coef != 0:
            loss = loss - settings.entropy_coef * agg(entropy)
    metrics.add("loss/total", loss)
    return loss


def _sampler_mismatch(trainer: Tensor, sampler: Tensor, mask: Tensor, metrics: MetricSums) -> None:
    """trainer, sampler, mask [M] -> `rollout/logprob_diff_mean|max` over the sampled tokens (loss mask 1;
    an observation token has no sampler logprob). On-policy updates report the sampler/trainer mismatch here
    when no separate old-logprob pass ran."""
    sampled = mask.bool()  # masked, not indexed: boolean indexing would wait for the GPU every micro-batch
    diff = (trainer.detach() - sampler).abs().masked_fill(~sampled, 0.0)
    metrics.add("rollout/logprob_diff_mean", diff.sum(), sampled.sum())
    metrics.add_max("rollout/logprob_diff_max", diff.max())


def _kl_share(
    logprobs: Tensor,
    packed: PackedBatch,
    settings: LossSettings,
    agg: Callable[[Tensor], Tensor],
    metrics: MetricSums,
) -> Tensor:
    if packed.ref_logprobs is None:
        raise ValueError(
            f"algorithm.kl_loss_coef={settings.kl_loss_coef}: the KL loss needs ref_logprobs on every "
            "TrainSample (compute them with PolicyWorker.compute_logprobs(..., which='reference'))."
        )
    kl_fn = resolve(KL_ESTIMATORS, settings.kl_estimator, "algorithm.kl_estimator")
    kl_share = agg(kl_fn(logprobs, packed.ref_logprobs))
    metrics.add("loss/kl", kl_share)
    return kl_share


def _correction(old: Tensor, packed: PackedBatch, settings: LossSettings, metrics: MetricSums) -> Tensor:
    if packed.sampler_logprobs is None:
        raise ValueError(
            f"algorithm.options.rollout_correction={settings.rollout_correction!r} needs sampler_logprobs on "
            "every TrainSample; keep the rollout engine's logprobs or set rollout_correction to none."
        )
    weights, corr = rollout_correction_weights(
        old,
        packed.sampler_logprobs,
        packed.loss_mask,
        packed.seq_ids,
        # set (the caller checks) and "tis" or "mis" (checked in LossSettings.__post_init__)
        mode=cast(Literal["tis", "mis"], settings.rollout_correction),
        **settings.correction_opts,
    )
    count = packed.loss_mask.sum()
    for name, value in corr.items():
        if name.endswith("_max"):
            metrics.add_max(name, value)
        else:
            metrics.add(name, value * count, count)
    return weights


def minibatch_totals(samples: Sequence[TrainSample]) -> tuple[float, float]:
    """(loss-mask tokens, sequences) of a mini-batch: the `total_tokens` / `total_seqs` of `update`.

    With several workers, sum these over all workers' shards before calling `update` on each.
    """
    return float(sum(sum(s.loss_mask) for s in samples)), float(len(samples))
