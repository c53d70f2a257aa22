"""What the loop is given: `Run`, the typed parts of a run built once at setup and never changed, and
`LoopState`, the little the loop changes from one iteration to the next (what a checkpoint saves of it).

`build_run` chooses, once, where the run's episodes come from: single-turn prompts sampled on the rollout
replicas and scored with the reward function, an environment's episodes, or an agent's plays through the
run's endpoint; the collector and the validation take that choice as given.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ascent.cluster.base import WorkerGroup
from ascent.config.schema import RunConfig
from ascent.data.sampler import PromptSampler
from ascent.messages import Group, SamplingParams
from ascent.orchestrator import batch as B
from ascent.orchestrator import health
from ascent.orchestrator.agents import AgentPlays, AgentSetup, replica_generate
from ascent.orchestrator.collector import Collector, PlayBatch, Sampling
from ascent.orchestrator.episodes import EnvRunners, collect_env_groups
from ascent.orchestrator.sampling import Decode, RolloutStats, Scorer
from ascent.orchestrator.setup import Datasets, WorkerGroups, needs_reference
from ascent.orchestrator.shaping import KLController, make_kl_controller
from ascent.orchestrator.workers import CriticWorkerActor, RolloutWorker, TrainerWorker
from ascent.rewards import RewardRunner
from ascent.tracking import Timeline
from ascent.transport.publish import Publisher


@dataclass(frozen=True)
class Run:
    """The run's parts, as setup built them: the config, the data, the worker groups and their weight
    publisher, the collector (and the environments or agent it plays), the reward scorer, the timeline.
    `colocated`: trainer and engine share the accelerator and take turns (design: colocated placement; with
    cluster.engine_sleeps=false the engine stays awake and, on Ray, generates alongside the update)."""

    cfg: RunConfig
    data: Datasets
    rollout: WorkerGroup[RolloutWorker]
    trainer: WorkerGroup[TrainerWorker]
    critic: WorkerGroup[CriticWorkerActor] | None
    publisher: Publisher
    collector: Collector
    scorer: Scorer
    envs: EnvRunners
    agents: AgentPlays | None
    timeline: Timeline
    needs_reference: bool
    temperature: float
    colocated: bool

    @property
    def decode(self) -> Decode:
        return self.scorer.decode

    def close(self) -> None:
        """Stop what the loop started on demand (episodes played ahead, the agent endpoint and processes, the
        environment actors)."""
        self.collector.close()
        if self.agents is not None:
            self.agents.close()
        self.envs.close()


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
        len(data.train), cfg.rollout.prompts_per_step, seed=cfg.seed, shuffle=cfg.data.shuffle
    )
    return LoopState(
        sampler,
        make_kl_controller(cfg.algorithm),
        health.EqualRewardWatch(),  # warns once when nothing is learned for a while
        health.DivergenceCheck(cfg, len(data.tokenizer)),
    )


def build_run(
    cfg: RunConfig, data: Datasets, rewards: RewardRunner, groups: WorkerGroups, timeline: Timeline
) -> Run:
    """The loop's `Run` from the built parts; the episode source is chosen here, once."""
    if groups.publisher is None:  # build_worker_groups sets it once both groups are up
        raise ValueError("build_run: the worker groups have no weight publisher (setup.build_worker_groups)")
    tok = data.tokenizer

    def decode(ids: Sequence[int]) -> str:
        return str(tok.decode(ids, skip_special_tokens=True))

    scorer = Scorer(rewards, decode)
    envs = EnvRunners(cfg)  # where rollout.env's environments run (Ray actors: started on first use)
    params = B.sampling_params(cfg.rollout)
    agents = (
        AgentPlays(AgentSetup.of(cfg), replica_generate(groups.rollout), params, tok, scorer)
        if cfg.rollout.agent is not None
        else None
    )
    sampling = Sampling(
        groups.rollout,
        data.train,
        decode,
        params,
        cfg.seed,
        multi_turn=_multi_turn(cfg, groups.rollout, tok, envs, agents),
        alongside=groups.rollout.backend == "ray" and cfg.cluster.generates_alongside,
    )
    colocated = (
        cfg.cluster.placement == "colocated" and cfg.rollout.engine == "fast" and cfg.cluster.engine_sleeps
    )
    return Run(
        cfg=cfg,
        data=data,
        rollout=groups.rollout,
        trainer=groups.trainer,
        critic=groups.critic,
        publisher=groups.publisher,
        collector=Collector(sampling, cfg.rollout.max_staleness, cfg.rollout.stale_groups),
        scorer=scorer,
        envs=envs,
        agents=agents,
        timeline=timeline,
        needs_reference=needs_reference(cfg),
        temperature=cfg.rollout.temperature or 1.0,
        colocated=colocated,
    )


def _multi_turn(
    cfg: RunConfig,
    rollout: WorkerGroup[RolloutWorker],
    tokenizer: Any,
    envs: EnvRunners,
    agents: AgentPlays | None,
) -> PlayBatch | None:
    """How a batch of multi-turn episodes is played: the agent's plays through the run's endpoint, or the
    environment's episodes (one engine call per turn); None for single-turn prompts."""
    max_failure_rate = cfg.reward.max_failure_rate
    if agents is not None:

        def play_agent(
            items: list[Any], params: SamplingParams, seed: int
        ) -> tuple[list[Group], RolloutStats]:
            groups, stats = agents.play(items, params)
            return groups, RolloutStats(0.0, stats.metrics(max_failure_rate))

        return play_agent
    if cfg.rollout.env is not None:

        def play_env(items: list[Any], params: SamplingParams, seed: int) -> tuple[list[Group], RolloutStats]:
            return collect_env_groups(envs, rollout, tokenizer, items, params, seed=seed), RolloutStats(0.0)

        return play_env
    return None
