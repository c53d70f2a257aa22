"""LoRA adapter-only publication, engine side: merge received adapters into pristine base weights.

A LoRA policy changes only its adapters, so a publication can carry them instead of the merged model: for
every adapted linear layer `m`, `m.lora_A` [r, in], `m.lora_B` [out, r] and `m.lora_scaling` (one number),
the trainer's names (`ascent.trainer.lora.adapter_named_tensors`). The bytes moved are the adapter's
(r * (in + out) per layer), not the model's. An engine keeps the base weights of the adapted layers as they
were before the first adapter arrived (its "pristine" copies, the targeted matrices once more in the
engine's dtype) and writes `base + scaling * B @ A` into its own weights, computed as the trainer merges
(`ascent.trainer.lora.merged_named_weights`: the delta in the adapter's dtype, the sum in fp32, cast to the
base's dtype), so an adapter-only publication leaves the engine holding what a full merged one would.

The base is the last full weights the engine received: a full publication of an adapted layer's weight
(after `sleep(release_weights=True)`, or a run that publishes merged weights) replaces its pristine copy.
Both engines (`ReferenceEngine`, `FastEngine`) route their `update_weights` through an `AdapterMerger`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch import Tensor

ADAPTER_PARTS = ("lora_A", "lora_B", "lora_scaling")


def adapter_part(name: str) -> tuple[str, str] | None:
    """'model.layers.0.self_attn.q_proj.lora_A' -> ('model.layers.0.self_attn.q_proj', 'lora_A'); None for
    any other name (a plain weight)."""
    module, _, part = name.rpartition(".")
    return (module, part) if part in ADAPTER_PARTS else None


def merged_weight(base: Tensor, lora_a: Tensor, lora_b: Tensor, scaling: float) -> Tensor:
    """base [out, in], lora_a [r, in], lora_b [out, r] -> base + scaling * lora_b @ lora_a in base's dtype
    and on its device: the delta in the adapter's dtype (fp32 for a bf16 base on CPU, as peft does), the sum
    in fp32."""
    a, b = lora_a.to(base.device), lora_b.to(base.device)
    if base.device.type == "cpu" and b.dtype in (torch.float16, torch.bfloat16):
        delta = ((b.float() @ a.float()) * scaling).to(b.dtype)
    else:
        delta = (b @ a) * scaling
    return (base.float() + delta.float()).to(base.dtype)


class AdapterMerger:
    """Turns the (name, tensor) pairs of a publication into the engine's own weight updates.

    `read(name)` -> the engine's current tensor of a Hugging Face weight name (its pristine copy is taken
    from it the first time an adapter for that layer arrives). `apply(named)` yields plain weights as they
    are and, for each layer whose three adapter parts have arrived (in any bucket: parts wait for each
    other, copied, since a link's bucket buffers are reused), `(layer.weight, merged)`."""

    def __init__(self, read: Callable[[str], Tensor]):
        self.read = read
        self.base: dict[str, Tensor] = {}  # layer weight name -> pristine base (engine device and dtype)
        self._parts: dict[str, dict[str, Tensor]] = {}  # layer -> adapter parts received so far

    def apply(self, named: Iterable[tuple[str, Any]]) -> Iterator[tuple[str, Any]]:
        for name, tensor in named:
            split = adapter_part(name)
            if split is None:
                if name in self.base:  # a full weight of an adapted layer: the new base
                    self.base[name] = tensor.detach().to(self.base[name].device, self.base[name].dtype)
                yield name, tensor
                continue
            module, part = split
            parts = self._parts.setdefault(module, {})
            parts[part] = tensor.detach().clone()
            if len(parts) == len(ADAPTER_PARTS):
                del self._parts[module]
                yield self._merged(module, parts)

    def _merged(self, module: str, parts: dict[str, Tensor]) -> tuple[str, Tensor]:
        name = f"{module}.weight"
        if name not in self.base:
            self.base[name] = self.read(name).detach().clone()
        base = self.base[name]
        scaling = float(parts["lora_scaling"])
        return name, merged_weight(base, parts["lora_A"], parts["lora_B"], scaling)

    @property
    def nbytes(self) -> int:
        """Bytes of the pristine copies this merger holds."""
        return sum(t.numel() * t.element_size() for t in self.base.values())
