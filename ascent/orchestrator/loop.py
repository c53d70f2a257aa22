"""The RL loop: `run_loop` runs the iterations (then validation and checkpoints); `run_iteration` reads top
to bottom as one iteration does.

rollout -> rewards -> old/reference logprobs -> advantages -> policy update -> weight publication ->
metrics -> (validation) -> (checkpoint). The controller holds no model tensors; it calls worker groups,
which are inline objects or Ray actors, the loop cannot tell which. `ascent train`
(`ascent.entrypoints.train`) builds what the loop needs and calls `run_loop`.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

from ascent.config.schema import RunConfig
from ascent.messages import Episode, TrainSample, flatten
from ascent.orchestrator import batch as B
from ascent.orchestrator import checkpointing, experience, health, setup, shaping
from ascent.orchestrator.collector import Collector, record_episodes, staleness_metrics
from ascent.orchestrator.episodes import EnvRunners
from ascent.orchestrator.interrupt import stopped_message
from ascent.orchestrator.validation import validate
from ascent.orchestrator.workers import CriticWorkerActor, RolloutWorker, TrainerWorker

log = logging.getLogger("ascent")


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
        self.experience: Any = None  # the experience store's writer while `run_loop` records (experience.py)
        self.agents: Any = (
            None  # rollout.agent's endpoint and agent processes, started on first use (agents.py)
        )
        self.envs = EnvRunners(cfg)  # where rollout.env's environments run (Ray actors: started on first use)
        self.equal_rewards = health.EqualRewardWatch()  # warns once when nothing is learned for a while
        self.divergence = health.DivergenceCheck(cfg, len(data.tokenizer))
        # trainer and engine share the accelerator and take turns (design: colocated placement; with
        # cluster.engine_sleeps=false the engine stays awake and, on Ray, generates alongside the update)
        self.colocated = (cfg.cluster.placement == "colocated" and cfg.rollout.engine == "fast"
                          and cfg.cluster.engine_sleeps)  # fmt: skip
        # publications reach the replicas between two decode steps of a running generate call
        self.swap_mid_generation = setup.swaps_mid_generation(cfg)

    def close(self) -> None:
        """Stop what the loop started on demand (episodes played ahead, the agent endpoint and processes, the
        environment actors)."""
        self.collector.close()
        if self.agents is not None:
            self.agents.close()
            self.agents = None
        self.envs.close()


def run_loop(ctx: LoopContext, sampler: Any, start: int, stop: Any, bus: Any) -> dict[str, float]:
    """Iterations `start + 1 .. cfg.iterations`, each followed by its validation (when due), metrics (one
    `Metrics` event on the tracking `bus`), progress line and checkpoint (when due, or when a signal asks to
    stop); returns the last validation metrics."""
    from ascent.tracking import Metrics, Progress

    cfg, data, timeline = ctx.cfg, ctx.data, ctx.timeline
    final: dict[str, float] = {}
    publish_weights(ctx, version=start)  # the engines start from the trainer's weights
    if start == 0 and data.val:
        bus.publish(Metrics.of(0, validate(ctx, iteration=0)))
    stop.arm()  # from here a signal waits for the end of the iteration and its checkpoint
    with (
        experience.recording(ctx, start),
        Progress(cfg.iterations, enabled=cfg.tracking.progress, start_iteration=start) as progress,
    ):
        for it in range(start + 1, cfg.iterations + 1):
            metrics = run_iteration(ctx, it, sampler)
            _stop_if_diverged(ctx, it, metrics, bus)
            if data.val and (it == cfg.iterations or (cfg.val_every and it % cfg.val_every == 0)):
                with timeline.phase("validation", iteration=it):
                    final = validate(ctx, iteration=it)
                metrics.update(final)
            bus.publish(Metrics.of(it, metrics))
            progress.update(it, metrics)  # the summary line: the log file every iteration, the console paced
            timeline.flush()
            _checkpoint_or_stop(ctx, it, sampler, stop)
    return final


def _stop_if_diverged(ctx: LoopContext, it: int, metrics: dict[str, float], bus: Any) -> None:
    """After the update, before validation and the checkpoint: a diverged run logs this iteration's metrics
    and stops (`health.TrainingDiverged`, exit status 2), leaving the checkpoints saved before it intact."""
    from ascent.tracking import Metrics

    found = ctx.divergence.diverged(metrics)
    if found is not None:
        bus.publish(Metrics.of(it, metrics))
        raise health.TrainingDiverged(health.divergence_message(ctx.cfg, it, *found))


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


def run_iteration(ctx: LoopContext, it: int, sampler: Any) -> dict[str, float]:
    """One iteration: sample and score, logprobs, advantages, update, publish. Returns its metrics."""
    cfg, tl = ctx.cfg, ctx.timeline
    t0 = time.perf_counter()
    with tl.phase("rollout", iteration=it):
        groups, collect_metrics = shaping.collect_groups(ctx, sampler, it)
        # async (max_staleness >= 1): the replicas sample the next iterations while this one trains
        ctx.collector.prefetch(ctx, sampler, it, last=cfg.iterations)
    episodes = flatten(groups)
    collect_metrics |= staleness_metrics(episodes, trainer_version=it - 1)
    truncated = sum(e.finish_reason == "length" for e in episodes) / len(episodes)
    if warning := ctx.equal_rewards.observe(groups, it, cfg, truncated):
        log.warning(warning)
    collect_metrics["time/trainer_idle"] = ctx.collector.take_waited()  # generation the trainer waited for
    if cfg.tracking.episodes:
        record_episodes(cfg.run_dir, it, groups, trainer_version=it - 1)
    samples = B.train_samples(episodes)
    reuse = update_gives_old_logprobs(ctx, len(episodes), it)
    if ctx.colocated:
        # the engine is idle until the next publish: free its KV cache and weights before the trainer's
        # logprob passes and update (a full set of weights is published before "wake")
        ctx.rollout.call(RolloutWorker.sleep, release_weights=True)
    with tl.phase("logprobs", iteration=it):
        old_lp = None if reuse else _logprobs(ctx, samples, "policy")
        ref_lp = _logprobs(ctx, samples, "reference") if ctx.needs_reference else None
        values = critic_values(ctx, samples)
    with tl.phase("advantages", iteration=it):
        token_rewards, kl_metrics = shaping.kl_penalty(ctx, episodes, old_lp, ref_lp)
        adv, returns = B.compute_advantages(groups, cfg.algorithm, token_rewards=token_rewards, values=values)
        samples = B.with_targets(samples, adv, old_lp, ref_lp, returns=returns, values=values)
        filter_metrics: dict[str, float] = {}
        if cfg.algorithm.filter_zero_advantage:
            samples, filter_metrics = B.filter_zero_advantage(samples)
        experience.record_trained(ctx, it, groups, samples)  # queued: written on the store's thread
    with tl.phase("update", iteration=it):
        update_metrics = update_policy(ctx, samples, it)
    with tl.phase("publish", iteration=it):
        publish_seconds = publish_weights(ctx, version=it)
        if ctx.colocated:
            released = release_trainer_memory(ctx)
            ctx.rollout.call(RolloutWorker.wake)
    elapsed = time.perf_counter() - t0
    if old_lp is not None:  # else the update reported the sampler/trainer mismatch from its own logprobs
        diff = B.logprob_diff(old_lp, [t.sampler_logprobs for t in episodes], [t.loss_mask for t in episodes])
        update_metrics |= {"rollout/logprob_diff_mean": diff[0], "rollout/logprob_diff_max": diff[1]}
        B.record_logprob_outliers(ctx.cfg.run_dir, it, episodes, old_lp)
    tokens = sum(t.num_tokens for t in episodes)
    return {
        **collect_metrics,
        **kl_metrics,
        **filter_metrics,
        **update_metrics,
        **rollout_metrics(episodes),
        "train/old_logprob_pass": float(old_lp is not None),
        "time/iteration": elapsed,
        "time/weight_transfer": publish_seconds,  # the publication alone; time/publish is its phase (+ wake)
        **({"memory/trainer_released_gib": released / 2**30} if ctx.colocated else {}),
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


def release_trainer_memory(ctx: LoopContext) -> int:
    """Colocated in separate processes (any transport but inline, i.e. Ray): the trainer's and critic's ranks
    give their cached GPU blocks back before the engine wakes on the same GPUs; the bytes over all ranks."""
    if ctx.transport == "inline":
        return 0
    released = sum(ctx.trainer.call(TrainerWorker.release_cached_memory))
    if ctx.critic is not None:
        released += sum(ctx.critic.call(CriticWorkerActor.release_cached_memory))
    return released


def critic_values(ctx: LoopContext, samples: list[TrainSample]) -> torch.Tensor | None:
    """The critic's value of every response token, padded [B, T]; None without a critic."""
    if ctx.critic is None:
        return None
    shards = B.shard(samples, ctx.critic.num_workers)
    rows = [v for part in ctx.critic.call_split(CriticWorkerActor.compute_values, shards) for v in part]
    return B.padded(rows, max(1, max(len(r) for r in rows)))


def _logprobs(ctx: LoopContext, samples: list[TrainSample], which: str) -> list[list[float]]:
    shards = B.shard(samples, ctx.trainer.num_workers)
    results = ctx.trainer.call_split(
        TrainerWorker.compute_logprobs, shards, temperature=ctx.temperature, which=which
    )
    return [lp for part in results for lp in part]


def update_policy(ctx: LoopContext, samples: list[TrainSample], it: int) -> dict[str, float]:
    """`epochs_per_rollout` passes of mini-batches of `trajectories_per_update`; one optimizer step each,
    unless the mini-batch has no gradient to follow (`health.steps_mini_batch`: decided here, the same for
    every trainer rank; the trainer still reports its metrics).

    With a critic, each mini-batch also updates the critic; during `critic_warmup_iterations` only the
    critic learns. Counts: train/optimizer_steps (taken), train/skipped_steps (all-zero advantages, not
    taken), train/nonfinite_steps (skipped by the trainer: non-finite gradient norm), train/zero_grad_frac
    (share of the mini-batches with a nonzero advantage whose gradient was exactly 0; see `health`).
    """
    t, a = ctx.cfg.train, ctx.cfg.algorithm
    gen = torch.Generator().manual_seed(ctx.cfg.seed * 7919 + it) if t.shuffle_mini_batches else None
    train_actor = it > a.critic_warmup_iterations
    other_terms = a.kl_loss_coef > 0 or a.entropy_coef != 0
    sums: dict[str, float] = {}
    counts = {"train/optimizer_steps": 0.0, "train/skipped_steps": 0.0, "train/nonfinite_steps": 0.0}
    steps, with_advantage, zero_grad = 0, 0, 0
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
                step = health.steps_mini_batch(
                    mb, step_on_zero_advantage=t.step_on_zero_advantage, other_terms=other_terms
                )
                shards = B.shard(mb, ctx.trainer.num_workers)
                actor = _mean_dicts(ctx.trainer.call_split(TrainerWorker.update, shards, **totals, step=step))
                results.append(actor)
                nonfinite = actor.get("skipped", 0.0) > 0
                counts["train/optimizer_steps"] += step and not nonfinite
                counts["train/skipped_steps"] += not step
                counts["train/nonfinite_steps"] += step and nonfinite
                if health.has_policy_gradient(mb):
                    with_advantage += 1
                    zero_grad += health.zero_gradient(actor)
            for k, v in _mean_dicts(results).items():
                sums[k] = sums.get(k, 0.0) + v
            steps += 1
    out = {k: v / max(steps, 1) for k, v in sums.items()} | counts
    return out | ({"train/zero_grad_frac": zero_grad / with_advantage} if with_advantage else {})


def publish_weights(ctx: LoopContext, version: int) -> float:
    """Send the trainer's current weights, as policy `version`, to every rollout replica; returns the seconds
    it took. Each replica applies them after the generate calls queued before or, with
    `ctx.swap_mid_generation`, between two decode steps of the call in progress (none is lost; its tokens
    record the version that sampled each), and reports the version it then holds. Inline the replicas copy
    the trainer's tensors; on Ray they travel trainer -> replica over the run's weight transport
    (ascent.transport.weights) or, as the fallback, from trainer rank 0 through the object store. The
    controller never holds them."""
    t0 = time.perf_counter()
    to_replicas = ctx.rollout.call_alongside_async if ctx.swap_mid_generation else ctx.rollout.call_async
    if ctx.transport in ("broadcast", "cuda_ipc"):
        receivers = to_replicas(RolloutWorker.receive_weights, version)
        senders = ctx.trainer.call_async(TrainerWorker.send_weights, version)
        try:
            held = receivers.get()
        finally:
            senders.get()  # the trainer's own error, when it failed first
    else:
        pending = ctx.trainer.call_async(TrainerWorker.named_weights, to_cpu=ctx.transport != "inline")
        try:  # rank 0's weights go to the replicas directly (on Ray the controller never holds them)
            held = to_replicas(RolloutWorker.update_weights, pending.forward(0), version).get()
        except Exception:
            pending.get()  # the trainer's own error, when it failed first
            raise
        pending.others(0)  # the other ranks took part in the gather (FSDP); their errors surface here
    if any(v != version for v in held):
        raise RuntimeError(f"weight publication of version {version}: the rollout replicas report {held}.")
    return time.perf_counter() - t0


def rollout_metrics(episodes: list[Episode]) -> dict[str, float]:
    lengths = torch.tensor([len(t.response_ids) for t in episodes], dtype=torch.float32)
    truncated = sum(t.finish_reason == "length" for t in episodes)
    return {
        "rollout/response_len_mean": lengths.mean().item(),
        "rollout/response_len_max": lengths.max().item(),
        "rollout/truncated_frac": truncated / len(episodes),
        "rollout/trajectories": float(len(episodes)),
        **swap_metrics(episodes),
    }


def swap_metrics(episodes: list[Episode]) -> dict[str, float]:
    """rollout/swapped_sequences: episodes whose tokens were sampled by more than one policy version (a
    publication landed while they were generated: mid-call with rollout.swap_mid_generation, or between two
    turns of a multi-turn episode); rollout/tokens_after_swap: their tokens sampled by a newer version than
    the episode's oldest (loss-masked tokens only)."""
    swapped = tokens = 0
    for e in episodes:
        sampled = [v for v, m in zip(e.token_versions, e.loss_mask, strict=False) if m]
        if sampled and min(sampled) != max(sampled):
            swapped += 1
            tokens += sum(v > min(sampled) for v in sampled)
    return {"rollout/swapped_sequences": float(swapped), "rollout/tokens_after_swap": float(tokens)}


def _mean_dicts(dicts: list[dict[str, float]]) -> dict[str, float]:
    """Mean of each key over the dicts that report it (policy and critic workers report different keys)."""
    keys = {k for d in dicts for k in d}
    return {k: sum(d[k] for d in dicts if k in d) / sum(k in d for d in dicts) for k in keys}
