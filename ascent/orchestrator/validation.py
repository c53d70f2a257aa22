"""Validation: sample the held-out prompts (greedy by default), score them, report reward, accuracy, length,
pass@k / mean@k for `rollout.val_pass_k`, and the same per `data_source` and environment
(`ascent.orchestrator.eval_metrics`), all under `val/`."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ascent.messages import flatten
from ascent.orchestrator.eval_metrics import CORRECT_AT, episode_sample, eval_metrics

if TYPE_CHECKING:
    from ascent.orchestrator.run import Run

log = logging.getLogger("ascent")

__all__ = ["CORRECT_AT", "validate"]


def validate(run: Run, iteration: int) -> dict[str, float]:
    """Score the validation set with the current policy; returns `val/*` metrics and logs a few samples."""
    spec, val = run.spec, run.data.val
    groups = run.collector.source.evaluate(val, spec.val_params, spec.seed + 12345)
    trajs = flatten(groups)
    n = len(trajs)
    scored = eval_metrics([episode_sample(t, spec.val_env) for t in trajs], spec.val_pass_k)
    metrics = {f"val/{k}": v for k, v in scored.items()}
    metrics["val/response_len_mean"] = sum(len(t.response_ids) for t in trajs) / n
    for t in trajs[: spec.log_samples]:
        log.info(
            "val sample | prompt %r | response %r | reward %.2f",
            run.decode(t.prompt_ids)[-80:],
            t.response_text[:200],
            t.reward,
        )
    log.info(
        "validation at iteration %d: accuracy %.3f, mean reward %.3f over %d responses%s",
        iteration,
        metrics["val/accuracy"],
        metrics["val/reward_mean"],
        n,
        "".join(
            f", pass@{k} {metrics[f'val/pass@{k}']:.3f}"
            for k in spec.val_pass_k
            if f"val/pass@{k}" in metrics
        ),
    )
    return metrics
