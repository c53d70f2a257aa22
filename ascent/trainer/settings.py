"""The specs a trainer rank is built from: frozen, flat settings of the policy and the critic workers.

Setup turns the config into these once (`ascent.orchestrator.specs`; `ascent sft` builds its own
`TrainerSpec`) and hands them to the worker classes (design: "Setup builds, the loop moves"); nothing in
`ascent.trainer` reads a config section. They are plain frozen dataclasses, so they pickle to Ray actors.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ascent.models.action_head import ActionHeadSpec
from ascent.trainer.loss import LossSettings


@dataclass(frozen=True)
class LoraSettings:
    """LoRA adapters (rank 0 disables). `save_merged`: checkpoints also hold merged HF weights.
    `publish_adapter`: publications send the adapter only (`PolicyWorker.named_weights`)."""

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
    publish_adapter: bool = False


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


@dataclass(frozen=True)
class TrainerSpec:
    """Everything one policy trainer rank is built from (`PolicyWorker.from_spec`).

    `device` is resolved by the rank itself ("auto": its GPU, else the CPU). `need_reference`: hold a frozen
    copy of the initial policy for a KL term (with LoRA the base with adapters off serves, never a copy).
    `attention` picks the packed micro-batches' kernels (`ascent.models.varlen.enable_for_training`).
    `freeze_vision_tower`: a vision-language policy trains its language model only. `teacher_path`: hold a
    frozen teacher of that checkpoint (on-policy distillation), scored like the reference.
    `sequence_parallel`: ranks that share every packed row (`ascent.trainer.sequence_parallel`). `action_head`:
    the policy carries a continuous action head (`ascent.models.action_head`), trained with it.
    """

    model_path: str
    tokenizer_path: str | None = None
    device: str = "auto"
    dtype: str = "fp32"
    gradient_checkpointing: bool = False
    trust_remote_code: bool = False
    freeze_vision_tower: bool = False
    lora: LoraSettings = field(default_factory=LoraSettings)
    optim: OptimSettings = field(default_factory=OptimSettings)
    loss: LossSettings = field(default_factory=LossSettings)
    max_tokens_per_micro_batch: int = 8192
    logprob_chunk_tokens: int = 1024
    keep_head_logits: bool = False
    temperature: float = 1.0
    need_reference: bool = False
    teacher_path: str | None = None
    sharding: str = "none"
    compile: str = "off"
    attention: str = "auto"
    sequence_parallel: int = 1
    action_head: ActionHeadSpec | None = None


@dataclass(frozen=True)
class CriticSpec:
    """Everything one critic rank is built from (`CriticWorker.from_spec`): the value model's backbone
    checkpoint, its precision, AdamW and schedule (`optim.lr`: the critic's own), and the value-loss clip."""

    model_path: str
    device: str = "auto"
    dtype: str = "fp32"
    gradient_checkpointing: bool = False
    trust_remote_code: bool = False
    optim: OptimSettings = field(default_factory=lambda: OptimSettings(lr=1e-5))
    value_clip: float | None = 0.2
    max_tokens_per_micro_batch: int = 8192
    sharding: str = "none"
