"""Placement and demand: where the worker groups go and what they ask Ray for, from the run config.

`build_worker_groups` (`ascent.orchestrator.setup`) places the groups by `placement_of`; before it starts any,
`check_fits` refuses a plan the Ray cluster can never hold. `ascent doctor` prints the same plan
(`describe_placement`) and checks the same `demand` against a cluster. Pure functions of the config, apart
from `check_fits` (it asks Ray for the cluster's resources); importable without torch or Ray.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ascent.cluster.errors import ClusterConfigError
from ascent.config.schema import RunConfig
from ascent.config.sources import EnvSourceConfig


def uses_critic(cfg: RunConfig) -> bool:
    a = cfg.algorithm
    return a.use_critic if a.use_critic is not None else a.advantage.name == "gae"


def placed_groups(cfg: RunConfig) -> int:
    """How many groups of `num_trainer_workers` ranks share the GPUs with the trainer's: the trainer, the
    critic (GAE) and the reward model (`reward.model`), each rank i placed as trainer rank i is."""
    return 1 + uses_critic(cfg) + (cfg.reward.model is not None)


def own_judge_engine(cfg: RunConfig) -> bool:
    """Whether `reward.judge` has an engine of its own (a checkpoint, or `policy@N`; not `policy`): one replica
    outside the shared bundles with cluster.gpus_per_worker GPUs and cluster.cpus_per_worker CPUs."""
    return cfg.reward.judge is not None and cfg.reward.judge.model != "policy"


@dataclass(frozen=True)
class Placement:
    """GPUs each worker of a group asks Ray for, and the bundles colocated groups share (0: none)."""

    trainer_gpus: float
    rollout_gpus: float
    shared_bundles: int = 0
    bundle_gpus: float = 0.0
    bundle_cpus: float = 0.0
    reward_gpus: float = 0.0  # each reward-model rank, and (split) a judge's own engine


def plan_placement(
    backend: str,
    placement: str,
    gpus_per_worker: float,
    cpus_per_worker: float,
    num_trainers: int,
    groups: int,
    split_gpus: tuple[float, float, float] | None = None,
) -> Placement:
    """Where the worker groups go (`groups`: how many groups of trainer ranks: `placed_groups`).

    - split: every worker of every group gets GPUs of its own: `split_gpus` = (each trainer or critic rank,
      each rollout replica, each reward-model rank or judge engine), by default `gpus_per_worker` each.
    - colocated on Ray with GPUs: bundle i holds `gpus_per_worker` GPUs and is shared by trainer rank i,
      rollout replica i (and critic rank i, reward-model rank i), each asking an equal fraction, so they
      take turns on the same GPU (the engine sleeps through the update; the reward model stays resident);
      `cluster.num_rollout_workers` equals `num_trainer_workers` (a config rule).
    - inline or CPU-only: nothing to place; the engine shares the trainer's device.
    """
    if placement == "split":
        trainer, rollout, reward = split_gpus or (gpus_per_worker,) * 3
        return Placement(trainer, rollout, reward_gpus=reward)
    if backend != "ray" or gpus_per_worker == 0:
        return Placement(gpus_per_worker, 0.0, reward_gpus=gpus_per_worker)
    share = gpus_per_worker / (groups + 1)
    return Placement(share, share, num_trainers, gpus_per_worker, cpus_per_worker * (groups + 1), share)


def placement_of(cfg: RunConfig) -> Placement:
    """The run's placement (`plan_placement` with the config's per-component GPU counts)."""
    c, tp = cfg.cluster, cfg.rollout.tensor_parallel
    g = c.gpus_per_worker
    split = (
        g if c.trainer_gpus is None else c.trainer_gpus,
        g * tp if c.rollout_gpus is None else c.rollout_gpus,
        g if c.reward_model_gpus is None else c.reward_model_gpus,
    )
    groups = placed_groups(cfg)
    return plan_placement(c.backend, c.placement, g, c.cpus_per_worker, c.num_trainer_workers, groups, split)


def describe_placement(cfg: RunConfig) -> str:
    """One line: GPUs per component as the run asks Ray for them (what `ascent doctor` prints)."""
    c, plan, tp = cfg.cluster, placement_of(cfg), cfg.rollout.tensor_parallel
    trainers = c.num_trainer_workers * (1 + uses_critic(cfg))
    parts = [
        f"trainer {trainers} x {plan.trainer_gpus:g} GPU",
        f"rollout {c.num_rollout_workers} replica(s) x TP {tp} x {plan.rollout_gpus / tp:g} GPU",
    ]
    if cfg.reward.model is not None:
        parts.append(f"reward model {c.num_trainer_workers} x {plan.reward_gpus:g} GPU")
    if own_judge_engine(cfg):
        parts.append(f"judge engine 1 x {judge_gpus(cfg):g} GPU")
    how = (
        f"colocated in {plan.shared_bundles} bundle(s) of {plan.bundle_gpus:g}"
        if plan.shared_bundles
        else c.placement
    )
    return f"{how}: " + ", ".join(parts) + f"; {demand(cfg).gpus:g} GPUs in all"


def judge_gpus(cfg: RunConfig) -> float:
    """GPUs of a judge's own engine: reward_model_gpus with placement=split, else gpus_per_worker."""
    c = cfg.cluster
    if c.placement == "split" and c.reward_model_gpus is not None:
        return c.reward_model_gpus
    return c.gpus_per_worker


@dataclass(frozen=True)
class Demand:
    """What the worker groups ask Ray for: GPUs and CPUs in all (`env_cpus` of them for the environment
    actors), and whether the workers' bundles must fit on one node."""

    gpus: float
    cpus: float
    one_node: bool
    env_cpus: float = 0.0


def demand(cfg: RunConfig) -> Demand:
    """GPUs and CPUs of every worker (trainer, rollout, critic, reward model, the judge's own engine) as
    `build_worker_groups` places them, and of the environment actors (`ascent.cluster.ray_hosts`; at least
    one when the run picks their count; their GPU shares, `rollout.env_gpus`, count among the GPUs)."""
    c, env, env_gpus = cfg.cluster, env_actor_cpus(cfg), env_actor_gpus(cfg)
    groups, judge = placed_groups(cfg), int(own_judge_engine(cfg))
    plan, judge_g = placement_of(cfg), judge_gpus(cfg)
    if plan.shared_bundles:
        cpus = plan.shared_bundles * plan.bundle_cpus + env + judge * c.cpus_per_worker
        gpus = plan.shared_bundles * plan.bundle_gpus + judge * judge_g + env_gpus
        return Demand(gpus, cpus, True, env)
    workers = c.num_trainer_workers * groups + c.num_rollout_workers + judge
    reward = cfg.reward.model is not None
    gpus = c.num_trainer_workers * ((groups - reward) * plan.trainer_gpus + reward * plan.reward_gpus)
    gpus += c.num_rollout_workers * plan.rollout_gpus
    return Demand(gpus + judge * judge_g + env_gpus, workers * c.cpus_per_worker + env, False, env)


def env_actor_cpus(cfg: RunConfig) -> float:
    """CPUs the environment actors ask for: with cluster.backend=ray, an env source and env_isolation=process
    (`rollout.env_workers` x `rollout.env_cpus`, at least one actor), else none."""
    r = cfg.rollout
    if (
        cfg.cluster.backend != "ray"
        or not isinstance(r.source, EnvSourceConfig)
        or r.env_isolation == "inline"
    ):
        return 0.0
    return (r.env_workers or 1) * r.env_cpus


def env_actor_gpus(cfg: RunConfig) -> float:
    """GPUs the environment actors ask for (simulators rendering through EGL): their CPUs' count of actors x
    `rollout.env_gpus`; none where they are not Ray actors."""
    r = cfg.rollout
    return env_actor_cpus(cfg) / r.env_cpus * r.env_gpus


def demand_shortfall(need: Demand, total: dict[str, Any]) -> str | None:
    """None when the cluster's `total` resources cover `need`, else what is short and the knobs to turn."""
    have_gpu, have_cpu = float(total.get("GPU", 0)), float(total.get("CPU", 0))
    if need.gpus > have_gpu:
        return (
            f"the workers ask {need.gpus:g} GPUs in all and the Ray cluster has {have_gpu:g}: lower "
            "cluster.num_trainer_workers / num_rollout_workers or cluster.gpus_per_worker, or add GPU nodes."
        )
    if need.cpus > have_cpu:
        env = (
            f", {need.env_cpus:g} of them for the environment actors: rollout.env_workers x rollout.env_cpus"
            if need.env_cpus
            else ""
        )
        return (
            f"the workers ask {need.cpus:g} CPUs in all (cluster.cpus_per_worker per worker{env}) and the "
            f"Ray cluster has {have_cpu:g}: lower cluster.cpus_per_worker{' or those' if env else ''} or "
            "raise cluster.num_cpus (a local cluster), or add nodes."
        )
    return None


def check_fits(cfg: RunConfig) -> None:
    """Refuse a plan the Ray cluster can never hold: its groups would otherwise wait for resources forever
    (each group alone may fit while all of them together do not)."""
    import ray  # deferred: Ray, only for the Ray backend

    short = demand_shortfall(demand(cfg), dict(ray.cluster_resources()))
    if short is not None:
        raise ClusterConfigError(short)
