"""LoRA on an FSDP2-sharded policy (train.sharding=fsdp, model.lora.rank > 0): what `ascent.trainer.lora`
does for one process, for a model whose base weights AND adapters are dim-0 shards (DTensors) on every rank.

- `merged_full_weights`: the rollout engine's merged Hugging Face weights, W + scale * B @ A, computed from
  full tensors gathered in buckets (a collective: every rank iterates to the end).
- Checkpoints: `save_adapter_shards` / `load_adapter_shards` write and read the trainable adapter matrices
  with torch.distributed.checkpoint (`adapter_shards/`), each rank its own shards, nothing gathered, and
  load on any number of ranks (one process, unsharded, too). The frozen base is not saved: it is
  `model.path`. The PEFT export (`adapter/adapter_model.safetensors`) is gathered to rank 0 only when an
  export is due (`gathered_adapter`, the policy's `hf_weights`). `load_full_adapter` reads such an export
  (or an unsharded run's adapter) into the shards of this rank.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.tensor import DTensor, distribute_tensor

from ascent.models.parallel import dcp_load, full_parameters, gather_full, reshard

ADAPTER_SHARDS_DIR = "adapter_shards"
_PEFT_PREFIX = "base_model.model."


def adapter_parameters(model: nn.Module) -> dict[str, Tensor]:
    """{name in `model`: detached view} of every trainable (adapter) parameter; DTensors stay DTensors."""
    return {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}


def has_adapter_shards(directory: str | Path) -> bool:
    return (Path(directory) / ADAPTER_SHARDS_DIR / ".metadata").is_file()


def save_adapter_shards(model: nn.Module, directory: str | Path) -> None:
    """Write the adapter matrices to `directory/adapter_shards` with DCP (a collective when sharded)."""
    # deferred: torch.distributed.checkpoint, only for sharded checkpoints
    import torch.distributed.checkpoint as dcp

    reshard(model)
    path = str(Path(directory) / ADAPTER_SHARDS_DIR)
    dcp.save(adapter_parameters(model), checkpoint_id=path, no_dist=not dist.is_initialized())


@torch.no_grad()
def load_adapter_shards(model: nn.Module, directory: str | Path) -> None:
    """Read `adapter_shards/` into the adapters of `model` in place, each rank the slices it holds."""
    reshard(model)
    dcp_load(adapter_parameters(model), Path(directory) / ADAPTER_SHARDS_DIR)


def gathered_adapter(model: nn.Module) -> dict[str, Tensor]:
    """The adapter matrices as full CPU tensors on rank 0 ({} elsewhere), by name in `model` (a
    collective)."""
    reshard(model)
    keep = not dist.is_initialized() or dist.get_rank() == 0
    full = {name: t.cpu() for name, t in gather_full(adapter_parameters(model).items())}
    return full if keep else {}


def _peft_key(name: str, adapter: str) -> str:
    """Our parameter name -> its key in adapter_model.safetensors (peft drops the adapter name)."""
    return name.replace(f".{adapter}", "")


@torch.no_grad()
def load_full_adapter(model: nn.Module, directory: str | Path, adapter: str = "default") -> None:
    """Load `directory/adapter_model.safetensors` (full tensors) into a sharded model: every rank keeps its
    own shard of each adapter matrix (no communication)."""
    from safetensors.torch import load_file  # deferred: safetensors, only when weights are read or written

    path = Path(directory) / "adapter_model.safetensors"
    if not path.is_file():
        raise FileNotFoundError(f"{str(path)!r}: no LoRA adapter in this checkpoint.")
    full = load_file(str(path))
    own = adapter_parameters(model)
    missing = sorted(n for n in own if _peft_key(n, adapter) not in full)
    if missing:
        raise ValueError(f"{str(path)!r}: adapter keys do not match the model's LoRA layers: {missing[:5]}.")
    for name, target in own.items():
        src = full[_peft_key(name, adapter)].to(dtype=target.dtype)
        if isinstance(target, DTensor):
            shard = distribute_tensor(src, target.device_mesh, target.placements, src_data_rank=None)
            target.to_local().copy_(shard.to_local())
        else:
            target.copy_(src)


# ------------------------------------------------------------------------------------ merged weights
def _lora_layers(model: nn.Module) -> dict[str, Any]:
    from peft.tuners.lora import LoraLayer  # deferred: peft, only for LoRA

    layers = {name: m for name, m in model.named_modules() if isinstance(m, LoraLayer)}
    for name, m in layers.items():
        if any(m.use_dora.get(a) for a in m.active_adapters):
            raise ValueError(f"{name}: DoRA adapters cannot be merged from shards; use plain LoRA.")
    return layers


def _hf_name(name: str) -> str:
    return name.removeprefix(_PEFT_PREFIX)


def merged_full_weights(model: nn.Module, dtype: torch.dtype | None = None) -> Iterator[tuple[str, Tensor]]:
    """(HF name, full tensor) of the base model with the active adapters merged in, tied weights once, cast to
    `dtype` after the merge. A collective: the shards are gathered in buckets (`full_parameters`), and each
    LoRA layer is merged as soon as its base weight and adapter matrices have arrived."""
    layers = _lora_layers(model)
    pending: dict[str, dict[str, Tensor]] = {}
    for name, t in _merge(layers, full_parameters(model), pending):
        yield name, (t if dtype is None else t.to(dtype))
    if pending:
        raise RuntimeError(f"LoRA layers left unmerged (missing tensors): {sorted(pending)[:5]}.")


def _merge(
    layers: dict[str, Any], named: Iterable[tuple[str, Tensor]], pending: dict[str, dict[str, Tensor]]
) -> Iterator[tuple[str, Tensor]]:
    for name, t in named:
        owner = _owner(name, layers)
        if owner is None:
            yield _hf_name(name), t
            continue
        parts = pending.setdefault(owner, {})
        parts[name[len(owner) + 1 :]] = t
        layer = layers[owner]
        wanted = _wanted_parts(layer)
        if wanted <= parts.keys():
            del pending[owner]
            yield _hf_name(owner) + ".weight", _merged(layer, parts)
            if "base_layer.bias" in parts:
                yield _hf_name(owner) + ".bias", parts["base_layer.bias"]


def _owner(name: str, layers: dict[str, Any]) -> str | None:
    """The LoRA layer that parameter `name` belongs to (its longest prefix among `layers`), if any."""
    head = name
    while "." in head:
        head = head.rsplit(".", 1)[0]
        if head in layers:
            return head
    return None


def _wanted_parts(layer: Any) -> set[str]:
    wanted = {"base_layer.weight"}
    if getattr(layer.get_base_layer(), "bias", None) is not None:
        wanted.add("base_layer.bias")
    for a in layer.active_adapters:
        if a in layer.lora_A:
            wanted |= {f"lora_A.{a}.weight", f"lora_B.{a}.weight"}
    return wanted


def _merged(layer: Any, parts: dict[str, Tensor]) -> Tensor:
    """W + sum over active adapters of scale * B @ A, computed in fp32, returned in W's dtype."""
    weight = parts["base_layer.weight"]
    if layer.merged or layer.disable_adapters:
        return weight
    out = weight.float()
    for a in layer.active_adapters:
        if a in layer.lora_A:
            delta = parts[f"lora_B.{a}.weight"].float() @ parts[f"lora_A.{a}.weight"].float()
            out = out + (delta.T if layer.fan_in_fan_out else delta) * layer.scaling[a]
    return out.to(weight.dtype)
