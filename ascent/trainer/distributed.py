"""Data-parallel glue of the policy update: gradient and metric all-reduce (no-ops in a single process).

Every worker's loss is its share of the GLOBAL mini-batch loss (the aggregation divides by global totals), so
the mini-batch gradient is the SUM of the workers' gradients: `all_reduce_grads` sums, it never averages.

The seam for sharded training (FSDP2, `ascent/models/parallel.py`): a parallelize function wraps the model
and then reduces gradients itself during backward; `PolicyWorker` is told so (`grads_synced_by_wrapper`)
and skips `all_reduce_grads`. The wrapper must SUM as well (FSDP2 averages over the mesh by default, which
would divide the step by the world size; `ascent.models.parallel.sum_gradients` turns that off).
`clip_grad_norm` clips to the norm of the whole gradient, sharded (DTensor) gradients included.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed import ProcessGroup
from torch.distributed.tensor import DTensor

BUCKET_ELEMS = 32 * 1024 * 1024


def world_size() -> int:
    """Processes in the default group (1 when torch.distributed is not initialised)."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def all_reduce_grads(params: Iterable[torch.nn.Parameter], bucket_elems: int = BUCKET_ELEMS) -> None:
    """Sum the .grad of every trainable parameter over all processes, in place, in flat buckets.

    A bucket holds grads of one dtype and device, at most `bucket_elems` elements (one larger grad goes
    alone).
    """
    if world_size() == 1:
        return
    buckets: dict[tuple[torch.dtype, torch.device], list[Tensor]] = {}
    for p in params:
        if not (p.requires_grad and p.grad is not None):
            continue
        key = (p.grad.dtype, p.grad.device)
        bucket = buckets.setdefault(key, [])
        if bucket and sum(g.numel() for g in bucket) + p.grad.numel() > bucket_elems:
            _reduce_bucket(bucket)
            bucket.clear()
        bucket.append(p.grad)
    for bucket in buckets.values():
        if bucket:
            _reduce_bucket(bucket)


def _reduce_bucket(grads: list[Tensor]) -> None:
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


def clip_grad_norm(params: list[torch.nn.Parameter], max_norm: float) -> float:
    """Scale the grads of `params` so that their GLOBAL L2 norm is at most `max_norm`; return that norm.

    Sharded (DTensor) gradients: each rank's norm is of its shard; `full_tensor()` all-reduces the squares
    into the norm of the whole gradient, so every rank clips by the same factor. Plain gradients: as
    `torch.nn.utils.clip_grad_norm_` (replicated data parallelism has already summed them).
    """
    grads = [p.grad for p in params if p.grad is not None]
    norm = torch.nn.utils.get_total_norm(grads)
    if isinstance(norm, DTensor):
        norm = norm.full_tensor()
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm)
    return float(norm)


def all_reduce_sum(x: Tensor, group: ProcessGroup | None = None) -> Tensor:
    """x summed over all processes, or over `group` (a copy; x itself in a single process)."""
    if world_size() == 1 or (group is not None and dist.get_world_size(group) == 1):
        return x
    y = x.clone()
    dist.all_reduce(y, op=dist.ReduceOp.SUM, group=group)
    return y


def all_reduce_max(x: Tensor, group: ProcessGroup | None = None) -> Tensor:
    """Element-wise max of x over all processes, or over `group` (a copy; x itself in a single process)."""
    if world_size() == 1 or (group is not None and dist.get_world_size(group) == 1):
        return x
    y = x.clone()
    dist.all_reduce(y, op=dist.ReduceOp.MAX, group=group)
    return y
