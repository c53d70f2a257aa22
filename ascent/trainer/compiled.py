"""torch.compile in the trainer: each decoder layer is compiled on its own ("regional compilation").

Profiling the update of a 1.5B Qwen2 on an H200 (BENCHMARKS.md) showed the matrix products already at peak
and about half the trainer's GPU time in transformers' unfused elementwise work: RMSNorm in fp32, RoPE,
residual adds, SiLU x up, the autocast casts of every linear input. Compiling a decoder layer lets inductor
fuse that work into a few kernels around the matmuls.

How, and why this way:
- `layer.forward` is replaced by its compiled version, not `layer.__call__`: module hooks (FSDP2's
  unshard/reshard, peft) and transformers' gradient-checkpointing wrapper stay eager around it, so sharding
  and activation checkpointing work unchanged (checkpointing recomputes the compiled forward).
- All layers share one code object; dynamo lifts their parameters to graph inputs, so the first layer's
  compile serves the others (no recompile per layer). Micro-batch lengths vary: the token dimension turns
  dynamic after the first new length, not one compile per length.
- Attention is the packed varlen kernel (`ascent.models.varlen`, excluded from tracing: it reads sequence
  boundaries on the host) or SDPA; dynamo splits the layer around it.

The LM head + log-softmax of each logprob chunk has its own compiled form (`ascent.trainer.logprobs`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ascent.trainer.logprobs import backbone_and_head


def compile_enabled(setting: str, device: torch.device) -> bool:
    """`train.compile` ("auto" | "on" | "off") on `device` -> whether the trainer compiles."""
    if setting not in ("auto", "on", "off"):
        raise ValueError(f"train.compile={setting!r}: use auto, on or off.")
    return setting == "on" or (setting == "auto" and device.type == "cuda")


def compile_decoder_layers(model: nn.Module) -> int:
    """Compile the `forward` of every decoder layer of a (peft-wrapped, FSDP-sharded) causal LM in place.

    Returns the number of layers compiled. Idempotent: a layer compiled before is left alone.
    """
    decoder, _ = backbone_and_head(model)
    decoder = getattr(decoder, "language_model", decoder)  # a vision-language model: its decoder layers
    layers: Any = getattr(decoder, "layers", None)
    if layers is None:
        raise TypeError(f"{type(decoder).__name__}: no `layers` to compile; set train.compile=off.")
    count = 0
    for layer in layers:
        if getattr(layer, "_ascent_compiled", False):
            continue
        layer.forward = torch.compile(layer.forward)
        layer._ascent_compiled = True
        count += 1
    return count
