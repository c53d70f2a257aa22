"""`Family`: what ascent knows about one model family, in one frozen record (design: "Model families").

A family names, by strings and plain functions, everything a worker needs to hold its weights: the class
the trainer loads, the tokenizer (and, for a multimodal family, the processor), the fast engine's
implementation key and the weight-name mapping between a checkpoint and that implementation. Names, not
classes: `models` sits below `rollout`, so the engine's implementations are looked up by `engine` in
`ascent.rollout.fast.weights.IMPLEMENTATIONS`, and transformers' classes are resolved when a model loads.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ascent.models.families.spec import ModelSpec


def same_name(name: str) -> str:
    """The identity weight-name mapping: the checkpoint's names are the engine's (Llama-like layouts)."""
    return name


@dataclass(frozen=True)
class Family:
    """One model family. `model_types` are the Hugging Face `config.model_type` values it covers.

    - `trainer_class`: a transformers auto class name (`AutoModelForCausalLM`, `AutoModelForImageTextToText`)
      or `pkg.module:Class` (an action-head policy); the trainer loads it with `from_pretrained`.
    - `tokenizer_class`: the same for the tokenizer; `processor_class` names the processor of a multimodal
      family (tokenizer plus image processor, e.g. `AutoProcessor`); None for text-only families.
    - `engine`: the fast engine implementation that runs it (a key of the engine's IMPLEMENTATIONS), or None
      when only the reference engine does; `spec` reads a HF config into that implementation's `ModelSpec`.
    - `to_engine_name` / `to_checkpoint_name`: weight names from the checkpoint (and the trainer's state
      dict) to the engine's, and back; the engine applies the first to every published tensor.
    """

    name: str
    model_types: tuple[str, ...]
    trainer_class: str = "AutoModelForCausalLM"
    tokenizer_class: str = "AutoTokenizer"
    processor_class: str | None = None
    engine: str | None = None
    spec: Callable[[Any], ModelSpec] | None = None
    to_engine_name: Callable[[str], str] = same_name
    to_checkpoint_name: Callable[[str], str] = same_name

    @property
    def is_multimodal(self) -> bool:
        """Whether inputs go through a processor (images as well as text), not a tokenizer alone."""
        return self.processor_class is not None


def resolve_class(name: str) -> type[Any]:
    """`AutoModelForCausalLM` (a transformers attribute) or `pkg.module:Class` -> the class."""
    if ":" in name:
        module, _, attr = name.partition(":")
        return getattr(importlib.import_module(module), attr)
    import transformers  # deferred on purpose: importing the registry must stay cheap

    return getattr(transformers, name)
