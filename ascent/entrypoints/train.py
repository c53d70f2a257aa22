"""`ascent train`: open the run directory, vet a resume, build the data, rewards and workers, run the RL loop.

The loop itself (iterations, validation, checkpoints) is `ascent.orchestrator.loop.run_loop`; this module
owns what lives for the whole run: the run-directory lock, the signal handler, the tracking bus (its sinks,
and RunStarted/RunEnded, so status.json says how the run ended), and the shutdown of the workers and reward
processes however the run ends.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from ascent.config.schema import RunConfig
from ascent.orchestrator import checkpointing, preflight, rundir, setup
from ascent.orchestrator.interrupt import STOPS, graceful_stop
from ascent.orchestrator.loop import run_loop
from ascent.orchestrator.run import build_run, initial_state
from ascent.tracking import RunStarted, Timeline, open_tracking, setup_logging, tracked_run
from ascent.tracking.timeline import TRACE_FILE

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
    setup_logging(str(run_dir), "controller", cfg.tracking.log_level)
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
    config = cfg.model_dump(mode="json")
    resume_step = int(found[1]["iteration"]) if found else 0
    started = RunStarted(str(run_dir), "train", config, cfg.iterations, resume_step=resume_step)
    # status.json says "running" from here, and how the run ended however it ends
    with tracked_run(open_tracking(cfg.tracking, run_dir, config), started, STOPS) as bus:
        return _build_and_run(cfg, run_dir, stop, found, bus)


def _build_and_run(cfg: RunConfig, run_dir: Any, stop: Any, found: Any, bus: Any) -> dict[str, float]:
    rundir.write_config(cfg)
    preflight.model_config(cfg.model.path)
    data = setup.build_datasets(cfg)
    preflight.check_run(cfg, data.tokenizer, data.train)
    # everything built from here is stopped in reverse order, however the run ends (a failed build too): a
    # Python caller that runs several trainings in one process inherits no thread, process or port from it
    with contextlib.ExitStack() as built:
        rewards = setup.build_reward_runner(cfg)
        built.callback(rewards.close)
        rewards.prepare(item.metadata for item in data.train + data.val)
        groups = setup.build_worker_groups(cfg)
        built.callback(groups.shutdown)
        timeline = Timeline(str(run_dir / TRACE_FILE) if cfg.tracking.trace else None)
        run = build_run(cfg, data, rewards, groups, timeline)
        built.callback(run.close)
        built.callback(timeline.flush)  # first: what the run's last spans recorded
        state = initial_state(cfg, data)
        start = checkpointing.restore(run, state, found) if found else 0
        return run_loop(run, state, start, stop, bus)
