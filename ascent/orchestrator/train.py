"""The RL loop: `ascent train` runs `run_training`, which reads top to bottom as one iteration does.

rollout -> rewards -> old/reference logprobs -> advantages -> policy update -> weight publication ->
metrics -> (validation) -> (checkpoint). The controller holds no model tensors; it calls worker groups,
which are inline objects or Ray actors, the loop cannot tell which.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

from ascent.config.schema import RunConfig
from ascent.orchestrator import batch as B
from ascent.orchestrator import checkpointing, preflight, rundir, setup, shaping
from ascent.orchestrator.collector import Collector, record_episodes, staleness_metrics
from ascent.orchestrator.interrupt import graceful_stop, stopped_message
from ascent.orchestrator.validation import validate
from ascent.orchestrator.workers import CriticWorkerActor, RolloutWorker, TrainerWorker

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
    from ascent.tracking import MetricsLogger, Progress, Timeline, setup_logging

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
    final: dict[str, float] = {}
    try:
        start = checkpointing.restore(ctx, sampler, found) if found else 0
        metrics_log = MetricsLogger(
            str(run_dir),
            tensorboard=cfg.tracking.tensorboard,
            wandb_project=cfg.tracking.wandb_project,
            purge_step=start + 1,
        )
        try:
            publish_weights(ctx, version=start)  # the engines start from the trainer's weights
            if start == 0 and data.val:
                metrics_log.log(validate(ctx, iteration=0), step=0)
            stop.arm()  # from here a signal waits for the end of the iteration and its checkpoint
            with Progress(cfg.iterations, enabled=cfg.tracking.progress, start_iteration=start) as progress:
                for it in range(start + 1, cfg.iterations + 1):
                    metrics = run_iteration(ctx, it, sampler)
                    if data.val and (it == cfg.iterations or (cfg.val_every and it % cfg.val_every == 0)):
                        with timeline.phase("validation", iteration=it):
                            final = validate(ctx, iteration=it)
                        metrics.update(final)
                    metrics_log.log(metrics, step=it)
                    progress.update(it, metrics)
                    log.info(progress.summary_line(it, metrics))
                    timeline.flush()
                    _checkpoint_or_stop(ctx, it, sampler, stop)
        finally:
            metrics_log.close()
    finally:
        timeline.flush()
        groups.shutdown()
        rewards.close()
    return final


def _checkpoint_or_stop(ctx: LoopContext, it: int, sampler: Any, stop: Any) -> None:
    """Checkpoint when due (or when a signal asks to stop and `checkpoint.on_interrupt`); then obey the signal."""
    cfg = ctx.cfg
    due = it == cfg.iterations or (cfg.checkpoint.every and it % cfg.checkpoint.every == 0)
    interrupt = stop.requested and it < cfg.iterations
    path = None
    if due or (interrupt and cfg.checkpoint.on_interrupt):
        with ctx.timeline.phase("checkpoint", iteration=it):
            path = checkpointing.save(ctx, it, sampler)
    if interrupt:
        raise stopped_message(stop.signum, "iteration", str(path) if path else None, it, cfg.iterations)


class LoopContext:
    """What one iteration needs: the config, the data, the reward runner, the worker groups, the timeline."""

    def __init__(self, cfg: RunConfig, data: Any, rewards: Any, groups: setup.WorkerGroups, timeline: Any):
        self.cfg, self.data, self.rewards, self.timeline = cfg, data, rewards, timeline
        self.rollout, self.trainer, self.critic = groups.rollout, groups.trainer, groups.critic
        self.transport = groups.transport
        self.decode = lambda ids: data.tokenizer.decode(ids, skip_special_tokens=True)
        self.needs_reference = setup.needs_reference(cfg)
        self.temperature = cfg.rollout.temperature or 1.0
        self.kl_controller = shaping.make_kl_controller(cfg.algorithm)
        self.collector = Collector(cfg.rollout.max_staleness, cfg.rollout.stale_groups)
        # trainer and engine share the accelerator and take turns (design: colocated placement)
        self.colocated = cfg.cluster.placement == "colocated" and cfg.rollout.engine == "fast"


def run_iteration(ctx: LoopContext, it: int, sampler: Any) -> dict[str, float]:
    """One iteration: sample and score, logprobs, advantages, update, publish. Returns its metrics."""
    cfg, tl = ctx.cfg, ctx.timeline
    t0 = time.perf_counter()
    with tl.phase("rollout", iteration=it):
        trajs, collect_metrics = shaping.collect_groups(ctx, sampler, it)
        # async (max_staleness >= 1): the replicas sample the next iterations while this one trains
        ctx.collector.prefetch(ctx, sampler, it, last=cfg.iterations)
    collect_metrics |= staleness_metrics(trajs, trainer_version=it - 1)
    collect_metrics["time/trainer_idle"] = ctx.collector.take_waited()  # generation the trainer waited for
    if cfg.tracking.episodes:
        record_episodes(cfg.run_dir, it, trajs, trainer_version=it - 1)
    width = max(len(t.response_ids) for t in trajs)
    samples = B.train_samples(trajs, torch.zeros(len(trajs), width), None, None)
    reuse = update_gives_old_logprobs(ctx, len(trajs), it)
    if ctx.colocated:
        # the engine is idle until the next publish: free its KV cache and weights before the trainer's
        # logprob passes and update (a full set of weights is published before "wake")
        ctx.rollout.call(RolloutWorker.sleep, release_weights=True)
    with tl.phase("logprobs", iteration=it):
        old_lp = None if reuse else _logprobs(ctx, samples, "policy")
        ref_lp = _logprobs(ctx, samples, "reference") if ctx.needs_reference else None
        values = critic_values(ctx, samples)
    with tl.phase("advantages", iteration=it):
        token_rewards, kl_metrics = shaping.kl_penalty(ctx, trajs, old_lp, ref_lp)
        adv, returns = B.compute_advantages(trajs, cfg.algorithm, token_rewards=token_rewards, values=values)
        samples = B.train_samples(trajs, adv, old_lp, ref_lp, returns=returns, values=values)
        filter_metrics = B.filter_zero_advantage(samples) if cfg.algorithm.filter_zero_advantage else {}
    with tl.phase("update", iteration=it):
        update_metrics = update_policy(ctx, samples, it)
    with tl.phase("publish", iteration=it):
        publish_seconds = publish_weights(ctx, version=it)
        if ctx.colocated:
            ctx.rollout.call(RolloutWorker.wake)
    elapsed = time.perf_counter() - t0
    if old_lp is not None:  # else the update reported the sampler/trainer mismatch from its own logprobs
        diff = B.logprob_diff(old_lp, [t.sampler_logprobs for t in trajs])
        update_metrics |= {"rollout/logprob_diff_mean": diff[0], "rollout/logprob_diff_max": diff[1]}
        B.record_logprob_outliers(ctx.cfg.run_dir, it, trajs, old_lp)
    tokens = sum(t.num_tokens for t in trajs)
    return {
        **collect_metrics,
        **kl_metrics,
        **filter_metrics,
        **update_metrics,
        **rollout_metrics(trajs),
        "train/old_logprob_pass": float(old_lp is not None),
        "time/iteration": elapsed,
        "time/publish": publish_seconds,
        "perf/tokens_per_s": tokens / max(elapsed, 1e-9),
        **{f"time/{k}": v for k, v in tl.last_durations().items()},
    }


def update_gives_old_logprobs(ctx: LoopContext, num_trajectories: int, it: int) -> bool:
    """True when the separate old-logprob forward can be skipped (`train.old_logprobs=auto`).

    That holds when this iteration takes exactly ONE policy optimizer step on its fresh samples (one epoch,
    one mini-batch, the actor trains) and nothing needs the old logprobs before the update (no KL penalty
    in the reward): the update's own logprobs, detached, are then exactly the old logprobs (ratio 1), and
    the trainer reports the sampler/trainer mismatch from them.
    """
    t, a = ctx.cfg.train, ctx.cfg.algorithm
    return (
        t.old_logprobs == "auto"
        and t.epochs_per_rollout == 1
        and num_trajectories <= t.trajectories_per_update
        and it > a.critic_warmup_iterations
        and ctx.kl_controller is None
    )


def critic_values(ctx: LoopContext, samples: list[Any]) -> torch.Tensor | None:
    """The critic's value of every response token, padded [B, T]; None without a critic."""
    if ctx.critic is None:
        return None
    shards = B.shard(samples, ctx.critic.num_workers)
    rows = [v for part in ctx.critic.call_split(CriticWorkerActor.compute_values, shards) for v in part]
    return B.padded(rows, max(1, max(len(r) for r in rows)))


def _logprobs(ctx: LoopContext, samples: list[Any], which: str) -> list[list[float]]:
    shards = B.shard(samples, ctx.trainer.num_workers)
    results = ctx.trainer.call_split(
        TrainerWorker.compute_logprobs, shards, temperature=ctx.temperature, which=which
    )
    return [lp for part in results for lp in part]


def update_policy(ctx: LoopContext, samples: list[Any], it: int) -> dict[str, float]:
    """`epochs_per_rollout` passes of mini-batches of `trajectories_per_update`; one optimizer step each.

    With a critic, each mini-batch also updates the critic; during `critic_warmup_iterations` only the
    critic learns.
    """
    t, a = ctx.cfg.train, ctx.cfg.algorithm
    gen = torch.Generator().manual_seed(ctx.cfg.seed * 7919 + it) if t.shuffle_mini_batches else None
    train_actor = it > a.critic_warmup_iterations
    sums: dict[str, float] = {}
    steps = 0
    for _ in range(t.epochs_per_rollout):
        for idx in B.mini_batches(len(samples), t.trajectories_per_update, gen):
            mb = [samples[i] for i in idx]
            totals = {"total_tokens": float(sum(sum(s.loss_mask) for s in mb)), "total_seqs": float(len(mb))}
            results: list[dict[str, float]] = []
            if ctx.critic is not None:
                results += ctx.critic.call_split(
                    CriticWorkerActor.update, B.shard(mb, ctx.critic.num_workers), **totals
                )
            if train_actor:
                results += ctx.trainer.call_split(
                    TrainerWorker.update, B.shard(mb, ctx.trainer.num_workers), **totals
                )
            for k, v in _mean_dicts(results).items():
                sums[k] = sums.get(k, 0.0) + v
            steps += 1
    return {k: v / max(steps, 1) for k, v in sums.items()} | {
        "train/optimizer_steps": float(steps * train_actor)
    }


def publish_weights(ctx: LoopContext, version: int) -> float:
    """Send the trainer's current weights, as policy `version`, to every rollout replica; returns the seconds
    it took. Each replica applies them after the generate calls queued before (none are lost) and reports the
    version it then holds. Inline the replicas copy the trainer's tensors; on Ray they travel trainer ->
    replica over the run's weight transport (ascent.transport.weights) or, as the fallback, from trainer
    rank 0 through the object store. The controller never holds them."""
    t0 = time.perf_counter()
    if ctx.transport in ("broadcast", "cuda_ipc"):
        receivers = ctx.rollout.call_async(RolloutWorker.receive_weights, version)
        senders = ctx.trainer.call_async(TrainerWorker.send_weights, version)
        try:
            held = receivers.get()
        finally:
            senders.get()  # the trainer's own error, when it failed first
    else:
        pending = ctx.trainer.call_async(TrainerWorker.named_weights, to_cpu=ctx.transport != "inline")
        try:  # rank 0's weights go to the replicas directly (on Ray the controller never holds them)
            held = ctx.rollout.call(RolloutWorker.update_weights, pending.forward(0), version)
        except Exception:
            pending.get()  # the trainer's own error, when it failed first
            raise
        pending.others(0)  # the other ranks took part in the gather (FSDP); their errors surface here
    if any(v != version for v in held):
        raise RuntimeError(f"weight publication of version {version}: the rollout replicas report {held}.")
    return time.perf_counter() - t0


def rollout_metrics(trajs: list[Any]) -> dict[str, float]:
    lengths = torch.tensor([len(t.response_ids) for t in trajs], dtype=torch.float32)
    truncated = sum(t.finish_reason == "length" for t in trajs)
    return {
        "rollout/response_len_mean": lengths.mean().item(),
        "rollout/response_len_max": lengths.max().item(),
        "rollout/truncated_frac": truncated / len(trajs),
        "rollout/trajectories": float(len(trajs)),
    }


def _mean_dicts(dicts: list[dict[str, float]]) -> dict[str, float]:
    """Mean of each key over the dicts that report it (policy and critic workers report different keys)."""
    keys = {k for d in dicts for k in d}
    return {k: sum(d[k] for d in dicts if k in d) / sum(k in d for d in dicts) for k in keys}
