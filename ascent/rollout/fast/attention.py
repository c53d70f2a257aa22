"""Attention over the paged KV cache, in plain torch (any device) with a Triton decode kernel on CUDA.

- `slots_for(block_tables, positions, page_size)`: token positions -> cache slots.
- `prefill_attention`: prompt tokens, padded [B, Lq]. Fresh prompts use SDPA's causal path directly on the
  new K/V (grouped-query via enable_gqa, no K/V repeat). Rows that continue a cached prefix read their K/V
  back from the cache with an explicit mask (the CPU path; on CUDA triton_prefill.py reads the cache in
  place).
- `decode_attention_torch`: one query per row against its cached context, for CPU and as a fallback.
The Triton kernel (triton_decode.py) reads each KV head once for its whole group of query heads and only up
to each row's context length.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def slots_for(block_tables: Tensor, positions: Tensor, page_size: int) -> Tensor:
    """block_tables [B, P] int, positions [B, L] int64 -> slots [B, L] int64."""
    pages = block_tables.gather(1, positions // page_size).long()
    return pages * page_size + positions % page_size


def _gather_kv(cache: Tensor, block_tables: Tensor, length: int) -> Tensor:
    """cache [pages, kvh, ps, d], block_tables [B, P] -> [B, kvh, length, d] (positions 0..length-1)."""
    ps = cache.shape[2]
    pos = torch.arange(length, device=cache.device).expand(block_tables.shape[0], length)
    slots = slots_for(block_tables, pos, ps)
    return cache[slots // ps, :, slots % ps].transpose(1, 2)


def prefill_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    scale: float,
    cached: tuple[Tensor, Tensor, Tensor, Tensor, int] | None = None,
) -> Tensor:
    """q [B, Lq, nh, d], k/v [B, Lq, kvh, d] -> out [B, Lq, nh*d], causal within each row.

    `cached` = (k_cache [pages, kvh, ps, d], v_cache, block_tables [B, P], prefix_lens [B], max_total)
    when some rows continue a cached prefix: the new K/V must already be written to the cache; keys are then
    read back for positions 0..max_total-1 and masked per row (key position <= query position).
    """
    b, lq, nh, d = q.shape
    qt = q.transpose(1, 2)
    if cached is None:
        out = F.scaled_dot_product_attention(
            qt, k.transpose(1, 2), v.transpose(1, 2), is_causal=True, scale=scale, enable_gqa=True
        )
        return out.transpose(1, 2).reshape(b, lq, nh * d)
    k_cache, v_cache, block_tables, prefix, lk = cached
    keys = _gather_kv(k_cache, block_tables, lk)
    vals = _gather_kv(v_cache, block_tables, lk)
    qpos = prefix[:, None] + torch.arange(lq, device=q.device)[None, :]  # [B, Lq]
    kpos = torch.arange(lk, device=q.device)
    mask = kpos[None, None, :] <= qpos[:, :, None]  # [B, Lq, Lk]
    out = F.scaled_dot_product_attention(
        qt, keys, vals, attn_mask=mask[:, None], scale=scale, enable_gqa=True
    )
    return out.transpose(1, 2).reshape(b, lq, nh * d)


def decode_attention_torch(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    block_tables: Tensor,
    context_lens: Tensor,
    max_len: int,
    scale: float,
) -> Tensor:
    """q [B, nh, d], caches [pages, kvh, ps, d], block_tables [B, P], context_lens [B] -> out [B, nh*d].

    Reads positions 0..max_len-1 of every row and masks those >= context_len (an idle row, context 0, still
    sees position 0 so its softmax stays finite).
    """
    b, nh, d = q.shape
    keys = _gather_kv(k_cache, block_tables, max_len)
    vals = _gather_kv(v_cache, block_tables, max_len)
    kpos = torch.arange(max_len, device=q.device)
    mask = (kpos[None, :] < context_lens[:, None]) | (kpos[None, :] == 0)
    out = F.scaled_dot_product_attention(
        q[:, :, None, :], keys, vals, attn_mask=mask[:, None, None, :], scale=scale, enable_gqa=True
    )
    return out.reshape(b, nh * d)
