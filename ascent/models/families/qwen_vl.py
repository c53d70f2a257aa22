"""What the Qwen vision-language families (Qwen2.5-VL, Qwen3-VL) share: one `Family` shape.

The trainer loads them with `AutoModelForImageTextToText` (vision tower, merger and language model in one
module); the tokenizer is the checkpoint's own and images go through its image processor
(`AutoImageProcessor`, read by `ascent.models.vision.load_image_codec`; ascent expands image pads itself,
so the combined `AutoProcessor` and its video processor, which needs torchvision, are never loaded).

The fast engine runs their language model with its "decoder" layout (a Qwen2 or Qwen3 decoder with
multimodal RoPE: `ModelSpec.mrope_section`) and their vision tower as transformers' own module
(`ascent.rollout.fast.vision`). Engine names are the Llama names for the decoder (`model.layers.N...`) and
`model.visual.*` for the tower: `to_engine_name` maps both the trainer's names (`model.language_model.*`)
and the older checkpoint layout (`model.layers.*`, `visual.*`) to them.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ascent.models.families.family import Family
from ascent.models.families.llama_like import ENGINE, decoder_spec
from ascent.models.families.spec import ModelSpec

LANGUAGE_MODEL = "model.language_model."


def to_engine_name(name: str) -> str:
    """A trainer's or checkpoint's weight name -> the fast engine's (decoder: `model.*`, tower:
    `model.visual.*`)."""
    if name.startswith(LANGUAGE_MODEL):
        return "model." + name[len(LANGUAGE_MODEL) :]
    if name.startswith("visual."):
        return "model." + name
    return name


def to_checkpoint_name(name: str) -> str:
    """The fast engine's weight name -> the trainer's (transformers' `model.language_model.*` layout)."""
    if name.startswith("model.") and not name.startswith("model.visual."):
        return LANGUAGE_MODEL + name[len("model.") :]
    return name


def qwen_vl_spec(config: Any) -> ModelSpec:
    """A Qwen-VL config -> the ModelSpec of its language model, with its multimodal RoPE sections
    (Qwen3-VL interleaves them over the rotary frequencies; Qwen2.5-VL lays them out in blocks)."""
    text = getattr(config, "text_config", None) or config
    spec = decoder_spec(text)
    rope = dict(getattr(text, "rope_parameters", None) or getattr(text, "rope_scaling", None) or {})
    section = tuple(int(s) for s in rope.get("mrope_section", ()))
    model_type = getattr(config, "model_type", spec.model_type)
    head_dim = spec.head_dim
    if model_type == "qwen2_5_vl":  # its attention sizes heads as hidden / heads, whatever head_dim says
        head_dim = text.hidden_size // text.num_attention_heads
    if sum(section) != head_dim // 2:
        raise ValueError(
            f"rope_parameters.mrope_section={list(section)}: the sections must add up to head_dim / 2 = "
            f"{head_dim // 2}; use rollout.engine=reference for this checkpoint."
        )
    return replace(
        spec,
        model_type=model_type,
        head_dim=head_dim,
        tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", spec.tie_word_embeddings)),
        mrope_section=section,
        mrope_interleaved=model_type == "qwen3_vl",
    )


def qwen_vl(name: str) -> Family:
    """A Qwen-VL family: image-text-to-text class, image processor, the fast engine's decoder plus the
    tower, names mapped as above."""
    return Family(
        name=name,
        model_types=(name,),
        trainer_class="AutoModelForImageTextToText",
        processor_class="AutoImageProcessor",
        engine=ENGINE,
        spec=qwen_vl_spec,
        to_engine_name=to_engine_name,
        to_checkpoint_name=to_checkpoint_name,
    )
