"""`ascent train`: open the run directory, vet a resume, build the data, rewards and workers, run the RL loop.

The loop itself (iterations, validation, checkpoints) is `ascent.orchestrator.loop.run_loop`; this module
owns what lives for the whole run: the run-directory lock, the signal handler, the metrics sinks, and the
shutdown of the workers and reward processes however the run ends.
"""

from __future__ import annotations

import logging
from typing import Any

from ascent.config.schema import RunConfig
from ascent.orchestrator import checkpointing, preflight, rundir, setup
from ascent.orchestrator.interrupt import graceful_stop
from ascent.orchestrator.loop import LoopContext, run_loop

log = logging.getLogger("ascent")


def run_training(
    cfg: RunConfig, resume_from: str | None = None, accept_changes: bool = False
) -> dict[str, float]:
    """Train the policy per `cfg`; returns the final validation metrics (empty without a val set).

    `resume_from` (a checkpoint name or path) and `accept_changes` refine `cfg.resume` (see resume.py).
    """
    run_dir, lock = rundir.open_run_dir(cfg)
    try:
        with graceful_stop() as stop:
            return _train(cfg, run_dir, stop, resume_from, accept_changes)
    finally:
        lock.release()


def _train(
    cfg: RunConfig, run_dir: Any, stop: Any, resume_from: str | None, accept_changes: bool
) -> dict[str, float]:
    from ascent.data import PromptSampler
    from ascent.tracking import MetricsLogger, Timeline, setup_logging

    setup_logging(str(run_dir), "controller")
    # a damaged checkpoint, a changed config or a lower iteration count is refused before anything heavy loads
    found = (
        checkpointing.resume_state(
            cfg, cfg.iterations, f"iterations={cfg.iterations}", resume_from, accept_changes
        )
        if cfg.resume
        else None
    )
    if found and int(found[1]["iteration"]) == cfg.iterations:
        log.warning(
            "the run in %s already finished all %d iterations; nothing to do", run_dir, cfg.iterations
        )
        return {}
    rundir.write_config(cfg)
    preflight.model_config(cfg.model.path)
    data = setup.build_datasets(cfg)
    preflight.check_run(cfg, data.tokenizer, data.train)
    rewards = setup.build_reward_runner(cfg)
    rewards.prepare(item.metadata for item in data.train + data.val)
    groups = setup.build_worker_groups(cfg)
    sampler = PromptSampler(
        len(data.train), cfg.rollout.prompts_per_step, seed=cfg.seed, shuffle=cfg.data.shuffle
    )
    timeline = Timeline(str(run_dir / "trace.json") if cfg.tracking.trace else None)
    ctx = LoopContext(cfg, data, rewards, groups, timeline)
    try:
        start = checkpointing.restore(ctx, sampler, found) if found else 0
        metrics_log = MetricsLogger(
            str(run_dir),
            tensorboard=cfg.tracking.tensorboard,
            wandb_project=cfg.tracking.wandb_project,
            purge_step=start + 1,
        )
        try:
            return run_loop(ctx, sampler, start, stop, metrics_log)
        finally:
            metrics_log.close()
    finally:
        timeline.flush()
        ctx.close()
        groups.shutdown()
        rewards.close()
