"""LM head + log-softmax over the response rows as ONE autograd function, chunked over rows.

The plain way (`ascent.trainer.logprobs._chunk_logprobs` under `torch.utils.checkpoint`) costs, for every
chunk of rows: a cast of the fp32 head weight to bf16 in forward and again in the recomputation, a bf16
[V, H] weight gradient, its cast to fp32, and an fp32 add into `.grad`. With a tied 152k-token vocabulary
that is ~3 GB of memory traffic per chunk, and the profile of a 0.5B update put it at ~10% of the GPU time
(BENCHMARKS.md). `head_logprobs` does the same math with:

- one cast of the weight per micro-batch (forward; backward reuses it);
- the weight gradient of every chunk accumulated straight into ONE fp32 [V, H] buffer by the matmul itself
  (`addmm(..., out_dtype=float32)` on CUDA: no bf16 rounding of partial sums, fewer bytes moved);
- the logits gradient written in place over the recomputed logits (one [chunk, V] buffer in backward);
- no checkpoint hooks: forward keeps only the [M, H] input, per-row logsumexp and entropy (or, with
  `keep_logits` (`train.keep_head_logits`), every chunk's logits too, so backward skips the recomputation).

Math (z = logits / T, p = softmax(z), lse = logsumexp(z), H = lse - sum p z):
    logp_t = z_t - lse,   d logp_t / d logits = (onehot_t - p) / T,
    d H / d logits = -p * (log p + H) / T.
Exact against autograd through `log_softmax` (tests/unit/trainer/test_trainer_head.py).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, cast

import torch
from torch import Tensor, nn

from ascent.models.logits import logits_fp32


def chunk_stats(z: Tensor, targets: Tensor, temperature: float, with_entropy: bool) -> tuple[Tensor, ...]:
    """z [n, V] logits (compute dtype), targets [n] -> (logp [n], lse [n], entropy [n] or [0]), all fp32.

    Written in place where it can be, so the eager form holds two fp32 [n, V] buffers at most."""
    zf = z.float()
    if temperature != 1.0:
        zf.div_(temperature)
    lse = torch.logsumexp(zf, dim=-1)
    logp = zf.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse
    if not with_entropy:
        return logp, lse, zf.new_zeros(0)
    lp = zf.sub_(lse.unsqueeze(-1))  # log p, every entry <= 0: the entropy below is a sum of terms >= 0
    ent = -lp.exp().mul_(lp).sum(-1)
    return logp, lse, ent


def logits_grad_(
    z: Tensor,
    targets: Tensor,
    lse: Tensor,
    ent: Tensor,
    g_logp: Tensor,
    g_ent: Tensor,
    temperature: float,
) -> None:
    """In place: logits z [n, V] -> dL/dlogits, given lse, entropy, dL/dlogp and dL/dentropy (all [n]).

    -p (g_logp + g_ent (log p + H)) / T everywhere, then + g_logp / T at the target: one pointwise pass that
    the compiler fuses into a single kernel writing z, and an [n]-element scatter."""
    t = z.float()
    if temperature != 1.0:
        t.div_(temperature)
    t.sub_(lse.unsqueeze(-1))  # log p
    p = t.exp()
    t.add_(ent.unsqueeze(-1)).mul_(g_ent.unsqueeze(-1)).add_(g_logp.unsqueeze(-1)).mul_(p).neg_()
    if temperature != 1.0:
        t.div_(temperature)
    z.copy_(t)
    z.scatter_add_(-1, targets.unsqueeze(-1), (g_logp / temperature).unsqueeze(-1).to(z.dtype))


def chunk_stats_kept(
    z: Tensor, targets: Tensor, temperature: float, with_entropy: bool, dtype: torch.dtype
) -> tuple[Tensor, ...]:
    """`chunk_stats` plus z cast to `dtype` [n, V], taken before the stats touch z: the compiled form writes
    the cast from the pass that reads z anyway."""
    kept = z.to(dtype, copy=True)  # a copy even in z's dtype: chunk_stats works in place
    return (*chunk_stats(z, targets, temperature, with_entropy), kept)


#: On CUDA the logits gradient runs as one Triton kernel (`ascent.trainer.triton_head`); False keeps the
#: compiled pointwise form (bench/update_sweep.py's `inductorgrad` variant measures the two).
TRITON_LOGITS_GRAD = True
#: On CUDA the forward's per-chunk stats (and the kept cast) run as one Triton pass per row
#: (`triton_head.chunk_stats_triton`); False keeps the compiled `chunk_stats`/`chunk_stats_kept`
#: (bench/update_sweep.py's `inductorstats` variant: 7.5% slower 0.5B update on an H100, BENCHMARKS.md).
TRITON_STATS = True


def _stats_fn(device: torch.device, compiled: bool, keep: bool) -> Callable[..., Any]:
    """The forward's per-chunk stats function for `device` (see `TRITON_STATS`): called as
    fn(z, targets, temperature, with_entropy[, kept dtype])."""
    if TRITON_STATS and device.type == "cuda":
        try:
            from ascent.trainer.triton_head import chunk_stats_triton  # deferred: as in _logits_grad_fn
        except ImportError:
            pass
        else:
            return chunk_stats_triton
    fn = chunk_stats_kept if keep else chunk_stats
    return _compiled(fn) if compiled else fn


def _logits_grad_fn(device: torch.device, compiled: bool) -> Callable[..., Any]:
    """The in-place logits-gradient function for `device` (see `TRITON_LOGITS_GRAD`)."""
    if TRITON_LOGITS_GRAD and device.type == "cuda":
        try:
            # deferred: imports triton, which ships with torch's Linux CUDA wheels, not with every build
            from ascent.trainer.triton_head import logits_grad_triton_
        except ImportError:
            pass
        else:
            return logits_grad_triton_
    return _compiled(logits_grad_) if compiled else logits_grad_


@functools.cache
def _compiled(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` compiled with automatic dynamic shapes: the row count turns dynamic when it first changes, the
    vocabulary stays static (a dynamic V was measured 6x slower in the reductions on an H100)."""
    return cast(Callable[..., Any], torch.compile(fn))


@functools.cache
def _fp32_out_matmul(device_type: str) -> bool:
    """Whether `addmm(acc_fp32, a_bf16, b_bf16, out_dtype=float32, out=acc)` runs here (CUDA, torch >=
    2.9)."""
    if device_type != "cuda":
        return False
    try:
        a = torch.ones(2, 2, dtype=torch.bfloat16, device=device_type)
        acc = torch.ones(2, 2, device=device_type)
        torch.addmm(acc, a, a, out_dtype=torch.float32, out=acc)  # type: ignore[call-overload]
        return bool(acc[0, 0].item() == 3.0)
    except (RuntimeError, TypeError, NotImplementedError):
        return False


def _accumulate(acc: Tensor, a: Tensor, b: Tensor) -> None:
    """acc [V, H] fp32 += a [V, n] @ b [n, H] (a, b in the compute dtype), summed in fp32."""
    if a.dtype == acc.dtype:
        acc.addmm_(a, b)
    elif _fp32_out_matmul(acc.device.type):
        torch.addmm(acc, a, b, out_dtype=torch.float32, out=acc)  # type: ignore[call-overload]
    else:  # CPU half precision: the chunk's product rounds to `a.dtype` before the fp32 sum
        acc.add_(a @ b)


class _HeadLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        hidden: Tensor,
        weight: Tensor,
        targets: Tensor,
        temperature: float,
        chunk: int,
        with_entropy: bool,
        entropy_grad: bool,
        dtype: torch.dtype,
        compiled: bool,
        keep: bool,
    ) -> tuple[Tensor, Tensor]:
        h, w = hidden.to(dtype), weight.to(dtype)
        stats, extra = _stats_fn(h.device, compiled, keep), (dtype,) if keep else ()
        parts = [
            stats(logits_fp32(hc, w), tc, temperature, with_entropy, *extra)
            for hc, tc in zip(h.split(chunk), targets.split(chunk), strict=True)
        ]
        logp, lse, ent = (torch.cat(x) for x in list(zip(*parts, strict=True))[:3])
        kept = [p[3] for p in parts] if keep else []
        ctx.save_for_backward(h, w, targets, lse, ent, *kept)
        ctx.args = (temperature, chunk, entropy_grad and with_entropy, compiled, hidden.dtype, weight.dtype)
        if not ctx.args[2]:
            ctx.mark_non_differentiable(ent)
        ctx.set_materialize_grads(False)
        return logp, ent

    @staticmethod
    def backward(ctx: Any, g_logp: Tensor | None, g_ent: Tensor | None) -> tuple[Tensor | None, ...]:
        h, w, targets, lse, ent, *kept = ctx.saved_tensors
        temperature, chunk, ent_grad, compiled, h_dtype, w_dtype = ctx.args
        n = h.shape[0]
        g_logp = lse.new_zeros(n) if g_logp is None else g_logp.float()
        g_ent = g_ent.float() if ent_grad and g_ent is not None else lse.new_zeros(n)
        ent = ent if ent.numel() else lse.new_zeros(n)
        grad_fn = _logits_grad_fn(h.device, compiled)
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_h = torch.empty_like(h) if need_h else None
        grad_w = torch.zeros(w.shape, dtype=torch.float32, device=w.device) if need_w else None
        for i, s in enumerate(range(0, n, chunk)):
            e = min(n, s + chunk)
            z = kept[i] if kept else h[s:e] @ w.T
            grad_fn(z, targets[s:e], lse[s:e], ent[s:e], g_logp[s:e], g_ent[s:e], temperature)
            if grad_h is not None:
                torch.mm(z, w, out=grad_h[s:e])
            if grad_w is not None:
                _accumulate(grad_w, z.T, h[s:e])
        return (
            None if grad_h is None else grad_h.to(h_dtype),
            None if grad_w is None else grad_w.to(w_dtype),
            *([None] * 8),
        )


def fusable_head(head: nn.Module) -> bool:
    """Whether `head` is a plain bias-free Linear (the LM head of every causal LM we load; a LoRA-wrapped
    or biased head takes the per-chunk checkpointed path instead)."""
    return type(head) is nn.Linear and head.bias is None


def head_logprobs(
    head: nn.Module,
    hidden: Tensor,
    targets: Tensor,
    *,
    temperature: float = 1.0,
    chunk_tokens: int = 1024,
    with_entropy: bool = False,
    entropy_grad: bool = True,
    compiled: bool = False,
    keep_logits: bool = False,
) -> tuple[Tensor, Tensor]:
    """hidden [M, H], targets [M] -> (logprobs [M], entropy [M] or [0]), fp32, through a bias-free Linear
    head (see module doc). Runs in autocast's dtype when autocast is on, else in `hidden`'s dtype.

    `entropy_grad=False` returns the entropy as a metric without a gradient. `keep_logits`: where a backward
    will run, every chunk's logits are kept from the forward in the compute dtype ([M, V] more memory) and
    the backward reads them instead of recomputing them: one head matmul of three fewer."""
    device = hidden.device.type
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else hidden.dtype
    weight = cast(Tensor, head.weight)
    keep = keep_logits and torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    args = (temperature, chunk_tokens, with_entropy, entropy_grad, dtype, compiled, keep)
    logp, ent = _HeadLogprobs.apply(hidden, weight, targets, *args)
    return logp, ent
