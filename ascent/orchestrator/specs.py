"""Builders of the specs: the run config turned into frozen, flat arguments at the edge.

Setup builds each spec once (`trainer_spec`, `critic_spec`, `engine_spec`, `reward_model_spec`,
`judge_engine_spec`, from which the worker groups construct their workers; the collector's `collect_spec`, an
env source's `env_episodes`); `ascent sft` builds its own `TrainerSpec` through the same
`policy_trainer_spec` with its own loss. No config section crosses below this module (design: "Setup builds,
the loop moves"). The spec types live next to their consumers: `TrainerSpec` and `CriticSpec` in
`ascent.trainer.settings`, `EngineSpec` in `ascent.rollout.specs`, `RewardModelSpec` in
`ascent.trainer.reward_model`, `CollectSpec` in `ascent.orchestrator.collector`.
"""

from __future__ import annotations

from ascent.algorithms import POLICY_LOSSES, options_for
from ascent.config.replay import replay_groups
from ascent.config.reward_models import RewardModelConfig
from ascent.config.schema import AlgorithmConfig, LoraConfig, ModelConfig, RunConfig, TrainConfig
from ascent.config.sources import EnvSourceConfig
from ascent.models.action_head import ActionHeadSpec
from ascent.orchestrator.collector import CollectSpec
from ascent.orchestrator.episodes import EnvEpisodes
from ascent.orchestrator.setup import distill_teacher, needs_reference
from ascent.orchestrator.shaping import Shaping
from ascent.plugins import resolve
from ascent.rollout.specs import EngineSpec
from ascent.trainer.loss import LossSettings
from ascent.trainer.reward_model import RewardModelSpec
from ascent.trainer.settings import CriticSpec, LoraSettings, OptimSettings, TrainerSpec

_CORRECTION_KEYS = {
    "rollout_correction_level": "level",
    "rollout_correction_threshold": "threshold",
    "rollout_correction_threshold_low": "threshold_low",
}


def trainer_spec(cfg: RunConfig, total_optimizer_steps: int) -> TrainerSpec:
    """The policy trainer ranks' spec: model, LoRA, AdamW and schedule, loss, micro-batching, precision."""
    return policy_trainer_spec(
        cfg.model,
        cfg.train,
        cfg.cluster.device,
        total_optimizer_steps,
        # the Dr. GRPO length divisor (algorithm.max_response_tokens_norm defaults to it): one constant for
        # every worker and micro-batch, so the gradient does not depend on how a mini-batch is split
        loss=loss_settings(cfg.algorithm, cfg.rollout.response_budget),
        temperature=cfg.rollout.temperature or 1.0,
        need_reference=needs_reference(cfg),
        teacher_path=distill_teacher(cfg),
    )


def policy_trainer_spec(
    model: ModelConfig,
    train: TrainConfig,
    device: str,
    total_optimizer_steps: int,
    *,
    loss: LossSettings,
    temperature: float,
    need_reference: bool,
    teacher_path: str | None = None,
) -> TrainerSpec:
    """A policy trainer's spec from the model and train sections, which RL and SFT share; the loss, the
    sampling temperature, whether a reference is kept and the distillation teacher are the caller's (SFT:
    `reinforce`, 1.0, none, none)."""
    return TrainerSpec(
        model_path=model.path,
        tokenizer_path=model.tokenizer_path,
        device=device,
        dtype=model.dtype,
        gradient_checkpointing=model.gradient_checkpointing,
        trust_remote_code=model.trust_remote_code,
        freeze_vision_tower=model.freeze_vision_tower,
        lora=lora_settings(model.lora),
        optim=optim_settings(train, total_optimizer_steps),
        loss=loss,
        max_tokens_per_micro_batch=train.max_tokens_per_micro_batch,
        logprob_chunk_tokens=train.logprob_chunk_tokens,
        keep_head_logits=train.keep_head_logits,
        temperature=temperature,
        need_reference=need_reference,
        teacher_path=teacher_path,
        sharding=train.sharding,
        compile=train.compile,
        attention=train.attention,
        sequence_parallel=train.sequence_parallel,
        action_head=action_head_spec(model),
    )


def critic_spec(cfg: RunConfig, total_optimizer_steps: int) -> CriticSpec:
    """The critic ranks' spec: the policy's checkpoint and precision, `algorithm.critic_lr` on the policy's
    AdamW settings and schedule, `algorithm.value_clip`."""
    m, t = cfg.model, cfg.train
    return CriticSpec(
        model_path=m.path,
        device=cfg.cluster.device,
        dtype=m.dtype,
        gradient_checkpointing=m.gradient_checkpointing,
        trust_remote_code=m.trust_remote_code,
        optim=optim_settings(t, total_optimizer_steps, lr=cfg.algorithm.critic_lr),
        value_clip=cfg.algorithm.value_clip,
        max_tokens_per_micro_batch=t.max_tokens_per_micro_batch,
        sharding=t.sharding,
    )


def engine_spec(cfg: RunConfig) -> EngineSpec:
    """The rollout replicas' spec (`rollout.engine` picks the builder; each gets only its own settings)."""
    m, r = cfg.model, cfg.rollout
    reference = r.engine == "reference"
    return EngineSpec(
        name=r.engine,
        model_path=m.path,
        tokenizer_path=m.tokenizer_path or m.path,
        dtype=m.dtype,
        device=cfg.cluster.device,
        trust_remote_code=m.trust_remote_code,
        generation_batch_size=r.generation_batch_size if reference else None,
        gpu_memory_fraction=None if reference else r.gpu_memory_fraction,
        on_swap=None if reference else ("restart" if r.swap_mid_generation == "restart" else "continue"),
        tensor_parallel=None if reference else r.tensor_parallel,
        prefix_caching=None if reference else r.prefix_caching,
        batch_invariant=None if reference else r.batch_invariant,
        shared_prefix=None if reference else r.shared_prefix_attention,
        quantization=None if reference else r.quantization,
        action_head=action_head_spec(m),
    )


def action_head_spec(model: ModelConfig) -> ActionHeadSpec | None:
    """`model.action_head` as the trainer's and the engine's flat spec (None without a head)."""
    h = model.action_head
    return (
        None
        if h is None
        else ActionHeadSpec(dim=h.dim, chunk=h.chunk, init_std=h.init_std, token_id=h.token_id)
    )


def reward_model_spec(model: RewardModelConfig, device: str) -> RewardModelSpec:
    """The reward model's workers' spec (`reward.model`), on the run's `cluster.device`."""
    return RewardModelSpec(
        path=model.path,
        device=device,
        dtype=model.dtype,
        max_tokens_per_batch=model.max_tokens_per_batch,
        chat_template=model.chat_template,
    )


def judge_engine_spec(cfg: RunConfig) -> EngineSpec | None:
    """The judge's own engine (`reward.judge.engine`) of `reward.judge.model`'s checkpoint, never sent weights,
    or with `policy@N` of model.path, sent version N once (`ascent.transport.pinned`); None when the judge
    is the policy's replicas (or there is no judge)."""
    judge, m = cfg.reward.judge, cfg.model
    if judge is None or judge.model == "policy":
        return None
    pinned, fast = judge.pinned_version is not None, judge.engine == "fast"
    return EngineSpec(
        name=judge.engine,
        model_path=m.path if pinned else judge.model,
        tokenizer_path=(m.tokenizer_path or m.path) if pinned else judge.model,
        dtype=m.dtype,
        device=cfg.cluster.device,
        trust_remote_code=m.trust_remote_code if pinned else False,
        generation_batch_size=None if fast else cfg.rollout.generation_batch_size,
        gpu_memory_fraction=judge.gpu_memory_fraction if fast else None,
    )


def lora_settings(lora: LoraConfig) -> LoraSettings:
    return LoraSettings(
        lora.rank,
        lora.alpha,
        lora.dropout,
        tuple(lora.target_modules),
        lora.save_merged,
        publish_adapter=lora.publish == "adapter",
    )


def optim_settings(train: TrainConfig, total_optimizer_steps: int, lr: float | None = None) -> OptimSettings:
    """AdamW and the LR schedule of `train`; `lr` overrides `train.lr` (the critic's
    `algorithm.critic_lr`)."""
    t = train
    return OptimSettings(
        lr=t.lr if lr is None else lr,
        weight_decay=t.weight_decay,
        betas=t.betas,
        eps=t.eps,
        warmup_steps=t.warmup_steps,
        schedule=t.schedule,
        min_lr_ratio=t.min_lr_ratio,
        total_steps=total_optimizer_steps,
        max_grad_norm=t.max_grad_norm,
        offload=t.offload_optimizer,
    )


def loss_settings(algo: AlgorithmConfig, max_new_tokens: int | None = None) -> LossSettings:
    """The loss options of `algo`: policy loss, KL, entropy, Dr. GRPO divisor, rollout correction.

    The policy loss gets the settings it names as parameters (its own fields in `algorithm.policy_loss`:
    clip ratios, dual-clip, gspo/cispo/sapo settings; a plug-in's `algorithm.options`), picked by
    `options_for` from `AlgorithmConfig.settings_for`; a plug-in taking `**kwargs` gets them all.
    """
    fields = algo.model_dump()
    loss = algo.policy_loss
    loss_opts = options_for(
        resolve(POLICY_LOSSES, loss.name, "algorithm.policy_loss"), algo.settings_for(loss)
    )
    mode = algo.rollout_correction
    correction = {
        short: fields[key] for key, short in _CORRECTION_KEYS.items() if fields.get(key) is not None
    }
    return LossSettings(
        policy_loss=loss.name,
        loss_aggregation=algo.loss_aggregation,
        loss_opts=loss_opts,
        kl_loss_coef=algo.kl_loss_coef,
        kl_estimator=algo.kl_estimator,
        entropy_coef=algo.entropy_coef,
        max_len=algo.max_response_tokens_norm or max_new_tokens,
        rollout_correction=None if mode in (None, "none") else mode,
        correction_opts=correction,
    )


def collect_spec(cfg: RunConfig) -> CollectSpec:
    """The collector's spec: batch sizes, staleness, DAPO dynamic sampling, ReMax's baseline, shaping. With
    replay the collector samples only the fresh groups (`fresh_prompts_per_step`)."""
    a, r = cfg.algorithm, cfg.rollout
    shaping = Shaping(r.max_new_tokens, a.overlong_buffer, a.overlong_penalty, a.mask_truncated)
    return CollectSpec(
        prompts_per_step=fresh_prompts_per_step(cfg),
        seed=cfg.seed,
        max_staleness=r.max_staleness,
        stale_groups=r.stale_groups,
        max_sample_batches=a.max_sample_batches,
        dynamic_sampling=a.dynamic_sampling,
        greedy_baseline=a.advantage.name == "remax",
        shaping=shaping,
    )


def fresh_prompts_per_step(cfg: RunConfig) -> int:
    """The groups an iteration samples fresh: `rollout.prompts_per_step` less those replayed (`replay`)."""
    return cfg.rollout.prompts_per_step - replay_groups(cfg)


def env_episodes(source: EnvSourceConfig) -> EnvEpisodes:
    """An env source's episodes: its environment, the cuts at max_turns and max_episode_tokens, and the
    simulator copies a worker steps together."""
    return EnvEpisodes(source.env, source.max_turns, source.max_episode_tokens, source.sims_per_worker)
