"""Packed-sequence attention for the trainer on CUDA: flash-attention varlen kernels instead of a dense mask.

The trainer packs a micro-batch's sequences back to back in one row, position_ids restarting at 0 for each
(`ascent.trainer.packing`). transformers' SDPA path turns that into a dense [N, N] block-causal mask, so the
kernel visits every block of the N x N score matrix (the cost grows with the square of the micro-batch, not
with the sequences' own lengths) and repeats K/V for grouped-query attention. With N = 16k tokens of 768-token
sequences that is about 20x the attention work actually needed.

`enable_varlen_attention(model)` registers `varlen_attention` with transformers' AttentionInterface under
the name "ascent_varlen" and switches the model to it. No mask function is registered for that name, so
transformers builds no mask; the function calls `torch.nn.attention.varlen.varlen_attn`, which computes only
each sequence's own causal triangle. Calls it cannot serve exactly (a padding mask, a KV cache, several
rows) raise instead of silently attending across sequences.

Sequence boundaries: the trainer's packer knows them on the host and passes them down as transformers'
flash-attention keywords (`attention_kwargs`: `cu_seq_lens_q`, `max_length_q`), so the function reads no
GPU value and a compiled decoder layer traces straight through it (one graph per layer, no graph break).
Without them it reads the boundaries off position_ids (a host sync, once per forward, cached on the tensor;
that part runs outside the compiler).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from ascent.models.multimodal import is_vision_language, language_model

NAME = "ascent_varlen"
_CACHE_ATTR = "_ascent_varlen_offsets"


def _kernel() -> Callable[..., Any] | None:
    try:
        from torch.nn.attention.varlen import varlen_attn  # deferred: only where torch has varlen attention
    except ImportError:
        return None
    return varlen_attn


_CALL: Callable[..., Tensor] | None = None  # the kernel bound to this torch's keywords (`register`)


def available() -> bool:
    """True where the varlen kernel can run: CUDA present and torch ships `varlen_attn`."""
    return torch.cuda.is_available() and _kernel() is not None


def attention_kwargs(model: nn.Module, cu_seqlens: Tensor | None, max_seqlen: int) -> dict[str, Any]:
    """Keywords for a packed forward of `model`: the host-known sequence offsets when it runs varlen
    attention (transformers passes them down to the attention function), else none."""
    config: Any = getattr(model, "config", None)
    if cu_seqlens is None or getattr(config, "_attn_implementation", None) != NAME:
        return {}
    return {
        "cu_seq_lens_q": cu_seqlens,
        "cu_seq_lens_k": cu_seqlens,
        "max_length_q": max_seqlen,
        "max_length_k": max_seqlen,
    }


@torch.compiler.disable  # reads the boundaries on the host; compiled layers call it eagerly
def sequence_offsets(position_ids: Tensor) -> tuple[Tensor, int]:
    """position_ids [1, N], restarting at 0 per sequence -> (cu_seqlens [S+1] int32, longest sequence).

    Cached on the tensor: every layer of one forward (and its recomputation in backward) gets the same
    position_ids object, so the host sync for the longest length happens once per forward.
    """
    cached = getattr(position_ids, _CACHE_ATTR, None)
    if cached is not None:
        return cached
    pos = position_ids[0]
    starts = torch.nonzero(pos == 0).flatten()
    if starts.numel() == 0 or int(starts[0]) != 0:
        raise ValueError("ascent_varlen attention: position_ids must start at 0 (one packed row).")
    ends = torch.cat([starts[1:], starts.new_tensor([pos.numel()])])
    cu = torch.cat([starts, ends[-1:]]).to(torch.int32)
    result = (cu, int((ends - starts).max()))
    setattr(position_ids, _CACHE_ATTR, result)
    return result


NATIVE_GQA = True  # False: repeat K/V per query head on torch builds without enable_gqa (the old path)


def _flash_gqa(q: Tensor, k: Tensor, v: Tensor, cu: Tensor, max_len: int, scale: float) -> Tensor:
    """Flash-attention's varlen kernel through its aten op, K/V with their own (fewer) heads: the kernel maps
    each query head to its KV head, and its backward sums the groups' K/V gradients itself. For torch builds
    whose `varlen_attn` has no `enable_gqa` (2.11): no [N, nh, d] copies of K and V, no reduction of them."""
    out = torch.ops.aten._flash_attention_forward(
        q, k, v, cu, cu, max_len, max_len, 0.0, True, False, scale=scale
    )
    return out[0]


def _bind(kernel: Callable[..., Any]) -> Callable[..., Tensor]:
    """kernel -> call(q [N, nh, d], k/v [N, kvh, d], cu, max_len, scale) -> [N, nh, d], causal per sequence,
    adapted once to the torch version's keywords (no signature inspection while a compiler traces it)."""
    params = inspect.signature(kernel).parameters
    window = "window_size" in params  # torch >= 2.12: causal is the window (-1, 0)
    has_scale, has_gqa = "scale" in params, "enable_gqa" in params

    def call(q: Tensor, k: Tensor, v: Tensor, cu: Tensor, max_len: int, scaling: float) -> Tensor:
        grouped = k.shape[1] != q.shape[1]
        if grouped and not has_gqa and NATIVE_GQA:
            return _flash_gqa(q, k, v, cu, max_len, scaling)
        kwargs: dict[str, Any] = {"window_size": (-1, 0)} if window else {"is_causal": True}
        if has_scale:
            kwargs["scale"] = scaling
        elif abs(scaling - q.shape[-1] ** -0.5) > 1e-12:
            q = q * (scaling * q.shape[-1] ** 0.5)
        if grouped:
            if has_gqa:
                kwargs["enable_gqa"] = True
            else:  # NATIVE_GQA off: repeat each K/V head for its query heads
                group = q.shape[1] // k.shape[1]
                k = k.repeat_interleave(group, dim=1)
                v = v.repeat_interleave(group, dim=1)
        return kernel(q, k, v, cu, cu, max_len, max_len, **kwargs)

    return call


def compute_dtype(value: Tensor) -> torch.dtype:
    """The half-precision dtype the kernel runs in: value's own, or autocast's (q/k leave RoPE in fp32)."""
    if value.dtype in (torch.float16, torch.bfloat16):
        return value.dtype
    device = value.device.type
    if torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    raise ValueError("ascent_varlen attention runs in bf16/fp16: use model.dtype=bf16 (autocast) with it.")


def varlen_attention(
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
    """transformers attention function: query [1, nh, N, d], key/value [1, kvh, N, d] -> ([1, N, nh, d],
    None)."""
    if attention_mask is not None or position_ids is None or query.shape[0] != 1:
        raise ValueError(
            "ascent_varlen attention serves one packed row with position_ids and no attention mask (the "
            "trainer's layout); load the model with attn_implementation='sdpa' for other uses."
        )
    if query.shape[2] != key.shape[2] or kwargs.get("sliding_window"):
        raise ValueError(
            "ascent_varlen attention: no KV cache and no sliding window (training forward only)."
        )
    if dropout:
        raise ValueError("ascent_varlen attention has no dropout; set the model's attention_dropout to 0.")
    if _CALL is None:
        raise RuntimeError("ascent_varlen attention: call enable_varlen_attention(model) first.")
    cu, max_len = kwargs.get("cu_seq_lens_q"), kwargs.get("max_length_q")
    if cu is None or max_len is None:
        cu, max_len = sequence_offsets(position_ids)
    dtype = compute_dtype(value)
    q, k, v = (t[0].transpose(0, 1).to(dtype).contiguous() for t in (query, key, value))
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    out = _CALL(q, k, v, cu, max_len, scale)
    return out.unsqueeze(0), None


def run_kernel(q: Tensor, k: Tensor, v: Tensor, cu: Tensor, max_len: int, scale: float) -> Tensor:
    """q [N, nh, d], k/v [N, kvh, d] of one packed row with offsets cu [S+1] -> [N, nh, d], causal per
    sequence (the kernel `register` bound; `ascent.models.ulysses` calls it over a whole row)."""
    if _CALL is None:
        raise RuntimeError("ascent_varlen attention: call register() first.")
    return _CALL(q, k, v, cu, max_len, scale)


def register() -> None:
    """Make "ascent_varlen" a known attention implementation (idempotent)."""
    from transformers import AttentionInterface  # deferred: transformers, slow to import

    global _CALL
    kernel = _kernel()
    if kernel is None:
        raise RuntimeError("torch.nn.attention.varlen.varlen_attn is missing in this torch build.")
    _CALL = _bind(kernel)
    AttentionInterface.register(NAME, varlen_attention)


def enable_varlen_attention(model: nn.Module) -> bool:
    """Switch a Hugging Face causal LM (peft-wrapped too) to varlen attention; False where unavailable.

    A vision-language model switches its language model only: the vision tower keeps its own setting
    (SDPA), since it calls attention per image or window with keywords this function refuses; the trainer
    runs the tower apart and hands the language model the packed row (`ascent.trainer.logprobs`)."""
    if not available():
        return False
    register()
    get_base = getattr(model, "get_base_model", None)
    lm: Any = get_base() if callable(get_base) else model
    if is_vision_language(lm):
        lm = language_model(lm)
    try:
        lm.set_attn_implementation(NAME)
    except (AttributeError, KeyError, ValueError):
        lm.config._attn_implementation = NAME
    return lm.config._attn_implementation == NAME


def enable_for_training(
    model: nn.Module, device: torch.device, compute_dtype: torch.dtype, setting: str = "auto"
) -> bool:
    """What the trainer workers call (`train.attention`): varlen attention on CUDA with bf16/fp16 compute
    for `auto`/`varlen`, SDPA otherwise; `varlen` where it cannot run is an error. -> whether varlen is on."""
    if setting not in ("auto", "varlen", "sdpa"):
        raise ValueError(f"train.attention={setting!r}: use auto, varlen or sdpa.")
    usable = device.type == "cuda" and compute_dtype in (torch.bfloat16, torch.float16) and available()
    if setting == "varlen" and not usable:
        raise ValueError(
            "train.attention=varlen needs CUDA, model.dtype=bf16 (or fp16) and torch's varlen_attn; use "
            "train.attention=auto or sdpa here."
        )
    if setting == "sdpa" or not usable:
        return False
    return enable_varlen_attention(model)
