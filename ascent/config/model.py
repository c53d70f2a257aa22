"""The `model` section of the run configuration: the checkpoint, its dtype, LoRA and the vision settings.

Kept apart from schema.py (which re-exports it) for size only; the same rules hold: no torch, every field
with a default and a description.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from ascent.config.action_head import ActionHeadConfig
from ascent.config.section import Section

Dtype = Literal["bf16", "fp16", "fp32"]


class LoraConfig(Section):
    rank: int = Field(0, ge=0, description="LoRA rank; 0 trains all weights (no adapter).")
    alpha: float = Field(16.0, gt=0, description="LoRA scaling numerator (scale = alpha / rank).")
    dropout: float = Field(0.0, ge=0, lt=1, description="Dropout on the LoRA input.")
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        description="Module names that get adapters.",
    )
    save_merged: bool = Field(True, description="Checkpoints hold merged HF weights (else the adapter only).")
    publish: Literal["merged", "adapter"] = Field(
        "merged",
        description="What a weight publication sends the rollout engines: `merged` weights (the whole model) "
        "or the `adapter` only (lora_A, lora_B and scaling of each adapted layer; the engines merge it into "
        "their own base weights): the adapter's bytes instead of the model's. `adapter` needs engines that "
        "keep their weights (not colocated with a sleeping fast engine), an unsharded trainer and "
        "rollout.tensor_parallel=1.",
    )


class ModelConfig(Section):
    path: str = Field("", description="Local directory of a Hugging Face causal LM checkpoint.")
    tokenizer_path: str | None = Field(None, description="Tokenizer directory; defaults to `path`.")
    dtype: Dtype = Field("fp32", description="Compute dtype: bf16, fp16 (GPUs without bf16) or fp32.")
    gradient_checkpointing: bool = Field(
        False, description="Recompute activations in backward to save memory."
    )
    lora: LoraConfig = Field(default_factory=LoraConfig, description="Low-rank adapters (peft).")
    freeze_vision_tower: bool = Field(
        False,
        description="Vision-language models (Qwen2.5-VL, Qwen3-VL): keep the vision tower and its patch merger "
        "fixed (no gradients, no optimizer state); the language model trains. Default false trains both, as "
        "verl and EasyR1 do; with LoRA the tower is frozen anyway (adapters go to the language model).",
    )
    trust_remote_code: bool = Field(False, description="Allow model code shipped inside the checkpoint.")
    action_head: ActionHeadConfig | None = Field(
        None,
        description="Embodied RL: a continuous action head over the policy's last hidden state (a Gaussian over "
        "an action chunk) that acts in a simulator instead of text; null: the policy acts with tokens.",
    )
    chat_template: str | None = Field(
        None,
        description="Replace the tokenizer's chat template: a path to a Jinja file (.jinja) or a built-in name "
        "(chatml); null: the tokenizer's own. Saved with the checkpoints' tokenizer.",
    )
    min_pixels: int | None = Field(
        None,
        gt=0,
        description="Vision-language models: the fewest pixels an image is resized to before it becomes "
        "image tokens (one token per 28x28 pixels on Qwen2.5-VL, 32x32 on Qwen3-VL); null: the checkpoint's "
        "preprocessor_config.json. `ascent doctor` shows the resulting tokens per image.",
    )
    max_pixels: int | None = Field(
        None,
        gt=0,
        description="Vision-language models: the most pixels an image keeps (larger ones are scaled down), "
        "which bounds its image tokens; null: the checkpoint's preprocessor_config.json.",
    )

    @model_validator(mode="after")
    def _pixel_budget(self) -> ModelConfig:
        if self.min_pixels is not None and self.max_pixels is not None and self.min_pixels > self.max_pixels:
            raise ValueError(
                f"model.min_pixels={self.min_pixels} is over model.max_pixels={self.max_pixels}; "
                "lower min_pixels or raise max_pixels."
            )
        return self
