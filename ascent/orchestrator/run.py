"""What the loop is given: `Run`, the typed parts of a run built once at setup and never changed (among them
`LoopSpec`, what the loop reads of the config, flat), and `LoopState`, the little the loop changes from one
iteration to the next (what a checkpoint saves of it).

`build_run` chooses, once, where the run's episodes come from (`ascent.orchestrator.sources`): single-turn
prompts sampled on the rollout replicas and scored with the reward function, an environment's episodes, or
an agent's plays through the run's endpoint; the collector and the validation take that choice as given.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ascent.cluster.base import WorkerGroup
from ascent.config.schema import RunConfig
from ascent.config.sources import AgentSourceConfig, EnvSourceConfig
from ascent.data.sampler import PromptSampler
from ascent.messages import SamplingParams
from ascent.orchestrator import batch as B
from ascent.orchestrator import health
from ascent.orchestrator.agents import AgentPlays, AgentSetup, replica_generate
from ascent.orchestrator.checkpointing import CheckpointSpec
from ascent.orchestrator.collector import Collector
from ascent.orchestrator.episodes import EnvRunners
from ascent.orchestrator.experience import ExperienceSpec
from ascent.orchestrator.group_hooks import build_group_hooks
from ascent.orchestrator.replay import Replay, ReplaySpec, load_replay
from ascent.orchestrator.reward_models import build_scorers
from ascent.orchestrator.sampling import Decode, Scorer
from ascent.orchestrator.setup import (
    Datasets,
    WorkerGroups,
    distill_teacher,
    needs_reference,
    reads_sum_pi_squared,
)
from ascent.orchestrator.shaping import KLController, make_kl_controller
from ascent.orchestrator.sources import AgentSource, EnvSource, EpisodeSource, PromptSource
from ascent.orchestrator.specs import collect_spec, env_episodes, fresh_prompts_per_step
from ascent.orchestrator.workers import CriticWorkerActor, RolloutWorker, TrainerWorker
from ascent.rewards import RewardRunner
from ascent.tracking import Timeline
from ascent.transport.publish import Publisher


@dataclass(frozen=True)
class UpdateSpec:
    """What the policy update reads of `train` and `algorithm`: its mini-batches and epochs, when a mini-batch
    is stepped (`step_on_zero_advantage`; `other_terms`: a KL loss or entropy bonus has a gradient of its
    own), the critic's warm-up, and whether `train.old_logprobs=auto` may reuse the update's logprobs."""

    epochs_per_rollout: int
    trajectories_per_update: int
    shuffle_mini_batches: bool
    step_on_zero_advantage: bool
    other_terms: bool
    critic_warmup_iterations: int
    old_logprobs_auto: bool


@dataclass(frozen=True)
class LoopSpec:
    """What the loop reads of the run's config, built once at setup (`loop_spec`): the iterations and seed,
    validation (when, with which sampling and k, how many samples to log), what is recorded (progress line,
    episodes.jsonl, the experience store), the advantage estimator, the KL penalty's estimator, the
    zero-advantage filter, the update and the checkpoints."""

    iterations: int
    seed: int
    run_dir: str
    val_every: int
    val_params: SamplingParams
    val_pass_k: tuple[int, ...]  # rollout.val_pass_k: the k of val/pass@k and val/mean@k
    val_env: str | None  # the environment validation episodes play when a row names none (None: prompts)
    log_samples: int
    progress: bool
    record_episodes: bool
    experience: ExperienceSpec
    advantage: B.Advantage
    kl_penalty_estimator: str
    filter_zero_advantage: bool
    routing_replay: bool  # algorithm.routing_replay: MoE samples carry the sampler's experts to the trainer
    update: UpdateSpec
    checkpoint: CheckpointSpec


def loop_spec(cfg: RunConfig) -> LoopSpec:
    """The loop's spec from the run config (the advantage estimator resolved here, once)."""
    t, a = cfg.train, cfg.algorithm
    update = UpdateSpec(
        epochs_per_rollout=t.epochs_per_rollout,
        trajectories_per_update=t.trajectories_per_update,
        shuffle_mini_batches=t.shuffle_mini_batches,
        step_on_zero_advantage=t.step_on_zero_advantage,
        other_terms=a.kl_loss_coef > 0 or a.entropy_coef != 0,
        critic_warmup_iterations=a.critic_warmup_iterations,
        old_logprobs_auto=t.old_logprobs == "auto",
    )
    return LoopSpec(
        iterations=cfg.iterations,
        seed=cfg.seed,
        run_dir=cfg.run_dir,
        val_every=cfg.val_every,
        val_params=B.sampling_params(cfg.rollout, validation=True),
        val_pass_k=tuple(cfg.rollout.val_pass_k),
        val_env=cfg.rollout.source.env if isinstance(cfg.rollout.source, EnvSourceConfig) else None,
        log_samples=cfg.tracking.log_samples,
        progress=cfg.tracking.progress,
        record_episodes=cfg.tracking.episodes,
        experience=ExperienceSpec.of(cfg),
        advantage=B.advantage_of(a),
        kl_penalty_estimator=a.kl_penalty_estimator,
        filter_zero_advantage=a.filter_zero_advantage,
        routing_replay=a.routing_replay,
        update=update,
        checkpoint=CheckpointSpec.of(cfg),
    )


@dataclass(frozen=True)
class Run:
    """The run's parts, as setup built them: what the loop reads of the config (`spec`), the data, the worker
    groups and their weight publisher, the collector (over the run's episode source), the single-turn prompts
    (ReMax's greedy baselines), the timeline.
    `colocated`: trainer and engine share the accelerator and take turns (design: colocated placement; with
    cluster.engine_sleeps=false the engine stays awake and, on Ray, generates alongside the update)."""

    spec: LoopSpec
    data: Datasets
    rollout: WorkerGroup[RolloutWorker]
    trainer: WorkerGroup[TrainerWorker]
    critic: WorkerGroup[CriticWorkerActor] | None
    publisher: Publisher
    collector: Collector
    prompts: PromptSource
    timeline: Timeline
    needs_reference: bool
    temperature: float
    colocated: bool
    replay: Replay | None = None  # the stored groups replayed (`replay.store`; `ascent.orchestrator.replay`)
    distills: bool = False  # the trainer holds a distillation teacher (`setup.distill_teacher`)
    sum_pi_squared: bool = False  # the old-logprob pass also gives Σπ² (`setup.reads_sum_pi_squared`)

    @property
    def decode(self) -> Decode:
        return self.prompts.scorer.decode

    def close(self) -> None:
        """Stop what the loop started on demand (episodes played ahead, the agent endpoint and processes, the
        environment actors)."""
        self.collector.close()


@dataclass
class LoopState:
    """What changes from one iteration to the next: the prompt sampler's position, the adaptive KL
    coefficient, and the two health watches (not saved: they start over on resume)."""

    sampler: PromptSampler
    kl_controller: KLController | None
    equal_rewards: health.EqualRewardWatch
    divergence: health.DivergenceCheck

    def state_dict(self) -> dict[str, Any]:
        """The KL coefficient (the sampler's saved position is the collector's: `Collector.sampler_state`)."""
        return {"kl_coef": None if self.kl_controller is None else self.kl_controller.coef}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Back to a checkpoint's `state`: the sampler's position and the KL coefficient."""
        self.sampler.load_state_dict(state["sampler"])
        if self.kl_controller is not None and state.get("kl_coef") is not None:
            self.kl_controller.coef = state["kl_coef"]


def initial_state(cfg: RunConfig, data: Datasets) -> LoopState:
    """The loop's state before its first iteration."""
    sampler = PromptSampler(
        len(data.train), fresh_prompts_per_step(cfg), seed=cfg.seed, shuffle=cfg.data.shuffle
    )
    facts = health.RunFacts.of(cfg)
    return LoopState(
        sampler,
        make_kl_controller(cfg.algorithm),
        health.EqualRewardWatch(facts),  # warns once when nothing is learned for a while
        health.DivergenceCheck(facts, len(data.tokenizer)),
    )


def build_run(
    cfg: RunConfig, data: Datasets, rewards: RewardRunner, groups: WorkerGroups, timeline: Timeline
) -> Run:
    """The loop's `Run` from the built parts; the episode source is chosen here, once."""
    if groups.publisher is None:  # build_worker_groups sets it once both groups are up
        raise ValueError("build_run: the worker groups have no weight publisher (setup.build_worker_groups)")
    tok = data.tokenizer
    decode = B.TextDecoder(tok)  # skips special tokens; decodes a batch's responses in one call
    scorer = Scorer(rewards, decode, build_scorers(cfg, groups, tok), cfg.reward.fn_weight)
    prompts = PromptSource(groups.rollout, scorer)
    params = B.sampling_params(cfg.rollout)
    source = _source(cfg, groups.rollout, tok, prompts, params)
    hooks = build_group_hooks(cfg.reward.group_hooks)
    collector = Collector(source, data.train, params, collect_spec(cfg), hooks)
    colocated = (
        cfg.cluster.placement == "colocated" and cfg.rollout.engine == "fast" and cfg.cluster.engine_sleeps
    )
    return Run(
        spec=loop_spec(cfg),
        data=data,
        rollout=groups.rollout,
        trainer=groups.trainer,
        critic=groups.critic,
        publisher=groups.publisher,
        collector=collector,
        prompts=prompts,
        timeline=timeline,
        needs_reference=needs_reference(cfg),
        temperature=cfg.rollout.temperature or 1.0,
        colocated=colocated,
        replay=None if (replay := ReplaySpec.of(cfg)) is None else load_replay(replay),
        distills=distill_teacher(cfg) is not None,
        sum_pi_squared=reads_sum_pi_squared(cfg),
    )


def _source(
    cfg: RunConfig,
    rollout: WorkerGroup[RolloutWorker],
    tokenizer: Any,
    prompts: PromptSource,
    params: SamplingParams,
) -> EpisodeSource:
    """The run's episode source (`rollout.source`): the agent's plays through the run's endpoint, an
    environment's episodes (one engine call per turn), or the single-turn `prompts`."""
    max_failure_rate = cfg.reward.max_failure_rate
    alongside = (
        rollout.backend == "ray" and cfg.cluster.generates_alongside
    )  # multi-turn plays ahead on a thread
    source = cfg.rollout.source
    if isinstance(source, AgentSourceConfig):
        agents = AgentPlays(AgentSetup.of(cfg), replica_generate(rollout), params, tokenizer, prompts.scorer)
        return AgentSource(agents, max_failure_rate, alongside)
    if isinstance(source, EnvSourceConfig):
        envs = EnvRunners(cfg)  # where the environments run (Ray actors: started on first use)
        return EnvSource(envs, env_episodes(source), rollout, tokenizer, max_failure_rate, alongside)
    return prompts
