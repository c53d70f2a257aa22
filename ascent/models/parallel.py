"""FSDP2 sharding of a model for the trainer (design: "models/ ... FSDP2 parallelize").

`fully_shard_model` applies `torch.distributed.fsdp.fully_shard` to every decoder layer, then to the root
module (embeddings, final norm, LM or value head: the parameters no layer owns, tied ones included). Each
rank then holds a dim-0 shard of every parameter as a DTensor (fp32 master weights when the model was
loaded in fp32); forward and backward all-gather a layer's weights just in time (in `mp_param_dtype`, e.g.
bf16) and reduce-scatter its gradients (in `reduce_dtype`).

Gradients are SUMMED over ranks, never averaged: every rank's loss is its share of the global mini-batch
loss (`ascent.trainer.distributed`). FSDP2 averages by default; `sum_gradients` sets a divide factor of 1
on every FSDP module (the setter acts on one module's groups only) and forces plain SUM collectives
(a factor alone selects NCCL's PREMUL_SUM, which gloo does not implement).

The trainer calls the decoder stack and the LM head directly (chunked logprobs), never the root's
`forward`, so the root's hooks would not run; `run_as_forward(model, fn, ...)` runs `fn` as a registered
FSDP forward method of the root (all-gather before, backward hooks on the outputs). The helpers below
turn sharded parameters back into full tensors: `gather_full` (buckets of parameters, one all-gather per
bucket, for the rollout engine), `full_state_dict` (rank 0, CPU, for the Hugging Face export) and
`load_full_state_dict` (each rank keeps its shard of a full state dict). `save_shards` / `load_shards` are
the resume state of a sharded run: `torch.distributed.checkpoint` writes and reads each rank's own shards, so
no rank ever holds the whole model.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard, register_fsdp_forward_method
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

P = ParamSpec("P")
R = TypeVar("R")
ROOT_METHOD = "_ascent_root_call"
# torch 2.13 renamed all_gather_into_tensor (kept, deprecated); 2.11 has only the old name
_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
BUCKET_ELEMS = 64 * 1024 * 1024


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The repeated blocks of `model`, outermost only: modules named by any HF `_no_split_modules` inside it,
    else the children of `nn.ModuleList`s named `layers` / `h` / `blocks`."""
    names: set[str] = set()
    for m in model.modules():
        names.update(getattr(m, "_no_split_modules", None) or ())
    found: list[nn.Module] = []
    inside: set[int] = set()
    for m in model.modules():  # parents come before their children
        if type(m).__name__ in names and id(m) not in inside:
            found.append(m)
            inside.update(id(c) for c in m.modules())
    if found:
        return found
    lists = [m for n, m in model.named_modules() if n.rsplit(".", 1)[-1] in ("layers", "h", "blocks")]
    return [child for lst in lists if isinstance(lst, nn.ModuleList) for child in lst]


def default_mesh(device: torch.device) -> DeviceMesh:
    """A 1-D mesh over every rank of the default process group, on `device`'s type."""
    return init_device_mesh(device.type, (dist.get_world_size(),))


def fully_shard_model(
    model: nn.Module,
    *,
    mesh: DeviceMesh | None = None,
    reshard_after_forward: bool = True,
    mp_param_dtype: torch.dtype | None = None,
    reduce_dtype: torch.dtype | None = torch.float32,
) -> nn.Module:
    """Shard `model` in place with FSDP2 (each decoder layer, then the root); returns the same object.

    `mp_param_dtype`: dtype of the all-gathered weights used in compute (None: the stored dtype).
    `reduce_dtype`: dtype of the gradient reduce-scatter. `reshard_after_forward`: free the gathered
    weights after forward (and gather them again in backward); True keeps only one layer gathered at a time.
    """
    if mesh is None:
        mesh = default_mesh(next(model.parameters()).device)
    policy = MixedPrecisionPolicy(param_dtype=mp_param_dtype, reduce_dtype=reduce_dtype)
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, reshard_after_forward=reshard_after_forward, mp_policy=policy)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward, mp_policy=policy)
    sum_gradients(model)
    setattr(model, ROOT_METHOD, _call)  # an instance attribute: a plain function, not a bound method
    register_fsdp_forward_method(model, ROOT_METHOD)
    return model


def fsdp_parallelize(
    param_dtype: torch.dtype, compute_dtype: torch.dtype
) -> Callable[[nn.Module], nn.Module]:
    """The `parallelize=` function of the trainer workers: weights stored in `param_dtype` (fp32 masters
    when the two differ), gathered and computed in `compute_dtype`, gradients reduced in fp32 then."""
    mixed = compute_dtype != param_dtype
    return functools.partial(
        fully_shard_model,
        mp_param_dtype=compute_dtype if mixed else None,
        reduce_dtype=torch.float32 if mixed else None,
    )


def sum_gradients(model: nn.Module) -> None:
    """Make every FSDP module of `model` sum gradients over ranks (plain SUM collectives, no division)."""
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.set_gradient_divide_factor(1.0)
            m.set_force_sum_reduction_for_comms(True)


def _call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return fn(*args, **kwargs)


def run_as_forward(model: nn.Module, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
    """fn(*args, **kwargs), run as a forward of `model`'s FSDP root when it has one (else just called)."""
    method = getattr(model, ROOT_METHOD, None)
    return method(fn, *args, **kwargs) if method is not None else fn(*args, **kwargs)


def reshard(model: nn.Module) -> None:
    """Free any gathered weights, so that the module's parameters are the sharded DTensors again."""
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.reshard()


def is_sharded(model: nn.Module) -> bool:
    """Whether `model` (or a submodule) went through `fully_shard`."""
    return any(isinstance(m, FSDPModule) for m in model.modules())


# --------------------------------------------------------------------------------------- gathering
def _bucketable(t: Tensor) -> bool:
    return isinstance(t, DTensor) and t.device_mesh.ndim == 1 and tuple(t.placements) == (Shard(0),)


@torch.no_grad()
def _gather_bucket(shards: list[DTensor], dtype: torch.dtype) -> list[Tensor]:
    """DTensors on one 1-D mesh, Shard(0) placement -> their full tensors, in ONE all-gather.

    Rank r holds rows [r * c, min((r + 1) * c, n)) of an [n, ...] tensor, c = ceil(n / world) (torch.chunk);
    each rank pads its rows to c, all ranks' flat buffers [world, sum c * row] are gathered, then cut.
    """
    mesh = shards[0].device_mesh
    world = mesh.size()
    pieces, sizes = [], []
    for t in shards:
        local = t.to_local().to(dtype)
        rows, row_shape = math.ceil(t.shape[0] / world), tuple(t.shape[1:])
        padded = local.new_zeros((rows, *row_shape))
        padded[: local.shape[0]] = local
        pieces.append(padded.reshape(-1))
        sizes.append(padded.numel())
    flat = torch.cat(pieces)
    out = flat.new_empty(world * flat.numel())
    _ALL_GATHER(out, flat, group=mesh.get_group())
    per_rank = out.view(world, -1).split(sizes, dim=1)
    return [
        block.reshape(world * math.ceil(t.shape[0] / world), *t.shape[1:])[: t.shape[0]]
        for block, t in zip(per_rank, shards, strict=True)
    ]


def gather_full(
    named: Iterable[tuple[str, Tensor]], dtype: torch.dtype | None = None, bucket_elems: int = BUCKET_ELEMS
) -> Iterator[tuple[str, Tensor]]:
    """(name, tensor or DTensor) -> (name, full tensor, cast to `dtype` if given), in order.

    A collective: every rank must iterate to the end, with the same `named`. Dim-0-sharded DTensors are
    gathered in buckets of about `bucket_elems` elements (results are views of the bucket's buffer);
    other DTensors with `full_tensor()`; plain tensors pass (detached). Results stay on the device.
    """
    bucket: list[tuple[str, DTensor]] = []
    numel = 0

    def flush() -> Iterator[tuple[str, Tensor]]:
        nonlocal numel
        if bucket:
            full = _gather_bucket([t for _, t in bucket], dtype or bucket[0][1].dtype)
            names = [n for n, _ in bucket]
            bucket.clear()
            numel = 0
            yield from zip(names, full, strict=True)

    for name, t in named:
        if not _bucketable(t):
            yield from flush()
            yield name, _full(t, dtype)
            continue
        assert isinstance(t, DTensor)
        if bucket and (bucket[0][1].device_mesh, bucket[0][1].dtype) != (t.device_mesh, t.dtype):
            yield from flush()
        bucket.append((name, t))
        numel += t.numel()
        if numel >= bucket_elems:
            yield from flush()
    yield from flush()


@torch.no_grad()
def _full(t: Tensor, dtype: torch.dtype | None) -> Tensor:
    full = t.full_tensor() if isinstance(t, DTensor) else t.detach()
    return full if dtype is None else full.to(dtype)


def full_parameters(model: nn.Module, dtype: torch.dtype | None = None) -> Iterator[tuple[str, Tensor]]:
    """(name, full tensor) of every parameter of a (sharded) model, tied ones once; a collective."""
    reshard(model)
    yield from gather_full(model.named_parameters(), dtype)


def full_state_dict(model: nn.Module, rank0_only: bool = True) -> dict[str, Tensor]:
    """`model.state_dict()` with every DTensor gathered to a full CPU tensor (a collective).

    Tied parameters stay tied (one tensor under both names). With `rank0_only` other ranks get {}.
    """
    reshard(model)
    sd = model.state_dict(keep_vars=True)  # the Parameter objects themselves, so ties show as one id
    unique: dict[int, str] = {}
    for name, t in sd.items():
        unique.setdefault(id(t), name)
    keep = not rank0_only or not dist.is_initialized() or dist.get_rank() == 0
    full: dict[str, Tensor] = {}
    for name, t in gather_full((n, sd[n]) for n in unique.values()):
        if keep:
            full[name] = t.cpu()
    if not keep:
        return {}
    return {name: full[unique[id(t)]] for name, t in sd.items()}


@torch.no_grad()
def load_full_state_dict(model: nn.Module, full: dict[str, Tensor]) -> None:
    """Copy a full (unsharded) state dict into `model`; each rank keeps its own shard of DTensors.

    Strict: the keys must be exactly those of `model.state_dict()`. Local only, no communication.
    """
    reshard(model)
    own = model.state_dict()
    missing, extra = sorted(set(own) - set(full)), sorted(set(full) - set(own))
    if missing or extra:
        raise ValueError(f"state dict does not match the model (missing {missing}, extra {extra}).")
    for name, target in own.items():
        src = full[name].to(device=target.device, dtype=target.dtype)
        if isinstance(target, DTensor):
            shard = distribute_tensor(src, target.device_mesh, target.placements, src_data_rank=None)
            target.to_local().copy_(shard.to_local())
        else:
            target.copy_(src)


SHARDS_DIR = "model_shards"


def save_shards(model: nn.Module, directory: str | Path) -> None:
    """Write `model.state_dict()` to `directory/model_shards` with `torch.distributed.checkpoint`: every rank
    its own shards of every DTensor, nothing gathered (a collective in a process group; plain tensors,
    replicated on every rank, are written once)."""
    # deferred: torch.distributed.checkpoint, only for sharded checkpoints
    import torch.distributed.checkpoint as dcp

    reshard(model)
    dcp.save(
        model.state_dict(), checkpoint_id=str(Path(directory) / SHARDS_DIR), no_dist=not dist.is_initialized()
    )


@torch.no_grad()
def load_shards(model: nn.Module, directory: str | Path) -> None:
    """Read what `save_shards` wrote into `model` in place: each rank the slices of the shards it holds,
    however many ranks wrote them; a plain (unsharded) model in a single process reads whole tensors."""
    reshard(model)
    state = model.state_dict()  # views of the parameters: the load fills them
    dcp_load(state, Path(directory) / SHARDS_DIR)


def dcp_load(state: dict[str, Any], path: str | Path) -> None:
    """`torch.distributed.checkpoint.load` of `state` (filled in place) from `path`: a collective in a
    process group, else a single process reading whole tensors (without torch's warning about it)."""
    # deferred: torch.distributed.checkpoint, only for sharded checkpoints
    import torch.distributed.checkpoint as dcp

    alone = not dist.is_initialized()
    with warnings.catch_warnings():
        if alone:
            warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        dcp.load(state, checkpoint_id=str(path), no_dist=alone)


def has_shards(directory: str | Path) -> bool:
    return (Path(directory) / SHARDS_DIR / ".metadata").is_file()
