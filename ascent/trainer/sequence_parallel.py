"""Sequence parallelism of the policy trainer (`train.sequence_parallel`): N ranks share every packed row.

Ranks = data-parallel groups x sequence-parallel groups: consecutive ranks [g*N, (g+1)*N) form one
sequence-parallel group (FSDP2, when on, still shards over every rank). The controller hands each rank its
share of a mini-batch as without sequence parallelism; the ranks of a group pool their shares
(`gather_samples`), so they plan and pack the same micro-batches. Of each packed row (padded to a multiple
of N with one filler sequence at the end) rank r keeps the contiguous slice [r*n, (r+1)*n) of n = N_pad/N
tokens, with their positions within their sequences and the row's GLOBAL sequence offsets; attention runs
across the group (`ascent.models.ulysses`). Each rank applies the LM head to the response rows it holds
and the group all-gathers those logprobs into the row's [M] (`gather_rows`), so every rank of a group
computes the same micro-batch loss as an unsplit run would. The backward of that gather hands each rank
the gradient of its own rows only (the loss is replicated over the group, not summed), and the attention
all-to-alls route the rest; the ranks' parameter gradients then SUM to the unsplit gradient, which is what
the data-parallel reduction (or FSDP2's reduce-scatter) already does over all ranks. Metrics are reduced
over the data-parallel group only (`dp_group`: one rank of each sequence-parallel group), not counted N
times.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed import ProcessGroup

from ascent.errors import AscentError
from ascent.messages import TrainSample
from ascent.models import varlen
from ascent.models.moe import is_moe
from ascent.models.multimodal import is_vision_language
from ascent.models.ulysses import check_heads, enable_sequence_parallel, largest_degree
from ascent.trainer.distributed import all_reduce_max, all_reduce_sum, world_size
from ascent.trainer.packing import PackedBatch

FIELD = "train.sequence_parallel"


class SequenceParallelError(AscentError, ValueError):
    """A sequence-parallel setting this run cannot use; the message names the field, the value, the fix."""


@dataclass(frozen=True)
class SequenceParallel:
    """This rank's place: `size` ranks per group, `rank` within its group, the group and its data-parallel
    group (the ranks at the same `rank` in every group)."""

    size: int
    rank: int
    group: ProcessGroup
    dp_group: ProcessGroup

    def reducers(self) -> tuple[Callable[[Tensor], Tensor], Callable[[Tensor], Tensor]]:
        """(sum, max) over the data-parallel group: what `MetricSums.reduce` takes."""
        return (
            functools.partial(all_reduce_sum, group=self.dp_group),
            functools.partial(all_reduce_max, group=self.dp_group),
        )


def check_model(size: int, config: Any) -> None:
    """Refuse a model whose attention heads `size` ranks cannot split (SequenceParallelError)."""
    heads = int(getattr(config, "num_attention_heads", 0) or 0)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    why = check_heads(heads, kv_heads, size)
    if why:
        raise SequenceParallelError(
            f"{FIELD}={size}: {why}; use a divisor of {heads} that divides or is a multiple of the "
            f"{kv_heads} KV heads (e.g. {largest_degree(heads, kv_heads, size)})."
        )


def init_sequence_parallel(size: int) -> SequenceParallel | None:
    """Create the groups (a collective: every rank calls it, in the same order); None for size 1."""
    if size == 1:
        return None
    world = world_size()
    if size < 1 or world % size:
        raise SequenceParallelError(
            f"{FIELD}={size}: the {world} trainer ranks (cluster.num_trainer_workers) must split into "
            f"groups of {size}; set it to a divisor of {world}, or change the rank count."
        )
    rank = dist.get_rank()
    mine: dict[str, Any] = {}
    for g in range(world // size):  # every rank creates every group, in one order (new_group is collective)
        group = dist.new_group(list(range(g * size, (g + 1) * size)))
        if rank // size == g:
            mine["group"] = group
    for r in range(size):
        group = dist.new_group(list(range(r, world, size)))
        if rank % size == r:
            mine["dp_group"] = group
    return SequenceParallel(size=size, rank=rank % size, **mine)


def gather_samples(sp: SequenceParallel, samples: Sequence[TrainSample]) -> tuple[list[TrainSample], int]:
    """This rank's samples -> (the group's samples, rank by rank; where this rank's start in them)."""
    shares: list[Any] = [None] * sp.size
    dist.all_gather_object(shares, list(samples), group=sp.group)
    start = sum(len(s) for s in shares[: sp.rank])
    return [s for share in shares for s in share], start


@dataclass
class RowSlice:
    """This rank's slice of a packed row: `input_ids`, `position_ids` [1, n]; `logit_index` [m] (rows of
    the slice that predict response tokens), `targets` [m]; `counts`: m of every rank of the group; `cu`
    [S+1 or S+2] int32 and `max_len`: the padded row's global sequence offsets and longest sequence."""

    input_ids: Tensor
    position_ids: Tensor
    logit_index: Tensor
    targets: Tensor
    counts: list[int]
    cu: Tensor
    max_len: int


def slice_row(packed: PackedBatch, size: int, rank: int) -> RowSlice:
    """A packed row -> rank `rank`'s slice of it (see module doc): N tokens padded to n * size with one
    filler sequence (token 0, its own positions), slice [rank*n, (rank+1)*n)."""
    total = packed.num_tokens
    n = -(-total // size)
    pad = n * size - total
    ids, pos = packed.input_ids, packed.position_ids
    assert packed.cu_seqlens is not None  # `pack` always sets it
    cu = packed.cu_seqlens
    if pad:
        ids = torch.cat([ids, ids.new_zeros(1, pad)], dim=1)
        pos = torch.cat([pos, torch.arange(pad, device=pos.device)[None]], dim=1)
        cu = torch.cat([cu, cu.new_tensor([n * size])])
    lo, hi = rank * n, (rank + 1) * n
    edges = torch.arange(size + 1, device=packed.logit_index.device) * n
    bounds = torch.searchsorted(packed.logit_index, edges).tolist()  # one host read per micro-batch
    first, last = bounds[rank], bounds[rank + 1]
    return RowSlice(
        input_ids=ids[:, lo:hi],
        position_ids=pos[:, lo:hi],
        logit_index=packed.logit_index[first:last] - lo,
        targets=packed.targets[first:last],
        counts=[bounds[i + 1] - bounds[i] for i in range(size)],
        cu=cu,
        max_len=max(packed.max_seqlen, pad),
    )


class _GatherRows(torch.autograd.Function):
    """x [m_r, ...] on each rank -> [sum m, ...] in rank order; backward: this rank's rows of the gradient
    (every rank of the group computes the same loss of the gathered rows)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, counts: list[int], rank: int, group: Any) -> Tensor:
        most = max(counts)
        buf = x.new_zeros((most, *x.shape[1:]))
        buf[: x.shape[0]] = x
        parts = [torch.empty_like(buf) for _ in counts]
        dist.all_gather(parts, buf.contiguous(), group=group)
        ctx.start, ctx.count = sum(counts[:rank]), counts[rank]
        return torch.cat([p[:c] for p, c in zip(parts, counts, strict=True)])

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None, None]:
        return grad[ctx.start : ctx.start + ctx.count], None, None, None


def gather_rows(x: Tensor, row: RowSlice, sp: SequenceParallel, anchor: Tensor) -> Tensor:
    """This rank's per-response-row values [m] -> the row's [M], in order. `anchor` (a zero that depends
    on this rank's whole forward) is added so that every rank's backward runs through its layers, and so
    through the attention all-to-alls the other ranks wait on, even with no response row of its own."""
    out = _GatherRows.apply(x, row.counts, sp.rank, sp.group)
    return out + anchor if torch.is_grad_enabled() and anchor.requires_grad else out


def response_hidden(
    decoder: nn.Module, packed: PackedBatch, sp: SequenceParallel
) -> tuple[Tensor, Tensor, Callable[[Tensor], Tensor]]:
    """The decoder over this rank's slice of the packed row -> (hidden rows predicting the response tokens
    it holds [m, H], their targets [m], gather: per-row values [m] -> the row's [M])."""
    row = slice_row(packed, sp.size, sp.rank)
    out = decoder(
        input_ids=row.input_ids,
        position_ids=row.position_ids,
        attention_mask=None,
        use_cache=False,
        cu_seq_lens_q=row.cu,
        cu_seq_lens_k=row.cu,
        max_length_q=row.max_len,
        max_length_k=row.max_len,
    )
    hidden = out.last_hidden_state[0]
    anchor = hidden.sum() * 0.0
    return hidden.index_select(0, row.logit_index), row.targets, lambda x: gather_rows(x, row, sp, anchor)


def setup(
    size: int,
    models: Sequence[nn.Module],
    *,
    device: torch.device,
    compute_dtype: torch.dtype,
    attention: str,
) -> SequenceParallel | None:
    """`train.sequence_parallel` for a trainer rank: check the policy (the first of `models`), create the
    groups and switch every model to Ulysses attention (the varlen kernel inside where `attention` allows
    it: CUDA, bf16/fp16). None for size 1. A collective: every rank calls it."""
    if size == 1:
        return None
    lm: Any = getattr(models[0], "get_base_model", lambda: models[0])()
    if is_vision_language(lm) or is_moe(lm):
        raise SequenceParallelError(
            f"{FIELD}={size}: {type(lm).__name__} is a vision-language or mixture-of-experts model, which "
            f"sequence parallelism does not split yet; set {FIELD}=1."
        )
    check_model(size, lm.config)
    sp = init_sequence_parallel(size)
    half = compute_dtype in (torch.bfloat16, torch.float16)
    use_varlen = attention != "sdpa" and device.type == "cuda" and half and varlen.available()
    if attention == "varlen" and not use_varlen:
        raise SequenceParallelError(
            "train.attention=varlen needs CUDA, model.dtype=bf16 (or fp16) and torch's varlen_attn; use "
            "train.attention=auto or sdpa here."
        )
    assert sp is not None
    for model in models:
        enable_sequence_parallel(model, sp.group, use_varlen)
    return sp
