"""Flat settings of the policy worker, and the one builder that reads config objects (design: "Config objects
stop at the edge").

`settings_from_config(model_cfg, train_cfg, algo_cfg, ...)` turns ModelConfig / TrainConfig / AlgorithmConfig
into the keyword arguments of `PolicyWorker`; nothing else in `ascent.trainer` reads a config object.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ascent.trainer.loss import LossSettings

_CORRECTION_KEYS = {
    "rollout_correction_level": "level",
    "rollout_correction_threshold": "threshold",
    "rollout_correction_threshold_low": "threshold_low",
}


@dataclass(frozen=True)
class LoraSettings:
    """LoRA adapters (rank 0 disables). `save_merged`: checkpoints also hold merged HF weights."""

    rank: int = 0
    alpha: float = 16.0
    dropout: float = 0.0
    target_modules: tuple[str, ...] = (
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    )
    save_merged: bool = True


@dataclass(frozen=True)
class OptimSettings:
    """AdamW and LR schedule; `total_steps` = optimizer steps of the whole run (needed by cosine).

    `offload`: AdamW state and fp32 masters on the CPU (`ascent.trainer.offload`).
    """

    lr: float = 1e-6
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    warmup_steps: int = 0
    schedule: str = "constant"
    min_lr_ratio: float = 0.0
    total_steps: int = 0
    max_grad_norm: float | None = 1.0
    offload: bool = False

    def optimizer_kwargs(self) -> dict[str, Any]:
        return {
            "lr": self.lr,
            "weight_decay": self.weight_decay,
            "betas": tuple(self.betas),
            "eps": self.eps,
            "offload": self.offload,
        }

    def scheduler_kwargs(self) -> dict[str, Any]:
        return {
            "total_steps": self.total_steps,
            "warmup_steps": self.warmup_steps,
            "schedule": self.schedule,
            "min_lr_ratio": self.min_lr_ratio,
        }


def model_settings_from_config(model_cfg: Any) -> dict[str, Any]:
    """ModelConfig -> the loading keywords both workers take: dtype, gradient_checkpointing, trust_remote_code."""
    return {
        "dtype": model_cfg.dtype,
        "gradient_checkpointing": model_cfg.gradient_checkpointing,
        "trust_remote_code": model_cfg.trust_remote_code,
    }


def optim_settings_from_config(
    train_cfg: Any, total_optimizer_steps: int, lr: float | None = None
) -> OptimSettings:
    """TrainConfig -> OptimSettings; `lr` overrides `train_cfg.lr` (the critic's `algorithm.critic_lr`)."""
    t = train_cfg
    return OptimSettings(
        lr=t.lr if lr is None else lr,
        weight_decay=t.weight_decay,
        betas=tuple(t.betas),
        eps=t.eps,
        warmup_steps=t.warmup_steps,
        schedule=t.schedule,
        min_lr_ratio=t.min_lr_ratio,
        total_steps=total_optimizer_steps,
        max_grad_norm=t.max_grad_norm,
        offload=t.offload_optimizer,
    )


def loss_settings_from_config(algo_cfg: Any, max_new_tokens: int | None = None) -> LossSettings:
    """AlgorithmConfig -> LossSettings (policy-loss options, KL, entropy, Dr. GRPO divisor, correction).

    The policy loss gets the settings it names as parameters (its own fields in `algorithm.policy_loss`:
    clip ratios, dual-clip, gspo/cispo/sapo settings; a plug-in's `algorithm.options`), picked by
    `options_for` from `AlgorithmConfig.settings_for`; a plug-in taking `**kwargs` gets them all.
    """
    from ascent.algorithms import POLICY_LOSSES, options_for
    from ascent.plugins import resolve

    fields = algo_cfg.model_dump()
    loss = algo_cfg.policy_loss
    loss_opts = options_for(
        resolve(POLICY_LOSSES, loss.name, "algorithm.policy_loss"), algo_cfg.settings_for(loss)
    )
    mode = algo_cfg.rollout_correction
    correction = {
        short: fields[key] for key, short in _CORRECTION_KEYS.items() if fields.get(key) is not None
    }
    return LossSettings(
        policy_loss=loss.name,
        loss_aggregation=algo_cfg.loss_aggregation,
        loss_opts=loss_opts,
        kl_loss_coef=algo_cfg.kl_loss_coef,
        kl_estimator=algo_cfg.kl_estimator,
        entropy_coef=algo_cfg.entropy_coef,
        max_len=algo_cfg.max_response_tokens_norm or max_new_tokens,
        rollout_correction=None if mode in (None, "none") else mode,
        correction_opts=correction,
    )


def settings_from_config(
    model_cfg: Any,
    train_cfg: Any,
    algo_cfg: Any,
    total_optimizer_steps: int,
    max_new_tokens: int | None = None,
) -> dict[str, Any]:
    """ModelConfig, TrainConfig, AlgorithmConfig -> PolicyWorker keyword arguments (all but path/device)."""
    lo = model_cfg.lora
    t = train_cfg
    return {
        **model_settings_from_config(model_cfg),
        "tokenizer_path": model_cfg.tokenizer_path,
        "lora": LoraSettings(lo.rank, lo.alpha, lo.dropout, tuple(lo.target_modules), lo.save_merged),
        "optim": optim_settings_from_config(t, total_optimizer_steps),
        "loss": loss_settings_from_config(algo_cfg, max_new_tokens),
        "max_tokens_per_micro_batch": t.max_tokens_per_micro_batch,
        "logprob_chunk_tokens": t.logprob_chunk_tokens,
        "sharding": t.sharding,
        "compile": t.compile,
    }
