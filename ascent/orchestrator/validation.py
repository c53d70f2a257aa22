"""Validation: sample the held-out prompts (greedy by default), score them, report reward, accuracy,
length."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ascent.messages import flatten

if TYPE_CHECKING:
    from ascent.orchestrator.run import Run

log = logging.getLogger("ascent")

CORRECT_AT = 1.0 - 1e-6  # a response counts as correct when its reward is at least 1 (the 0/1 built-ins)


def validate(run: Run, iteration: int) -> dict[str, float]:
    """Score the validation set with the current policy; returns `val/*` metrics and logs a few samples."""
    spec, val = run.spec, run.data.val
    groups = run.collector.source.evaluate(val, spec.val_params, spec.seed + 12345)
    trajs = flatten(groups)
    n = len(trajs)
    metrics = {
        "val/reward_mean": sum(t.reward for t in trajs) / n,
        "val/accuracy": sum(t.reward >= CORRECT_AT for t in trajs) / n,
        "val/response_len_mean": sum(len(t.response_ids) for t in trajs) / n,
    }
    for t in trajs[: spec.log_samples]:
        log.info(
            "val sample | prompt %r | response %r | reward %.2f",
            run.decode(t.prompt_ids)[-80:],
            t.response_text[:200],
            t.reward,
        )
    log.info(
        "validation at iteration %d: accuracy %.3f, mean reward %.3f over %d responses",
        iteration,
        metrics["val/accuracy"],
        metrics["val/reward_mean"],
        n,
    )
    return metrics
