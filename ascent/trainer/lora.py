"""LoRA for the policy (design: "models/ ... LoRA"), through peft.

`apply_lora` wraps the loaded causal LM in a peft model; only the adapter matrices train. Three consequences
the rest of the trainer relies on:

- the reference policy is the same module with the adapter switched off (`reference_context`), so a KL loss
  costs no second copy of the weights;
- the rollout engine receives MERGED weights in plain Hugging Face naming (`merged_named_weights`):
  W + scale * B @ A computed on the fly per layer, names without peft's `base_model.model.` / `base_layer.`
  parts, so it can load them into an ordinary model;
- or, adapter-only (`adapter_named_tensors`), each adapted layer's `lora_A`, `lora_B` and `lora_scaling`:
  the bytes of the adapter, not the model's; the engine merges them into its pristine base weights as
  `merged_named_weights` does (`ascent.rollout.adapter`);
- checkpoints hold the adapter (small, exact resume) and, when asked, merged HF weights (`write_merged`).

A sharded (FSDP2) LoRA policy merges, saves and loads through `ascent.trainer.lora_sharded` instead.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, cast

import torch
from torch import Tensor, nn

from ascent.models.multimodal import is_vision_language

if TYPE_CHECKING:
    from peft import PeftModel
    from peft.tuners.lora import LoraLayer
    from transformers import PreTrainedModel

ADAPTER_DIR = "adapter"


class _DeltaWeightLayer(Protocol):
    """peft's concrete LoRA layers (Linear, Embedding, Conv*) define this; their LoraLayer base does not."""

    def get_delta_weight(self, adapter: str) -> Tensor: ...


def apply_lora(
    model: nn.Module, rank: int, alpha: float, dropout: float = 0.0, target_modules: Sequence[str] = ()
) -> nn.Module:
    """Wrap `model` with LoRA adapters (peft) on `target_modules`; returns the PeftModel.

    Base weights are frozen; adapters start as a no-op (B = 0). peft keeps adapter weights in fp32 when the
    base is bf16/fp16 (`autocast_adapter_dtype`), so the optimizer state of the adapters is fp32. A
    vision-language model gets adapters in its language model only (Qwen2.5-VL's vision MLPs share the names
    gate_proj/up_proj/down_proj), unless a target names the tower itself (an entry containing "visual").
    """
    try:
        from peft import LoraConfig, get_peft_model  # deferred: peft, only for LoRA
    except ImportError as e:
        raise ImportError("model.lora.rank > 0 needs peft: pip install 'ascent[lora]'.") from e
    if rank <= 0:
        raise ValueError(f"model.lora.rank={rank}: apply_lora needs a rank >= 1.")
    cfg = LoraConfig(
        r=rank,
        lora_alpha=alpha,  # type: ignore[arg-type]  # peft annotates int; scale = alpha / r takes any float
        lora_dropout=dropout,
        target_modules=list(target_modules),
        bias="none",
        task_type="CAUSAL_LM",
        exclude_modules=_vision_modules(model, target_modules),
    )
    return get_peft_model(model, cfg)


def _vision_modules(model: nn.Module, target_modules: Sequence[str]) -> str | None:
    """peft's `exclude_modules` for `model`: its vision tower's modules (a regex) for a vision-language model
    whose targets do not name the tower, else None."""
    if not is_vision_language(model) or any("visual" in t for t in target_modules):
        return None
    return r".*\bvisual\b.*"


def is_lora(model: nn.Module) -> bool:
    """True for a peft-wrapped model."""
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")


def reference_context(model: nn.Module) -> contextlib.AbstractContextManager:
    """A context in which `model` computes the reference (base) policy: adapters disabled."""
    return _peft(model).disable_adapter()


def _peft(model: nn.Module) -> PeftModel:
    """`model` as the PeftModel that `apply_lora` returned (callers hold it as a plain nn.Module)."""
    return cast("PeftModel", model)


def _merged_weight(module: LoraLayer) -> Tensor:
    """W + sum of the active adapters' scale * B @ A, in W's dtype (nothing added if already merged)."""
    base = module.get_base_layer()
    weight = cast(Tensor, base.weight).detach()
    if module.merged or module.disable_adapters:
        return weight
    delta = None
    for name in module.active_adapters:
        if name in module.lora_A:
            d = cast(_DeltaWeightLayer, module).get_delta_weight(name).detach().float()
            delta = d if delta is None else delta + d
    return weight if delta is None else (weight.float() + delta).to(weight.dtype)


def merged_named_weights(model: nn.Module) -> Iterator[tuple[str, Tensor]]:
    """(HF name, tensor) of every parameter of the base model with LoRA merged in; tied params once.

    Memory: one merged matrix at a time (the consumer decides what to keep).
    """
    from peft.tuners.lora import LoraLayer  # deferred: peft, only for LoRA

    base = _peft(model).get_base_model()
    lora_prefixes: list[str] = []
    seen: set[int] = set()
    for name, module in base.named_modules():
        if any(name.startswith(p) for p in lora_prefixes):
            continue
        if isinstance(module, LoraLayer):
            lora_prefixes.append(name + ".")
            yield f"{name}.weight", _merged_weight(module)
            bias = getattr(module.get_base_layer(), "bias", None)
            if bias is not None:
                yield f"{name}.bias", bias.detach()
            continue
        for pname, p in module.named_parameters(recurse=False):
            if id(p) not in seen:
                seen.add(id(p))
                yield (f"{name}.{pname}" if name else pname), p.detach()


def adapter_named_tensors(model: nn.Module) -> Iterator[tuple[str, Tensor]]:
    """(name, tensor) of the adapter of every adapted linear layer `m` of `model` (HF naming, as
    `merged_named_weights`): `m.lora_A` [r, in], `m.lora_B` [out, r], `m.lora_scaling` ([1] fp64) -- what an
    engine needs to hold W + scaling * B @ A (`ascent.rollout.adapter.merged_weight`). One active adapter."""
    from peft.tuners.lora import Linear, LoraLayer  # deferred: peft, only for LoRA

    for name, module in _peft(model).get_base_model().named_modules():
        if not isinstance(module, LoraLayer) or module.disable_adapters:
            continue
        (adapter,) = module.active_adapters
        if not isinstance(module, Linear) or module.fan_in_fan_out or module.use_dora.get(adapter):
            raise ValueError(
                f"{name}: adapter-only publication handles plain linear LoRA layers; this one is "
                f"{type(module).__name__}; publish merged weights instead."
            )
        if module.merged:
            raise ValueError(f"{name}: the adapter is merged into the base; publish merged weights instead.")
        lora_a, lora_b = cast(nn.Linear, module.lora_A[adapter]), cast(nn.Linear, module.lora_B[adapter])
        yield f"{name}.lora_A", lora_a.weight.detach()
        yield f"{name}.lora_B", lora_b.weight.detach()
        scaling = torch.tensor([module.scaling[adapter]], dtype=torch.float64, device=lora_b.weight.device)
        yield f"{name}.lora_scaling", scaling


def write_merged(model: nn.Module, directory: str | Path, merged: dict[str, Tensor] | None = None) -> None:
    """Write merged weights as a plain HF checkpoint (config.json + model.safetensors) to `directory`:
    `merged` if given (a sharded model's, gathered), else merged here from `model`."""
    from safetensors.torch import save_file  # deferred: safetensors, only when weights are read or written

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    base = cast("PreTrainedModel", _peft(model).get_base_model())
    items = merged.items() if merged is not None else merged_named_weights(model)
    tensors = {name: t.contiguous().clone() for name, t in items}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    base.config.save_pretrained(str(out))
    gen = getattr(base, "generation_config", None)
    if gen is not None:
        gen.save_pretrained(str(out))


def write_adapter(model: nn.Module, directory: str | Path, adapter: dict[str, Tensor] | None = None) -> None:
    """Write the adapter (peft format: adapter_config.json + adapter_model.safetensors) to `directory`:
    `adapter` if given (full tensors by parameter name, gathered from a sharded model), else the model's."""
    if adapter is None:
        _peft(model).save_pretrained(str(directory))
    else:
        _peft(model).save_pretrained(str(directory), state_dict=adapter)


def write_adapter_config(model: nn.Module, directory: str | Path) -> None:
    """Write only adapter_config.json (what the adapter shards of a sharded checkpoint are)."""
    for config in _peft(model).peft_config.values():
        config.save_pretrained(str(directory))


def load_adapter_weights(model: nn.Module, directory: str | Path) -> None:
    """Load adapter weights written by `write_adapter` into the (already wrapped) `model`, in place."""
    # deferred: peft and safetensors, only for LoRA
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    path = Path(directory) / "adapter_model.safetensors"
    if not path.is_file():
        raise FileNotFoundError(f"{str(path)!r}: no LoRA adapter in this checkpoint.")
    result = set_peft_model_state_dict(model, load_file(str(path)))
    unexpected = getattr(result, "unexpected_keys", [])
    if unexpected:
        raise ValueError(
            f"{str(path)!r}: adapter keys do not match the model's LoRA layers: {unexpected[:5]}."
        )
