"""The RL loop: `run_loop` runs the iterations (then validation and checkpoints); `run_iteration` reads top
to bottom as one iteration does.

rollout -> rewards -> old/reference/teacher logprobs -> advantages -> policy update -> weight publication ->
metrics -> (validation) -> (checkpoint). The controller holds no model tensors; it calls worker groups,
which are inline objects or Ray actors, the loop cannot tell which. `ascent train`
(`ascent.entrypoints.train`) builds what the loop needs and calls `run_loop`.
"""

from __future__ import annotations

import itertools
import logging
import time

import torch

from ascent.cluster.base import WorkerGroup
from ascent.messages import Episode, TrainSample, flatten
from ascent.orchestrator import batch as B
from ascent.orchestrator import checkpointing, experience, health, replay, shaping
from ascent.orchestrator.collector import record_episodes, staleness_metrics
from ascent.orchestrator.experience import ExperienceLog
from ascent.orchestrator.interrupt import StopFlag, stopped_message
from ascent.orchestrator.run import LoopState, Run, UpdateSpec
from ascent.orchestrator.shaping import KLController
from ascent.orchestrator.validation import validate
from ascent.orchestrator.workers import CriticWorkerActor, RolloutWorker, TrainerWorker
from ascent.tracking import EventBus, Metrics, Progress

log = logging.getLogger("ascent")


def run_loop(run: Run, state: LoopState, start: int, stop: StopFlag, bus: EventBus) -> dict[str, float]:
    """Iterations `start + 1 .. spec.iterations`, each followed by its validation (when due), metrics (one
    `Metrics` event on the tracking `bus`), progress line and checkpoint (when due, or when a signal asks to
    stop); returns the last validation metrics."""
    spec, data, timeline = run.spec, run.data, run.timeline
    final: dict[str, float] = {}
    publish_weights(run, version=start)  # the engines start from the trainer's weights
    if start == 0 and data.val:
        bus.publish(Metrics.of(0, validate(run, iteration=0)))
    stop.arm()  # from here a signal waits for the end of the iteration and its checkpoint
    with (
        experience.recording(spec.experience, data.tokenizer, start) as log_,
        Progress(spec.iterations, enabled=spec.progress, start_iteration=start) as progress,
    ):
        for it in range(start + 1, spec.iterations + 1):
            metrics = run_iteration(run, state, log_, it)
            _stop_if_diverged(state, it, metrics, bus)
            if data.val and (it == spec.iterations or (spec.val_every and it % spec.val_every == 0)):
                with timeline.phase("validation", iteration=it):
                    final = validate(run, iteration=it)
                metrics.update(final)
            bus.publish(Metrics.of(it, metrics))
            progress.update(it, metrics)  # the summary line: the log file every iteration, the console paced
            timeline.flush()
            _checkpoint_or_stop(run, state, it, stop)
    return final


def _stop_if_diverged(state: LoopState, it: int, metrics: dict[str, float], bus: EventBus) -> None:
    """After the update, before validation and the checkpoint: a diverged run logs this iteration's metrics
    and stops (`health.TrainingDiverged`, exit status 2), leaving the checkpoints saved before it intact."""
    found = state.divergence.diverged(metrics)
    if found is not None:
        bus.publish(Metrics.of(it, metrics))
        raise health.TrainingDiverged(health.divergence_message(state.divergence.facts, it, *found))


def _checkpoint_or_stop(run: Run, state: LoopState, it: int, stop: StopFlag) -> None:
    """Checkpoint when due (or when a signal asks to stop and `checkpoint.on_interrupt`); then obey the
    signal."""
    c = run.spec.checkpoint
    due = it == c.iterations or (c.every and it % c.every == 0)
    interrupt = stop.requested and it < c.iterations
    path = None
    if due or (interrupt and c.on_interrupt):
        with run.timeline.phase("checkpoint", iteration=it):
            path = checkpointing.save(run, state, it)
    if interrupt and stop.signum is not None:
        raise stopped_message(stop.signum, "iteration", str(path) if path else None, it, c.iterations)


def run_iteration(run: Run, state: LoopState, log_: ExperienceLog, it: int) -> dict[str, float]:
    """One iteration: sample and score, logprobs, advantages, update, publish. Returns its metrics."""
    spec, tl, collector = run.spec, run.timeline, run.collector
    t0 = time.perf_counter()
    with tl.phase("rollout", iteration=it):
        groups, collect_metrics = collector.collect(run.prompts, tl, log_, state.sampler, it)
        # async (max_staleness >= 1): the replicas sample the next iterations while this one trains
        collector.prefetch(state.sampler, it, last=spec.iterations)
    collect_metrics |= staleness_metrics(flatten(groups), trainer_version=it - 1)  # fresh groups only
    groups, replay_metrics = replay.mix(run.replay, groups, it)  # stored groups (replay.store), off-policy
    collect_metrics |= replay_metrics
    episodes = flatten(groups)
    truncated = sum(e.finish_reason == "length" for e in episodes) / len(episodes)
    # distillation's advantages come from the teacher: equal rewards do not make them zero
    if not run.distills and (warning := state.equal_rewards.observe(groups, it, truncated)):
        log.warning(warning)
    collect_metrics["time/trainer_idle"] = collector.take_waited()  # generation the trainer waited for
    if spec.record_episodes:
        record_episodes(spec.run_dir, it, groups, trainer_version=it - 1)
    samples = B.train_samples(episodes, spec.routing_replay)
    reuse = not run.sum_pi_squared and update_gives_old_logprobs(
        spec.update, state.kl_controller, len(episodes), it
    )
    if run.colocated:
        # the pool this iteration's rollout had (sized at the last wake to what the trainer left free)
        collect_metrics |= kv_pool_metrics(run.rollout.call(RolloutWorker.kv_cache_tokens))
        # the engine is idle until the next publish: free its KV cache and weights before the trainer's
        # logprob passes and update (a full set of weights is published before "wake")
        run.rollout.call(RolloutWorker.sleep, release_weights=True)
    with tl.phase("logprobs", iteration=it):
        old_lp, pi_sq = _old_logprobs(run, samples, reuse)
        ref_lp = _logprobs(run, samples, "reference") if run.needs_reference else None
        teacher_lp = _logprobs(run, samples, "teacher") if run.distills else None
        values = critic_values(run.critic, samples)
    with tl.phase("advantages", iteration=it):
        token_rewards, kl_metrics = shaping.kl_penalty(
            state.kl_controller, spec.kl_penalty_estimator, episodes, old_lp, ref_lp
        )
        adv, returns = B.compute_advantages(
            groups,
            spec.advantage,
            token_rewards=token_rewards,
            values=values,
            teacher_logprobs=teacher_lp,
            sum_pi_squared=None if pi_sq is None or old_lp is None else (old_lp, pi_sq),
        )
        samples = B.with_targets(samples, adv, old_lp, ref_lp, returns=returns, values=values)
        filter_metrics: dict[str, float] = {}
        if spec.filter_zero_advantage:
            samples, filter_metrics = B.filter_zero_advantage(samples)
        experience.record_trained(log_, it, groups, samples)  # queued: written on the store's thread
    with tl.phase("update", iteration=it):
        update_metrics = update_policy(run, samples, it)
    with tl.phase("publish", iteration=it):
        publish_seconds = publish_weights(run, version=it)
        if run.colocated:
            released = release_trainer_memory(run)
            run.rollout.call(RolloutWorker.wake)
    tokens = sum(t.num_tokens for t in episodes)
    metrics = {
        **collect_metrics,
        **kl_metrics,
        **B.distill_metrics(episodes, teacher_lp),
        **filter_metrics,
        **update_metrics,
        **sampler_gap(spec.run_dir, it, episodes, old_lp),
        **rollout_metrics(episodes),
    }
    # the iteration's time includes its metrics: they run on the critical path too (a swap metric that was
    # quadratic once cost 1.5-2.8 s per iteration here, unseen while this clock stopped at the publication)
    elapsed = time.perf_counter() - t0
    return {
        **metrics,
        "train/old_logprob_pass": float(old_lp is not None),
        "time/iteration": elapsed,
        "time/weight_transfer": publish_seconds,  # the publication alone; time/publish is its phase (+ wake)
        **({"memory/trainer_released_gib": released / 2**30} if run.colocated else {}),
        "perf/tokens_per_s": tokens / max(elapsed, 1e-9),
        **{f"time/{k}": v for k, v in tl.last_durations().items()},
    }


def sampler_gap(
    run_dir: str, it: int, episodes: list[Episode], old_lp: list[list[float]] | None
) -> dict[str, float]:
    """rollout/logprob_diff_mean|max between the trainer's old logprobs and the sampler's, with the worst
    tokens recorded (`record_logprob_outliers`); {} when the update reused its own logprobs (it then
    reported the mismatch itself)."""
    if old_lp is None:
        return {}
    diff = B.logprob_diff(old_lp, [t.sampler_logprobs for t in episodes], [t.loss_mask for t in episodes])
    B.record_logprob_outliers(run_dir, it, episodes, old_lp)
    return {"rollout/logprob_diff_mean": diff[0], "rollout/logprob_diff_max": diff[1]}


def update_gives_old_logprobs(
    u: UpdateSpec, kl_controller: KLController | None, num_trajectories: int, it: int
) -> bool:
    """True when the separate old-logprob forward can be skipped (`train.old_logprobs=auto`).

    That holds when this iteration takes exactly ONE policy optimizer step on its fresh samples (one epoch,
    one mini-batch, the actor trains) and nothing needs the old logprobs before the update (no KL penalty
    in the reward): the update's own logprobs, detached, are then exactly the old logprobs (ratio 1), and
    the trainer reports the sampler/trainer mismatch from them.
    """
    return (
        u.old_logprobs_auto
        and u.epochs_per_rollout == 1
        and num_trajectories <= u.trajectories_per_update
        and it > u.critic_warmup_iterations
        and kl_controller is None
    )


def kv_pool_metrics(tokens: list[int | None]) -> dict[str, float]:
    """rollout/kv_tokens: the smallest replica's KV cache in tokens (a colocated fast engine's shrinks when
    the trainer leaves less free than rollout.gpu_memory_fraction asks); none for other engines."""
    sizes = [t for t in tokens if t is not None]
    return {"rollout/kv_tokens": float(min(sizes))} if sizes else {}


def release_trainer_memory(run: Run) -> int:
    """Colocated in separate processes (on Ray: the publisher is not in-process): the trainer's and critic's
    ranks give their cached GPU blocks back before the engine wakes on the same GPUs; the bytes over all
    ranks."""
    if run.publisher.in_process:
        return 0
    released = sum(run.trainer.call(TrainerWorker.release_cached_memory))
    if run.critic is not None:
        released += sum(run.critic.call(CriticWorkerActor.release_cached_memory))
    return released


def critic_values(
    critic: WorkerGroup[CriticWorkerActor] | None, samples: list[TrainSample]
) -> torch.Tensor | None:
    """The critic's value of every response token, padded [B, T]; None without a critic."""
    if critic is None:
        return None
    shards = B.shard(samples, critic.num_workers)
    rows = [v for part in critic.call_split(CriticWorkerActor.compute_values, shards) for v in part]
    return B.padded(rows, max(1, max(len(r) for r in rows)))


def _old_logprobs(
    run: Run, samples: list[TrainSample], reuse: bool
) -> tuple[list[list[float]] | None, list[list[float]] | None]:
    """(the trainer's old logprobs, None when the update's own are reused; Σπ² per token when the advantage
    estimator reads it (the optimal-token baseline), else None: the same forward gives both)."""
    if not run.sum_pi_squared:
        return (None if reuse else _logprobs(run, samples, "policy")), None
    shards = B.shard(samples, run.trainer.num_workers)
    results = run.trainer.call_split(
        TrainerWorker.compute_logprobs_and_sum_pi_squared, shards, temperature=run.temperature
    )
    return [lp for part in results for lp in part[0]], [s for part in results for s in part[1]]


def _logprobs(run: Run, samples: list[TrainSample], which: str) -> list[list[float]]:
    shards = B.shard(samples, run.trainer.num_workers)
    results = run.trainer.call_split(
        TrainerWorker.compute_logprobs, shards, temperature=run.temperature, which=which
    )
    return [lp for part in results for lp in part]


def update_policy(run: Run, samples: list[TrainSample], it: int) -> dict[str, float]:
    """`epochs_per_rollout` passes of mini-batches of `trajectories_per_update`; one optimizer step each,
    unless the mini-batch has no gradient to follow (`health.steps_mini_batch`: decided here, the same for
    every trainer rank; the trainer still reports its metrics).

    With a critic, each mini-batch also updates the critic; during `critic_warmup_iterations` only the
    critic learns. Counts: train/optimizer_steps (taken), train/skipped_steps (all-zero advantages, not
    taken), train/nonfinite_steps (skipped by the trainer: non-finite gradient norm), train/zero_grad_frac
    (share of the mini-batches with a nonzero advantage whose gradient was exactly 0; see `health`).
    """
    u, critic, trainer = run.spec.update, run.critic, run.trainer
    gen = torch.Generator().manual_seed(run.spec.seed * 7919 + it) if u.shuffle_mini_batches else None
    train_actor = it > u.critic_warmup_iterations
    sums: dict[str, float] = {}
    counts = {"train/optimizer_steps": 0.0, "train/skipped_steps": 0.0, "train/nonfinite_steps": 0.0}
    steps, with_advantage, zero_grad = 0, 0, 0
    for _ in range(u.epochs_per_rollout):
        for idx in B.mini_batches(len(samples), u.trajectories_per_update, gen):
            mb = [samples[i] for i in idx]
            totals = {"total_tokens": float(sum(sum(s.loss_mask) for s in mb)), "total_seqs": float(len(mb))}
            results: list[dict[str, float]] = []
            if critic is not None:
                results += critic.call_split(
                    CriticWorkerActor.update, B.shard(mb, critic.num_workers), **totals
                )
            if train_actor:
                step = health.steps_mini_batch(
                    mb, step_on_zero_advantage=u.step_on_zero_advantage, other_terms=u.other_terms
                )
                shards = B.shard(mb, trainer.num_workers)
                actor = _mean_dicts(trainer.call_split(TrainerWorker.update, shards, **totals, step=step))
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


def publish_weights(run: Run, version: int) -> float:
    """Send the trainer's current weights, as policy `version`, to every rollout replica; returns the seconds
    it took. Each replica applies them after the generate calls queued before or, with
    `rollout.swap_mid_generation`, between two decode steps of the call in progress (none is lost; its tokens
    record the version that sampled each), and reports the version it then holds. How the weights travel is
    the run's transport (`ascent.transport`, chosen by setup); the controller never holds them."""
    t0 = time.perf_counter()
    run.publisher.publish(version)
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
        sampled = list(itertools.compress(e.token_versions, e.loss_mask))
        oldest = min(sampled, default=0)
        if sampled and oldest != max(sampled):  # C-level passes: a per-token min() once made this O(T^2)
            swapped += 1
            tokens += len(sampled) - sampled.count(oldest)  # every other version is newer than the oldest
    return {"rollout/swapped_sequences": float(swapped), "rollout/tokens_after_swap": float(tokens)}


def _mean_dicts(dicts: list[dict[str, float]]) -> dict[str, float]:
    """Mean of each key over the dicts that report it (policy and critic workers report different keys)."""
    keys = {k for d in dicts for k in d}
    return {k: sum(d[k] for d in dicts if k in d) / sum(k in d for d in dicts) for k in keys}
