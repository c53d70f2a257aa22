"""Ulysses sequence-parallel attention: N ranks share one packed row, each holding 1/N of its tokens.

Everything in a decoder layer but attention works token by token, so each rank runs the layers on its own
contiguous slice of the packed row (`ascent.trainer.sequence_parallel` cuts it). Attention needs every
token of a sequence; around it, an all-to-all turns [tokens/N, heads] into [tokens, heads/N] (each rank
gets ALL tokens of 1/N of the heads), the kernel runs over the whole row with the row's global sequence
offsets, and a second all-to-all turns the output back. Both all-to-alls carry gradients (the backward of
one is the other). Grouped-query models with fewer KV heads than ranks replicate each KV head over the ranks
that share it (N a multiple of the KV heads).

`enable_sequence_parallel(model, group, varlen)` registers `ulysses_attention` with transformers'
AttentionInterface under "ascent_ulysses" (no mask function: transformers builds no mask) and switches the
model to it. The process group is one per process (a rank belongs to one sequence-parallel group), kept in
this module, so the recomputation of a checkpointed layer in backward finds it too. The kernel over the
whole row is the varlen flash kernel (`ascent.models.varlen`, CUDA with bf16/fp16) or, elsewhere (CPU, fp32),
SDPA with a block-causal mask built from the offsets.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn
from torch.distributed import ProcessGroup

from ascent.models import varlen

NAME = "ascent_ulysses"
_STATE: dict[str, Any] = {"group": None, "varlen": False}


def check_heads(heads: int, kv_heads: int, size: int) -> str | None:
    """Why `size` ranks cannot split attention of `heads` query / `kv_heads` KV heads, or None if they can."""
    if heads % size:
        return f"the model has {heads} attention heads, not a multiple of {size}"
    if kv_heads % size and size % kv_heads:
        return f"the model has {kv_heads} KV heads: {size} must divide them or be a multiple of them"
    return None


def largest_degree(heads: int, kv_heads: int, size: int) -> int:
    """The largest degree <= size that splits `heads` query / `kv_heads` KV heads (1 always does)."""
    return max(n for n in range(1, max(size, 1) + 1) if check_heads(heads, kv_heads, n) is None)


class _AllToAll(torch.autograd.Function):
    """x [N, ...] (chunk i goes to rank i) -> [N, ...] (chunk j came from rank j); backward: the same."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, group: Any) -> Tensor:
        ctx.group = group
        x = x.contiguous()
        out = torch.empty_like(x)
        dist.all_to_all_single(out, x, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        grad = grad.contiguous()
        out = torch.empty_like(grad)
        dist.all_to_all_single(out, grad, group=ctx.group)
        return out, None


def scatter_heads(x: Tensor, size: int, group: ProcessGroup) -> Tensor:
    """x [n, h, d] (this rank's n tokens, all heads) -> [n * size, h / size, d] (all tokens, its heads)."""
    n, h, d = x.shape
    chunks = x.reshape(n, size, h // size, d).transpose(0, 1)  # [size, n, h/size, d]: chunk i for rank i
    return _AllToAll.apply(chunks, group).reshape(size * n, h // size, d)


def gather_heads(x: Tensor, size: int, group: ProcessGroup) -> Tensor:
    """x [n * size, h / size, d] (all tokens, this rank's heads) -> [n, h, d] (its tokens, all heads)."""
    total, hl, d = x.shape
    n = total // size
    got = _AllToAll.apply(x.reshape(size, n, hl, d), group)  # [size (head block), n, h/size, d]
    return got.transpose(0, 1).reshape(n, size * hl, d)


def block_causal_attention(q: Tensor, k: Tensor, v: Tensor, cu: Tensor, scale: float) -> Tensor:
    """q [N, h, d], k/v [N, kvh, d], cu [S+1] sequence offsets -> [N, h, d]: each token attends to the
    earlier tokens of its own sequence (SDPA with a dense [N, N] mask; the path off CUDA)."""
    n = q.shape[0]
    seq = torch.bucketize(torch.arange(n, device=q.device), cu[1:].to(q.device).long(), right=True)
    idx = torch.arange(n, device=q.device)
    mask = (seq[:, None] == seq[None, :]) & (idx[None, :] <= idx[:, None])
    if k.shape[1] != q.shape[1]:
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask, scale=scale
    )
    return out.transpose(0, 1)


def _replicate_kv(x: Tensor, size: int) -> Tensor:
    """[n, kvh, d] -> [n, max(kvh, size), d]: each KV head repeated for the ranks that share it."""
    return x if x.shape[1] % size == 0 else x.repeat_interleave(size // x.shape[1], dim=1)


@torch.compiler.disable  # all-to-alls and host-known offsets: compiled layers call it eagerly
def ulysses_attention(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    position_ids: Tensor | None = None,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """transformers attention function: query [1, nh, n, d], key/value [1, kvh, n, d] (this rank's n tokens)
    -> ([1, n, nh, d], None); the row's global offsets come as `cu_seq_lens_q` / `max_length_q`."""
    group = _STATE["group"]
    cu, max_len = kwargs.get("cu_seq_lens_q"), kwargs.get("max_length_q")
    if group is None or cu is None or max_len is None:
        raise RuntimeError(
            "ascent_ulysses attention: call enable_sequence_parallel(model, group) first and pass the "
            "packed row's global offsets (ascent.trainer.sequence_parallel does both)."
        )
    if attention_mask is not None or query.shape[0] != 1 or dropout or kwargs.get("sliding_window"):
        raise ValueError(
            "ascent_ulysses attention serves one packed row: no mask, no dropout, no sliding window."
        )
    size = dist.get_world_size(group)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    use_varlen = _STATE["varlen"]
    dtype = varlen.compute_dtype(value) if use_varlen else query.dtype
    q, k, v = (t[0].transpose(0, 1).to(dtype) for t in (query, key, value))  # [n, heads, d]
    q = scatter_heads(q, size, group)
    k = scatter_heads(_replicate_kv(k, size), size, group)
    v = scatter_heads(_replicate_kv(v, size), size, group)
    if use_varlen:
        out = varlen.run_kernel(q.contiguous(), k.contiguous(), v.contiguous(), cu, int(max_len), scale)
    else:
        out = block_causal_attention(q, k, v, cu, scale)
    return gather_heads(out, size, group).unsqueeze(0), None


def enable_sequence_parallel(model: nn.Module, group: ProcessGroup, use_varlen: bool) -> None:
    """Switch a Hugging Face causal LM (peft-wrapped too) to Ulysses attention over `group`; `use_varlen`:
    the flash varlen kernel inside (CUDA, bf16/fp16), else SDPA with a block-causal mask."""
    from transformers import AttentionInterface  # deferred: transformers, slow to import

    if use_varlen:
        varlen.register()
    _STATE.update(group=group, varlen=use_varlen)
    AttentionInterface.register(NAME, ulysses_attention)
    get_base = getattr(model, "get_base_model", None)
    lm: Any = get_base() if callable(get_base) else model
    try:
        lm.set_attn_implementation(NAME)
    except (AttributeError, KeyError, ValueError):
        lm.config._attn_implementation = NAME
    if lm.config._attn_implementation != NAME:
        raise RuntimeError(f"{type(lm).__name__}: could not switch its attention to {NAME}.")
