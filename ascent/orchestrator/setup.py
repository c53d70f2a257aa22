"""Builders that turn the run config into the loop's parts: datasets, worker groups, reward runner, trackers.

Config stops here: the workers are built from the frozen, flat specs of `ascent.orchestrator.specs` (imported
where the groups are built: they import torch, and this module stays importable without it for `ascent
doctor`), everything else receives flat arguments.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ascent.cluster import make_worker_group
from ascent.cluster.base import W
from ascent.cluster.errors import ClusterConfigError
from ascent.cluster.hosts import IsolationPolicy, ProcessHosts, default_workers
from ascent.cluster.mps import MpsDaemon, MpsUnavailable, node_daemon, overlaps_on_gpu, start_mps
from ascent.config.schema import RewardConfig, RunConfig
from ascent.config.sources import AgentSourceConfig, EnvSourceConfig
from ascent.data import image_codec, load_rows, render_prompts, validate_rows
from ascent.data.builders import processors_from_config
from ascent.data.fields import prepare_rows
from ascent.data.processors import run_steps
from ascent.data.prompts import PromptItem, RenderReport
from ascent.data.templates import set_chat_template
from ascent.envs.hosts import Hosts, InlineHosts
from ascent.errors import AscentError
from ascent.orchestrator.placement import Placement, check_fits, judge_gpus, placement_of, uses_critic
from ascent.rewards import RewardRunner

if TYPE_CHECKING:
    from ascent.cluster.base import WorkerGroup
    from ascent.models.vision import ImageCodec
    from ascent.orchestrator.workers import CriticWorkerActor, RewardModelWorker, RolloutWorker, TrainerWorker
    from ascent.transport.publish import Publisher

log = logging.getLogger("ascent")


@dataclass
class Datasets:
    train: list[Any]  # PromptItem
    val: list[Any]
    tokenizer: Any
    codec: ImageCodec | None = None  # a vision-language model's (`ascent.models.vision`); None: text only


def build_datasets(cfg: RunConfig) -> Datasets:
    """Load, validate and render the train and validation prompts; report every dropped prompt."""
    # deferred: imports torch (this module stays importable without it, for ascent doctor)
    from ascent.models.loading import load_tokenizer

    field = "model.tokenizer_path" if cfg.model.tokenizer_path else "model.path"
    tok = load_tokenizer(cfg.model.tokenizer_path or cfg.model.path, cfg.model.trust_remote_code, field)
    set_chat_template(tok, cfg.model.chat_template)
    m = cfg.model
    codec = image_codec(m.path, m.min_pixels, m.max_pixels, tokenizer=tok, tokenizer_field=field)
    d, episodes = cfg.data, cfg.rollout.source
    sets: dict[str, list[Any]] = {}
    reports: dict[str, RenderReport] = {}
    for name, path in (("train", d.train_path), ("val", d.val_path)):
        if not path:
            sets[name] = []
            continue
        source = f"data.{name}_path={path}"
        rows = load_rows(path, source=source, split=d.split)
        rows = prepare_rows(
            rows, source, prompt_key=d.prompt_key, answer_key=d.answer_key, system_prompt=d.system_prompt
        )
        if name == "train":
            rows = run_steps(rows, processors_from_config(d), source)
        if not cfg.rollout.multi_turn:  # an environment's reset(row) (an agent) says what a row needs
            validate_rows(rows, source, tokenizer_vocab_size=len(tok))
        if name == "val" and d.max_val_prompts:
            rows = rows[: d.max_val_prompts]
        if isinstance(episodes, AgentSourceConfig):  # the agent writes its prompts: a row is what run() gets
            items, report = agent_items(rows), RenderReport(total=len(rows), max_tokens=d.max_prompt_tokens)
        elif isinstance(episodes, EnvSourceConfig):  # the environment gives each row's prompt
            from ascent.orchestrator.episodes import env_items  # deferred: imports torch

            items, report = env_items(rows, tok, episodes.env, cfg, source)
        else:
            items, report = render_prompts(
                rows,
                tok,
                max_prompt_tokens=d.max_prompt_tokens,
                overlong=d.overlong_prompts,
                truncation_side=d.truncation_side,
                chat_template=d.chat_template,
                source=source,
                codec=codec,
            )
        log.info("data.%s_path=%s: %d prompts (%s)", name, path, len(items), report)
        sets[name], reports[name] = items, report
    if not sets["train"]:
        raise AscentError(
            f"data.train_path={d.train_path!r}: no usable training prompts"
            + (f" ({reports['train']})" if "train" in reports else "")
            + "; check the file, its image paths (relative to the dataset file) and data.max_prompt_tokens / "
            "data.overlong_prompts."
        )
    return Datasets(train=sets["train"], val=sets["val"], tokenizer=tok, codec=codec)


def agent_items(rows: list[dict[str, Any]]) -> list[Any]:
    """Rows for an agent source: no prompt of ours (the agent's first call is the episode's prompt)."""
    return [
        PromptItem(row_id=i, prompt_ids=[], prompt_text="", metadata=dict(row)) for i, row in enumerate(rows)
    ]


def swaps_mid_generation(cfg: RunConfig) -> bool:
    """Whether publications reach the replicas during a generate call (`rollout.swap_mid_generation`): with
    the fast engine on replicas that generate alongside the trainer (`ClusterConfig.generates_alongside`).
    Inline, or colocated with the engine asleep through the update, generation and publication take turns."""
    c = cfg.cluster
    return cfg.rollout.swap_mid_generation != "off" and c.generates_alongside and cfg.rollout.engine == "fast"


def optimizer_steps_per_iteration(cfg: RunConfig) -> int:
    return cfg.train.epochs_per_rollout * (cfg.trajectories_per_step // cfg.train.trajectories_per_update)


@dataclass
class WorkerGroups:
    rollout: WorkerGroup[RolloutWorker]
    trainer: WorkerGroup[TrainerWorker]
    critic: WorkerGroup[CriticWorkerActor] | None
    publisher: Publisher | None = None  # moves the trainer's weights to the replicas (`ascent.transport`)
    reward_model: WorkerGroup[RewardModelWorker] | None = None  # reward.model's scorer
    judge: WorkerGroup[RolloutWorker] | None = None  # reward.judge's own engine (None: none, or the policy)
    placement_group: Any = None  # the colocated groups' shared Ray placement group, released at shutdown
    mps: MpsDaemon | None = None  # the run's own MPS daemon (cluster.mps), stopped after the workers

    def shutdown(self) -> None:
        """Stop every worker, then free the shared bundles (a second build in this process can reuse them)
        and stop the run's MPS daemon."""
        for group in (self.rollout, self.trainer, self.critic, self.reward_model, self.judge):
            if group is not None:
                group.shutdown()
        if self.placement_group is not None:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self.placement_group)
            self.placement_group = None
        if self.mps is not None:
            self.mps.stop()


def needs_reference(cfg: RunConfig) -> bool:
    """A frozen reference policy is loaded only when a KL term (loss or reward penalty) uses it."""
    return cfg.algorithm.kl_loss_coef > 0 or cfg.algorithm.kl_penalty_coef > 0


def computes_beside_engine(cfg: RunConfig) -> bool:
    """Whether the run's trainer ranks and replicas compute at once on the same GPUs (where `cluster.mps`
    matters; `ascent.cluster.mps.overlaps_on_gpu`)."""
    c = cfg.cluster
    return overlaps_on_gpu(
        c.backend, c.placement, c.engine_sleeps, cfg.rollout.max_staleness, c.gpus_per_worker, c.device
    )


def mps_daemon(cfg: RunConfig) -> MpsDaemon | None:
    """`cluster.mps` for a Ray run: a daemon of its own (`ascent.cluster.mps`), or None where MPS is not
    wanted, the node already runs one, or (`auto`) it cannot start here (logged)."""
    c = cfg.cluster
    if c.mps == "off" or c.backend != "ray" or (c.mps == "auto" and not computes_beside_engine(cfg)):
        return None
    if c.address:  # `on` with an address is a config rule; `auto` leaves a joined cluster's nodes alone
        log.info("cluster.mps=auto: the joined cluster's workers use MPS where its nodes run it")
        return None
    if existing := node_daemon():
        log.info("MPS: the workers use the daemon this node runs (pipe directory %s)", existing)
        return None
    try:
        return start_mps()
    except MpsUnavailable as e:
        if c.mps == "on":
            raise ClusterConfigError(
                f"cluster.mps=on: {e}. Install the NVIDIA driver's utilities, or set cluster.mps=off."
            ) from None
        log.warning(
            "cluster.mps=auto: MPS is not available (%s); trainer ranks and replicas sharing a GPU take "
            "turns on it (time slices) instead of computing at once",
            e,
        )
        return None


def distill_teacher(cfg: RunConfig) -> str | None:
    """The distillation teacher's checkpoint (`algorithm.teacher`, with advantage=distill: a config rule),
    held frozen by the trainer ranks like the reference; None for every other estimator."""
    return cfg.algorithm.teacher if cfg.algorithm.advantage.name == "distill" else None


def reads_sum_pi_squared(cfg: RunConfig) -> bool:
    """Whether the advantage estimator reads Σπ² per token (the optimal-token baseline): then the old-logprob
    pass always runs and produces it; no other run pays for it."""
    return cfg.algorithm.advantage.name == "optimal_token_baseline"


def build_worker_groups(cfg: RunConfig) -> WorkerGroups:
    """The rollout, trainer, (for GAE) critic and (reward.model, reward.judge) reward worker groups, inline
    or as Ray actors; with `cluster.mps` the run's MPS daemon too (`mps_daemon`)."""
    c = cfg.cluster
    plan = placement_of(cfg)
    shared = _start_ray(cfg, plan) if c.backend == "ray" else None
    mps = mps_daemon(cfg)
    try:
        groups = _build_groups(cfg, plan, shared, mps)
    except BaseException:
        if mps is not None:
            mps.stop()
        raise
    groups.mps = mps
    return groups


def _build_groups(cfg: RunConfig, plan: Placement, shared: Any, mps: MpsDaemon | None) -> WorkerGroups:
    from ascent.orchestrator import specs  # imports torch (see top)
    from ascent.orchestrator.workers import (  # deferred: imports torch
        CriticWorkerActor,
        RewardModelWorker,
        RolloutWorker,
        TrainerWorker,
    )

    c = cfg.cluster
    steps = cfg.iterations * optimizer_steps_per_iteration(cfg)
    common: dict[str, Any] = {
        "backend": c.backend,
        "run_dir": cfg.run_dir,
        "timeout_s": c.worker_timeout_s,
        "num_cpus_per_worker": c.cpus_per_worker,
        "log_level": cfg.tracking.log_level,
        **({"placement_group": shared} if shared is not None else {}),
        **({"env": mps.env()} if mps is not None else {}),
    }

    def trainer_group(cls: type[W], name: str, init: dict[str, Any], gpus: float) -> WorkerGroup[W]:
        return make_worker_group(
            cls,
            num_workers=c.num_trainer_workers,
            init_kwargs={**init, "run_dir": cfg.run_dir},
            name=name,
            num_gpus_per_worker=gpus,
            **common,
        )

    rollout = make_worker_group(
        RolloutWorker,
        num_workers=c.num_rollout_workers,
        init_kwargs={"spec": specs.engine_spec(cfg), "run_dir": cfg.run_dir},
        name="rollout",
        num_gpus_per_worker=plan.rollout_gpus,
        **common,
    )
    critic = (
        trainer_group(
            CriticWorkerActor,
            "critic",
            {"spec": specs.critic_spec(cfg, steps), "seed": cfg.seed},
            plan.trainer_gpus,
        )
        if uses_critic(cfg)
        else None
    )
    trainer = trainer_group(
        TrainerWorker,
        "trainer",
        {"spec": specs.trainer_spec(cfg, steps), "seed": cfg.seed},
        plan.trainer_gpus,
    )
    groups = WorkerGroups(rollout=rollout, trainer=trainer, critic=critic, placement_group=shared)
    try:
        if cfg.reward.model is not None:
            spec = specs.reward_model_spec(cfg.reward.model, cfg.cluster.device)
            groups.reward_model = trainer_group(
                RewardModelWorker, "reward_model", {"spec": spec}, plan.reward_gpus
            )
        groups.judge = _judge_group(cfg, common)
        groups.publisher = build_publisher(cfg, groups)
    except BaseException:
        groups.shutdown()
        raise
    return groups


def _start_ray(cfg: RunConfig, plan: Placement) -> Any:
    """Join or start the Ray cluster, refuse a plan it can never hold (`check_fits`), and reserve the bundles
    the colocated groups share: that placement group, or None when they share none."""
    from ascent.cluster import init_ray  # imports Ray: only for the Ray backend (inline runs without it)

    c = cfg.cluster
    init_ray(c.address, c.num_cpus, temp_dir=c.ray_temp_dir)
    check_fits(cfg)
    if not plan.shared_bundles:
        return None
    from ascent.cluster import make_placement_group  # deferred: imports Ray

    return make_placement_group(
        plan.shared_bundles,
        gpus_per_bundle=plan.bundle_gpus,
        cpus_per_bundle=plan.bundle_cpus,
        placement="colocated",
        timeout_s=c.worker_timeout_s,
    )


def _judge_group(cfg: RunConfig, common: dict[str, Any]) -> WorkerGroup[RolloutWorker] | None:
    """`reward.judge`'s own engine (a checkpoint or `policy@N`): one replica outside the shared bundles, with
    the other groups' `common` worker settings; None when there is no judge or it is the policy itself."""
    from ascent.orchestrator import specs  # imports torch (see top)
    from ascent.orchestrator.workers import RolloutWorker  # deferred: imports torch

    judge = specs.judge_engine_spec(cfg)
    if judge is None:
        return None
    own = {k: v for k, v in common.items() if k != "placement_group"}
    return make_worker_group(
        RolloutWorker,
        num_workers=1,
        init_kwargs={"spec": judge, "run_dir": cfg.run_dir},
        name="judge",
        num_gpus_per_worker=judge_gpus(cfg) if cfg.cluster.backend == "ray" else 0.0,
        **own,
    )


def weight_transport_kind(cfg: RunConfig) -> str:
    """The transport `cluster.weight_transport` resolves to (`auto`: see `ascent.transport.select.choose`)."""
    from ascent.transport.select import choose  # deferred: imports torch

    c, plan = cfg.cluster, placement_of(cfg)
    trainers, replicas = c.num_trainer_workers, c.num_rollout_workers
    # split: the fewest GPUs a trainer rank or a replica has (a fraction: they share GPUs, no NCCL)
    gpus = min(plan.trainer_gpus, plan.rollout_gpus) if c.placement == "split" else c.gpus_per_worker
    return choose(c.backend, c.weight_transport, c.placement, c.device, gpus, trainers, replicas)


def build_publisher(cfg: RunConfig, groups: WorkerGroups) -> Publisher:
    """The run's weight `Publisher`, given the two worker groups and their workers' publication methods; a
    link transport joins both sides here (each waits at most `weight_sync_timeout_s` for the other). With
    `reward.judge.model=policy@N` it also hands version N to the judge's group (`ascent.transport.pinned`)."""
    from ascent.orchestrator.workers import RolloutWorker, TrainerWorker  # deferred: torch
    from ascent.transport.pinned import JudgeEnd, PinnedPublisher, pinned_dir  # deferred: torch
    from ascent.transport.publish import ReplicaEnd, TrainerEnd  # deferred: torch
    from ascent.transport.select import build_publisher as build  # deferred: torch

    c = cfg.cluster
    trainer = TrainerEnd(
        groups.trainer,
        named_weights=TrainerWorker.named_weights,
        address=TrainerWorker.weight_transport_address,
        join=TrainerWorker.join_weight_transport,
        send=TrainerWorker.send_weights,
    )
    replicas = ReplicaEnd(
        groups.rollout,
        update_weights=RolloutWorker.update_weights,
        join=RolloutWorker.join_weight_transport,
        receive=RolloutWorker.receive_weights,
        alongside=swaps_mid_generation(cfg),
    )
    kind, bucket_bytes = weight_transport_kind(cfg), c.weight_bucket_mb << 20
    publisher = build(kind, trainer, replicas, c.weight_sync_timeout_s, bucket_bytes)
    pin = cfg.reward.judge.pinned_version if cfg.reward.judge is not None else None
    if pin is not None and groups.judge is not None:  # reward.judge.model=policy@N: the judge gets version N
        judge = JudgeEnd(groups.judge, pin=RolloutWorker.pin_weights, load=RolloutWorker.load_pinned)
        publisher = PinnedPublisher(publisher, trainer, judge, pin, pinned_dir(cfg.run_dir, pin))
    log.info("weight transport: %s", publisher.describe())
    return publisher


def build_reward_runner(cfg: RunConfig) -> RewardRunner:
    """The reward runner of `cfg.reward`: its calls on process hosts with a timeout, or inline."""
    r = cfg.reward
    return RewardRunner(
        r.fn,
        kwargs=r.kwargs,
        max_failure_rate=r.max_failure_rate,
        logger=log,
        executor=reward_hosts(r),
    )


def reward_hosts(r: RewardConfig) -> Hosts:
    """The hosts of reward calls: `r.num_workers` processes under `reward.timeout_s` and
    `reward.memory_limit_mb` (`reward.isolation=process`), or this process (`inline`)."""
    if r.isolation == "inline":
        return InlineHosts()
    policy = IsolationPolicy(
        "reward",
        r.timeout_s,
        "reward.timeout_s",
        memory_mb=r.memory_limit_mb,
        memory_field="reward.memory_limit_mb",
    )
    return ProcessHosts(default_workers(r.num_workers), policy, preload=["ascent.rewards"])
