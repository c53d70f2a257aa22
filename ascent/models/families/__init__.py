"""The model-family registry: per Hugging Face `model_type`, the `Family` that says how to hold its weights.

`FAMILIES` is a plain dict (model_type -> Family) built from one module per family: `qwen2`, `qwen3`,
`llama` and `mistral`, which share the Llama layout (`llama_like`), the mixture-of-experts `qwen3_moe` (the
same layout with routed experts), and the vision-language `qwen2_5_vl` and `qwen3_vl` (`qwen_vl`: the decoder
layout plus a vision tower). `family_for` looks a config up and
names the fix when it is unknown; `CAUSAL_LM` is what the trainer and the reference engine fall back to
for a causal LM without a family (loaded by transformers, never run by the fast engine).

Adding a family (a vision-language model, an MoE, an action-head policy) is one new module defining
`FAMILY = Family(...)` plus its tests, and one `register(...)` line below; docs/contracts.md has the steps.
"""

from __future__ import annotations

from typing import Any

from ascent.errors import AscentError
from ascent.models.families import llama, mistral, qwen2, qwen2_5_vl, qwen3, qwen3_moe, qwen3_vl
from ascent.models.families.family import Family, resolve_class, same_name
from ascent.models.families.spec import ModelSpec

FAMILIES: dict[str, Family] = {}

# Any other transformers causal LM: the trainer and the reference engine load it; the fast engine does not.
CAUSAL_LM = Family(name="causal_lm", model_types=())


class UnknownFamilyError(AscentError, ValueError):
    """A checkpoint whose model_type no family covers; the message names the known ones and the fix."""


def register(family: Family) -> Family:
    """Add `family` to FAMILIES under each of its model_types (a later one replaces an earlier one)."""
    for model_type in family.model_types:
        FAMILIES[model_type] = family
    return family


for _module in (qwen2, qwen3, llama, mistral, qwen3_moe, qwen2_5_vl, qwen3_vl):
    register(_module.FAMILY)


def model_type_of(config_or_model_type: object) -> str:
    """A model_type string from itself, a transformers config, or a config.json dict ("?" when absent)."""
    if isinstance(config_or_model_type, str):
        return config_or_model_type
    if isinstance(config_or_model_type, dict):
        return str(config_or_model_type.get("model_type", "?"))
    return str(getattr(config_or_model_type, "model_type", "?"))


def family_for(config_or_model_type: Any) -> Family:
    """The Family of a model_type (or of a config carrying one); raises UnknownFamilyError naming the fix."""
    model_type = model_type_of(config_or_model_type)
    family = FAMILIES.get(model_type)
    if family is None:
        raise UnknownFamilyError(
            f"model_type={model_type!r} has no model family; ascent knows {sorted(FAMILIES)}. Add a module "
            "under ascent/models/families/ that defines its Family and register it there "
            "(docs/contracts.md, 'Model families')."
        )
    return family


__all__ = [
    "CAUSAL_LM",
    "FAMILIES",
    "Family",
    "ModelSpec",
    "UnknownFamilyError",
    "family_for",
    "model_type_of",
    "register",
    "resolve_class",
    "same_name",
]
