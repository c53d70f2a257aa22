"""The typed run configuration: one pydantic model per section, every field with a default and a description.

Imports without torch (the controller and `ascent config show` must start fast). Builders elsewhere turn a
section into flat arguments; components never read this global object. Units follow the design: batch
sizes carry their unit in their name (prompts, trajectories, tokens).
"""

from __future__ import annotations

import logging
from typing import Any, Literal

from pydantic import Field, model_validator

from ascent.config.choices import (
    AdvantageChoice,
    Choice,
    GrpoAdvantage,
    PluginChoice,
    PolicyLossChoice,
    PpoLoss,
)
from ascent.config.cluster import ClusterConfig
from ascent.config.errors import rule_error
from ascent.config.group_hooks import GroupHookChoice
from ascent.config.model import Dtype, LoraConfig, ModelConfig
from ascent.config.nesting import misplaced_options, nest_choices
from ascent.config.processors import ProcessorChoice
from ascent.config.replay import ReplayConfig
from ascent.config.reward_models import RewardModelsMixin
from ascent.config.rollout import RolloutConfig
from ascent.config.rules import check_run_config, check_sft_config  # rules imports schema for types only
from ascent.config.section import Section

SEED_MAX = 2**32 - 1  # numpy's seeds are 32-bit; torch.manual_seed overflows past 64

log = logging.getLogger("ascent")

__all__ = [
    "ClusterConfig",
    "Dtype",
    "LoraConfig",
    "ModelConfig",
    "RolloutConfig",
    "Section",
]  # re-exported: every section is importable from here


class DataConfig(Section):
    train_path: str = Field("", description="Training prompts: a .jsonl or .parquet file.")
    val_path: str | None = Field(None, description="Held-out prompts for validation (.jsonl or .parquet).")
    max_prompt_tokens: int = Field(512, gt=0, description="Longest prompt in tokens after the chat template.")
    overlong_prompts: Literal["drop", "truncate", "error"] = Field(
        "drop", description="What to do with prompts over max_prompt_tokens (the count is always reported)."
    )
    truncation_side: Literal["left", "right"] = Field("left", description="Which end `truncate` cuts.")
    chat_template: bool = Field(
        True, description="Render string prompts as a user message with the tokenizer's chat template."
    )
    shuffle: bool = Field(True, description="Shuffle training prompts each epoch (seeded by `seed`).")
    max_val_prompts: int | None = Field(None, gt=0, description="Use at most this many validation prompts.")
    prompt_key: str = Field(
        "prompt", min_length=1, description="The column that holds each row's prompt (e.g. `question`)."
    )
    answer_key: str = Field(
        "answer", min_length=1, description="The column the reward reads as `answer` (e.g. `solution`)."
    )
    system_prompt: str | None = Field(
        None,
        description="A system message put before every prompt (string prompts become [system, user]); a row "
        "that already starts with a system message is refused. Needs data.chat_template=true and "
        "rollout.source=prompt.",
    )
    split: str | None = Field(
        None,
        description="The split to read when train_path / val_path is a Hugging Face `datasets` directory "
        "(save_to_disk) that holds several (a DatasetDict); null: the directory's only split.",
    )
    processors: list[ProcessorChoice] = Field(
        default_factory=list,
        description="Steps run in order on the loaded training rows before sampling: filter (a predicate "
        "plug-in), transform (a row plug-in), difficulty (keep pass rates in [low, high]) or an import path "
        "(rows -> rows). See ascent.config.processors.",
    )


class RewardConfig(RewardModelsMixin):
    fn: str = Field(
        "exact_match",
        description="Reward function: a built-in name (exact_match, numeric_match, math_verify, gsm8k, "
        "format) or an import path `pkg.module:function`.",
    )
    kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments passed to the function."
    )
    max_failure_rate: float = Field(
        0.05, ge=0, le=1, description="Abort when more than this share of one iteration's rewards raise."
    )
    isolation: Literal["process", "inline"] = Field(
        "process",
        description="`process`: reward functions run in worker processes with a per-call timeout, so one "
        "that raises, exits, hangs or crashes costs that sample only. `inline`: in the controller's process "
        "(no timeout; `breakpoint()` works), for debugging.",
    )
    timeout_s: float = Field(
        30.0,
        gt=0,
        description="Seconds one reward call may take (isolation=process); past it, the sample gets 0.",
    )
    num_workers: int | None = Field(
        None, gt=0, description="Reward worker processes (isolation=process); null: min(4, CPU count)."
    )
    memory_limit_mb: int = Field(
        8192,
        ge=0,
        description="MiB of memory each reward worker process may use (isolation=process): its private "
        "writable memory (RLIMIT_DATA: heap, arrays, thread stacks; not shared libraries nor address space "
        "merely reserved), also for each process it starts. An allocation past it raises MemoryError in "
        "the reward function, which costs that sample only (reward 0, counted in reward/failures); the "
        "worker serves on. 0: no limit.",
    )
    group_hooks: list[GroupHookChoice] = Field(
        default_factory=list,
        description="Shaping and filters that see a whole group, run in order on each scored batch: built-in "
        "names (curiosity, length_penalty, difficulty_filter) or import paths, each a name or "
        "{name: ..., <its settings>} (a plug-in's under kwargs); see ascent.rewards.group_hooks.",
    )


class AlgorithmConfig(Section):
    advantage: AdvantageChoice = Field(
        default_factory=GrpoAdvantage,
        description="Advantage estimator: a name (grpo, rloo, opo, gpg, grpo_passk, passk, reinforce_pp, "
        "reinforce_pp_baseline, remax, gae, distill, optimal_token_baseline) or an import path, or {name: ..., <its own settings>}.",
    )
    policy_loss: PolicyLossChoice = Field(
        default_factory=PpoLoss,
        description="Policy loss: a name (ppo, gspo, cispo, sapo, reinforce, gmpo, dro, clip_cov, kl_cov) or "
        "an import path, or {name: ..., <its own settings>}.",
    )
    loss_aggregation: str = Field("token-mean", description="How per-token losses become one number.")
    max_response_tokens_norm: int | None = Field(
        None,
        gt=0,
        description="Length divisor of `seq-mean-token-sum-norm`; defaults to rollout.max_new_tokens.",
    )
    kl_loss_coef: float = Field(0.0, ge=0, description="Weight of KL(policy || reference) as a loss term.")
    teacher: str | None = Field(
        None,
        description="On-policy distillation (advantage=distill): the teacher's checkpoint directory, held "
        "frozen by the trainer and scored like the reference model; it must share model.path's tokenizer.",
    )
    kl_estimator: str = Field("k3", description="KL estimator: k1, k2, k3, k1+ or k3+ (straight-through).")
    entropy_coef: float = Field(0.0, description="Entropy bonus weight (0 keeps entropy as a metric only).")
    adv_eps: float = Field(1e-6, gt=0, description="Epsilon added to std denominators (GRPO, whitening).")
    # Rollout correction (sampler vs trainer probabilities).
    rollout_correction: Literal["none", "tis", "mis"] = Field(
        "none", description="Importance-weight the loss by trainer/sampler probability: truncated or masked."
    )
    rollout_correction_level: Literal["token", "sequence", "geometric"] = Field(
        "token", description="Weight per token, per sequence (product) or per sequence (geometric mean)."
    )
    rollout_correction_threshold: float = Field(
        2.0, gt=0, description="TIS cap / MIS upper bound of the weight."
    )
    rollout_correction_threshold_low: float | None = Field(
        None, ge=0, description="MIS: also mask weights below this (null: no lower bound)."
    )
    routing_replay: bool = Field(
        True,
        description="Mixture-of-experts policies: the trainer's forward uses the experts the rollout engine "
        "chose for each token (recorded by the reference engine), its own router weighting them, so the "
        "sampler/trainer logprob gap stays as small as a dense model's. false: the trainer routes itself. "
        "No effect on dense models.",
    )
    # KL as a reward penalty (PPO / REINFORCE++ style; kl_loss_coef is the loss-term alternative).
    kl_penalty_coef: float = Field(
        0.0, ge=0, description="Initial weight of the per-token KL penalty in the reward."
    )
    kl_penalty_estimator: str = Field("k1", description="KL estimator of the reward penalty (k1, k2, k3).")
    kl_target: float | None = Field(
        None, gt=0, description="Adaptive KL coef toward this KL; null keeps it fixed."
    )
    kl_horizon: int = Field(10000, gt=0, description="Adaptive KL horizon in trajectories (Ziegler et al.).")
    # DAPO and filters.
    dynamic_sampling: bool = Field(False, description="DAPO: drop groups of equal rewards and sample more.")
    max_sample_batches: int = Field(
        10, gt=0, description="Dynamic sampling: most generation rounds per step."
    )
    overlong_buffer: int = Field(
        0, ge=0, description="DAPO: soft length penalty over the last N tokens (0: off)."
    )
    overlong_penalty: float = Field(1.0, ge=0, description="DAPO: the penalty at max_new_tokens.")
    mask_truncated: bool = Field(False, description="Drop truncated responses (finish=length) from the loss.")
    filter_zero_advantage: bool = Field(False, description="Skip trajectories whose advantages are all zero.")
    # Critic (only gae uses one).
    use_critic: bool | None = Field(
        None, description="Train a value model; null: exactly when advantage=gae."
    )
    critic_lr: float = Field(1e-5, gt=0, description="Critic learning rate.")
    value_clip: float | None = Field(0.2, gt=0, description="Clip range of the value loss; null disables.")
    critic_warmup_iterations: int = Field(0, ge=0, description="Iterations that train only the critic first.")
    options: dict[str, Any] = Field(
        default_factory=dict,
        description=(
            "A plug-in's own settings (keyword arguments), under names none of ascent's settings use."
        ),
    )

    @model_validator(mode="before")
    @classmethod
    def _nest_choices(cls, data: Any) -> Any:
        """Older flat settings (`clip_ratio_high: 0.28`) move into the chosen choice (see choices.py)."""
        if not isinstance(data, dict):
            return data
        nested = nest_choices(data)
        problems = nested.problems + misplaced_options(nested.data, cls.model_fields)
        if problems:
            raise rule_error(problems)
        for warning in nested.warnings:
            log.warning("%s", warning)
        return nested.data

    def settings_for(self, choice: Choice) -> dict[str, Any]:
        """What `options_for` may hand the function of `choice` (self.policy_loss or self.advantage): this
        section's shared settings and the choice's own fields; for a plug-in, `options` too (whose keys
        cannot be any of those: `misplaced_options` refuses them)."""
        shared = self.model_dump(exclude={"policy_loss", "advantage", "options"})
        own = self.options if isinstance(choice, PluginChoice) else {}
        return shared | choice.model_dump(exclude={"name"}) | own


class TrainConfig(Section):
    lr: float = Field(1e-6, gt=0, description="Peak learning rate of AdamW.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW betas.")
    eps: float = Field(1e-8, gt=0, description="AdamW epsilon.")
    warmup_steps: int = Field(0, ge=0, description="Optimizer steps of linear warm-up.")
    schedule: Literal["constant", "cosine"] = Field("constant", description="LR schedule after warm-up.")
    min_lr_ratio: float = Field(0.0, ge=0, le=1, description="Cosine floor as a fraction of lr.")
    max_grad_norm: float | None = Field(
        1.0, gt=0, allow_inf_nan=True, description="Clip the gradient norm; null disables."
    )
    step_on_zero_advantage: bool = Field(
        False,
        description="Take the optimizer step of a mini-batch whose advantages are all zero on its sampled "
        "tokens (every group of equal reward). false: such a mini-batch has no gradient to follow, so it is "
        "not stepped (AdamW momentum and weight decay would still move the weights): weights, optimizer and "
        "the LR schedule stay (the schedule counts steps taken), train/skipped_steps counts it. It is still "
        "stepped when algorithm.kl_loss_coef > 0 or algorithm.entropy_coef != 0 (those terms have a gradient "
        "of their own). Set true for the old behaviour, or for a plug-in policy loss with a term that does "
        "not scale with the advantage.",
    )
    epochs_per_rollout: int = Field(1, gt=0, description="Passes over one iteration's trajectories.")
    trajectories_per_update: int = Field(
        64, gt=0, description="Trajectories per optimizer step (mini-batch)."
    )
    max_tokens_per_micro_batch: int = Field(
        8192, gt=0, description="Token budget of one forward pass; sequences are packed up to it."
    )
    logprob_chunk_tokens: int = Field(
        1024,
        gt=0,
        description="Tokens per chunk when computing logprobs/entropy (bounds [tokens, vocab] memory).",
    )
    keep_head_logits: bool = Field(
        False,
        description="The update keeps the LM head's logits of a micro-batch's response tokens from the "
        "forward (compute dtype: [response tokens, vocab], e.g. 4.6 GiB at 16k tokens and a 152k "
        "vocabulary) and its backward reads them instead of recomputing them: one head matmul of three "
        "fewer (2-3% of a 0.5B-1.5B update on an H200). `ascent doctor` counts the memory.",
    )
    shuffle_mini_batches: bool = Field(True, description="Shuffle trajectories between mini-batches.")
    sharding: Literal["none", "fsdp"] = Field(
        "none",
        description="Trainer weights across ranks: `none` replicates them (gradients all-reduced), `fsdp` "
        "shards weights, gradients and AdamW state with FSDP2 (needs several trainer ranks; not with fp16). "
        "With LoRA the frozen base and the adapters are both sharded. Its checkpoints resume on any number "
        "of trainer ranks (see checkpoint.hf_weights).",
    )
    offload_optimizer: bool = Field(
        False,
        description="Keep AdamW moments and fp32 master weights on the CPU (less GPU memory, slower step).",
    )
    old_logprobs: Literal["auto", "recompute"] = Field(
        "auto",
        description="`auto`: when an iteration takes exactly one optimizer step on fresh samples (one epoch, "
        "one mini-batch, no KL penalty in the reward), the update's own logprobs (detached) are the old "
        "logprobs and the separate forward pass is skipped (the same math: ratio 1). `recompute`: always "
        "run that pass first.",
    )
    attention: Literal["auto", "varlen", "sdpa"] = Field(
        "auto",
        description="Attention of the trainer's packed micro-batches: `varlen` (flash varlen kernels, only "
        "each sequence's own causal triangle; CUDA with bf16/fp16), `sdpa` (transformers' SDPA with a dense "
        "block-causal mask). `auto`: varlen where it can run, else sdpa.",
    )
    compile: Literal["auto", "on", "off"] = Field(
        "auto",
        description="torch.compile each decoder layer and the logprob head of the trainer (fuses the "
        "elementwise work around the matmuls). `auto`: on for CUDA, off on CPU.",
    )
    sequence_parallel: int = Field(
        1,
        gt=0,
        description="Trainer ranks that share every packed micro-batch (Ulysses sequence parallelism: each "
        "holds 1/N of its tokens; attention heads are split across the N ranks by an all-to-all), so one "
        "long episode fits. The trainer ranks form cluster.num_trainer_workers / N data-parallel groups "
        "(FSDP, when on, still shards over all ranks); the model's attention heads must split N ways. "
        "train.max_tokens_per_micro_batch stays the budget of the whole packed row.",
    )


class CheckpointConfig(Section):
    every: int = Field(0, ge=0, description="Save every K iterations (0: only at the end).")
    keep_last: int = Field(2, gt=0, description="How many checkpoints to keep.")
    save_optimizer: bool = Field(
        True,
        description="Save optimizer state (needed for exact resume). Sharded runs write it as each rank's "
        "shards (optimizer_shards/, torch.distributed.checkpoint), unsharded ones into trainer_state.pt.",
    )
    hf_weights: Literal["every", "last"] = Field(
        "every",
        description="Sharded runs (train.sharding=fsdp) resume from each rank's own shards, written by "
        "torch.distributed.checkpoint with nothing gathered: model_shards/ (LoRA: adapter_shards/, the base "
        "is model.path), optimizer_shards/, rng_rank*.pt; any number of trainer ranks, sharded or not, can "
        "load them. The exports, which rank 0 must gather (Hugging Face weights; LoRA: the PEFT adapter/ "
        "and, with model.lora.save_merged, merged weights), go into every checkpoint (every) or only the "
        "run's last one and `final` (last: for large models). Unsharded runs always write them: they are "
        "their resume state.",
    )
    on_interrupt: bool = Field(
        True,
        description="On SIGTERM/SIGINT (preemption, Ctrl-C), finish the current iteration or step, write a "
        "checkpoint and exit with 128 + the signal number; false: exit there without one.",
    )


class TrackingConfig(Section):
    tensorboard: bool = Field(True, description="Write TensorBoard event files under <run_dir>/tensorboard.")
    wandb_project: str | None = Field(
        None,
        description="Also log to this Weights & Biases project (needs `pip install wandb`; online mode needs "
        "`wandb login` or WANDB_API_KEY). A resumed run continues the same W&B run.",
    )
    wandb_mode: Literal["online", "offline"] = Field(
        "online",
        description="W&B `offline` writes the run under <run_dir>/wandb without a key or network (upload it "
        "later with `wandb sync`); `online` streams to the W&B server.",
    )
    mlflow_uri: str | None = Field(
        None,
        description="Also log to MLflow at this tracking URI: an http(s) server, or a local directory/file: "
        "URI (needs `pip install mlflow-skinny`). Params are the flattened config; a resumed run continues "
        "the same MLflow run. An unreachable URI stops the run at start-up.",
    )
    mlflow_experiment: str | None = Field(
        None, description="MLflow experiment to log into (created if missing; null: MLflow's `Default`)."
    )
    http_proxy: str | None = Field(
        None,
        description="Proxy URL (e.g. http://proxy:3128) for the W&B and MLflow connections only; the rest of "
        "the run does not use it.",
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        "info", description="Level of the `ascent` loggers: the console and <run_dir>/logs/*.log."
    )
    progress: bool = Field(True, description="Show a live progress bar.")
    trace: bool = Field(True, description="Write a Chrome-trace timeline of each iteration's phases.")
    log_samples: int = Field(2, ge=0, description="Print this many sample responses at every validation.")
    episodes: bool = Field(
        True,
        description="Append one line per trained episode to episodes.jsonl: iteration, group, row, the "
        "policy versions its tokens were sampled with, staleness, reward, finish reason, length.",
    )
    experience_store: bool = Field(
        True,
        description="Record every episode in <run_dir>/experience.db (SQLite): text, token ids, loss mask, "
        "logprobs, versions, rewards and whether it was trained on or dropped (stale, filtered); written on "
        "a background thread. Read it with `ascent episodes RUN_DIR` or "
        "ascent.tracking.experience_store.open_store.",
    )


class RunConfig(Section):
    """The `ascent train` configuration."""

    run_dir: str = Field(
        "runs/default", min_length=1, description="Directory for checkpoints, metrics and logs."
    )
    seed: int = Field(0, ge=0, le=SEED_MAX, description="Seed of data order, sampling and initialisation.")
    iterations: int = Field(10, gt=0, description="RL iterations (rollout + update) to run.")
    val_every: int = Field(0, ge=0, description="Validate every K iterations (0: only before and after).")
    resume: bool = Field(False, description="Continue from the newest checkpoint in run_dir.")
    model: ModelConfig = Field(default_factory=ModelConfig, description="The policy checkpoint.")
    data: DataConfig = Field(default_factory=DataConfig, description="Prompt datasets.")
    rollout: RolloutConfig = Field(default_factory=RolloutConfig, description="Sampling.")
    reward: RewardConfig = Field(default_factory=RewardConfig, description="Reward function.")
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig, description="RL algorithm.")
    train: TrainConfig = Field(default_factory=TrainConfig, description="Optimizer and batching.")
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig, description="Checkpointing.")
    tracking: TrackingConfig = Field(default_factory=TrackingConfig, description="Metrics and logs.")
    cluster: ClusterConfig = Field(default_factory=ClusterConfig, description="Workers and placement.")
    replay: ReplayConfig = Field(
        default_factory=ReplayConfig, description="Replay of stored groups mixed with fresh ones."
    )

    @property
    def trajectories_per_step(self) -> int:
        return self.rollout.prompts_per_step * self.rollout.samples_per_prompt

    @model_validator(mode="after")
    def _cross_field_rules(self) -> RunConfig:
        check_run_config(self)
        return self


class SFTConfig(Section):
    """The `ascent sft` configuration: supervised warm-start on prompt/response pairs."""

    run_dir: str = Field(
        "runs/sft", min_length=1, description="Output directory (checkpoints, metrics, logs)."
    )
    seed: int = Field(0, ge=0, le=SEED_MAX, description="Seed of data order and initialisation.")
    epochs: float = Field(1.0, gt=0, description="Passes over the training pairs (fractions allowed).")
    batch_size: int = Field(32, gt=0, description="Prompt/response pairs per optimizer step.")
    response_key: str = Field("response", description="Row field holding the target response.")
    turn_end_loss: bool = Field(
        True,
        description="Train the end-of-turn token (EOS, e.g. <|im_end|>) closing each response and assistant "
        "turn; false leaves it out of the loss (still in the ids). An assistant message's own `weight: 0` "
        "leaves that whole turn out.",
    )
    val_every: int = Field(
        0, ge=0, description="Evaluate on data.val_path every K optimizer steps (0: at end)."
    )
    resume: bool = Field(False, description="Continue from the newest checkpoint in run_dir.")
    model: ModelConfig = Field(default_factory=ModelConfig, description="The model to fine-tune.")
    data: DataConfig = Field(default_factory=DataConfig, description="Prompt/response pairs.")
    train: TrainConfig = Field(
        default_factory=lambda: TrainConfig(lr=1e-4), description="Optimizer and batching."
    )
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig, description="Checkpointing.")
    tracking: TrackingConfig = Field(default_factory=TrackingConfig, description="Metrics and logs.")
    cluster: ClusterConfig = Field(
        default_factory=ClusterConfig,
        description="Trainer ranks: num_trainer_workers on Ray (gpus_per_worker each), inline: one.",
    )

    @model_validator(mode="after")
    def _no_rl_fields(self) -> SFTConfig:
        check_sft_config(self)
        return self
