"""How a tensor-parallel replica's weights are split (tensor_parallel.py's module doc tells the layout):
which tensors are column- or row-parallel, a rank's smaller `ModelSpec`, and each tensor's shard. Pure
functions over specs, names and tensors; the engine's builder shards a checkpoint with them and the driver
slices every publication with them."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
from torch import Tensor

from ascent.models.families import ModelSpec, same_name

COLUMN = ("self_attn.q_proj.", "self_attn.k_proj.", "self_attn.v_proj.", "mlp.gate_proj.", "mlp.up_proj.")
ROW = ("self_attn.o_proj.weight", "mlp.down_proj.weight")
EXPERTS = ".mlp.experts."  # every tensor of the routed experts is split (stacked or per expert)


def check_shardable(spec: ModelSpec, size: int) -> None:
    """Raise ValueError naming the sizes that `size` ranks cannot split evenly (a mixture of experts: every
    expert's `moe_intermediate_size`, and the dense MLP's `intermediate_size` only where a layer has one), or
    the model kinds the shards do not run yet (multimodal RoPE)."""
    if spec.mrope_section and size > 1:
        raise ValueError(
            f"rollout.tensor_parallel={size}: a vision-language model does not run tensor-parallel yet; set "
            "rollout.tensor_parallel=1 (more replicas instead: cluster.num_rollout_workers)."
        )
    kvh = spec.num_kv_heads
    sizes = [("num_attention_heads", spec.num_heads)]
    if len(spec.moe_layers) < spec.num_layers:  # a dense MLP somewhere
        sizes.append(("intermediate_size", spec.intermediate_size))
    if spec.is_moe:
        sizes.append(("moe_intermediate_size", spec.moe_intermediate_size))
    bad = [f"{name}={n}" for name, n in sizes if n % size]
    if kvh % size and size % kvh:
        bad.append(f"num_key_value_heads={kvh} (neither a multiple nor a divisor of it)")
    if bad:
        raise ValueError(
            f"rollout.tensor_parallel={size}: the model's {', '.join(bad)} cannot be split over {size} ranks; "
            "pick a tensor_parallel that divides the head count and the MLP's intermediate size (every "
            "expert's, for a mixture of experts)."
        )


def shard_spec(spec: ModelSpec, size: int) -> ModelSpec:
    """The spec of one rank's shard: heads (KV heads at least 1) and the intermediate sizes divided."""
    check_shardable(spec, size)
    return dataclasses.replace(
        spec,
        num_heads=spec.num_heads // size,
        num_kv_heads=max(1, spec.num_kv_heads // size),
        intermediate_size=spec.intermediate_size // size,
        moe_intermediate_size=spec.moe_intermediate_size // size,
    )


def shard_tensor(name: str, t: Tensor, spec: ModelSpec, rank: int, size: int) -> Tensor:
    """Rank `rank`'s part of the full tensor `name` (engine name; the full model's `spec`): a slice of
    rows (column-parallel), of columns (row-parallel), one replicated KV head, an expert tensor's slice of
    intermediate features (`_expert_shard`), or `t` itself (replicated)."""
    if size == 1 or not is_sharded(name):
        return t
    if EXPERTS in name:
        return _expert_shard(name, t, rank, size)
    if name.endswith(ROW):
        return t.chunk(size, dim=1)[rank]
    kvh = spec.num_kv_heads
    if (".k_proj." in name or ".v_proj." in name) and kvh < size:
        head = rank // (size // kvh)
        return t[head * spec.head_dim : (head + 1) * spec.head_dim]
    return t.chunk(size, dim=0)[rank]


def _expert_shard(name: str, t: Tensor, rank: int, size: int) -> Tensor:
    """Rank `rank`'s 1/size of the intermediate features of a routed-experts tensor: stacked gate_up
    [E, 2I, H] -> its gate rows then its up rows [E, 2I/size, H] (a copy), stacked down [E, H, I] -> its
    columns; per expert (a checkpoint's names) gate_proj/up_proj [I, H] rows, down_proj [H, I] columns."""
    if name.endswith("experts.gate_up_proj"):
        gate, up = t.chunk(2, dim=1)
        return torch.cat([gate.chunk(size, dim=1)[rank], up.chunk(size, dim=1)[rank]], dim=1)
    if name.endswith("experts.down_proj"):
        return t.chunk(size, dim=2)[rank]
    if name.endswith(("gate_proj.weight", "up_proj.weight")):
        return t.chunk(size, dim=0)[rank]
    if name.endswith("down_proj.weight"):
        return t.chunk(size, dim=1)[rank]
    raise ValueError(f"tensor parallelism: no rule to split the expert tensor {name!r} (not Qwen3-MoE?).")


def is_sharded(name: str) -> bool:
    """Whether the engine-named tensor is split over the ranks (else every rank holds all of it)."""
    return name.endswith(ROW) or EXPERTS in name or any(f".{part}" in name for part in COLUMN)


def shard_state_dict(
    sd: dict[str, Tensor], spec: ModelSpec, rank: int, size: int, rename: Callable[[str], str] = same_name
) -> dict[str, Tensor]:
    """A full state dict -> this rank's shard, by engine name (views; build_weights copies them)."""
    return {(n := rename(k)): shard_tensor(n, t, spec, rank, size) for k, t in sd.items()}
