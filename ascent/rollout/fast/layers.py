"""The per-token math of one decoder layer, written as plain functions of tensors (no nn.Module).

Every function works on flat token batches x [T, H] (T = decode rows, or padded prefill tokens), takes the
weights as arguments, and makes no host sync, so one `torch.compile` of each serves all layers and every
batch size, and the results can be captured in a CUDA graph. Attention itself lives in attention.py.
The arithmetic follows transformers' Qwen2/Qwen3/Llama modules, so fp32 results agree with HF to rounding.
In half precision it follows what the trainer computes under autocast over fp32 master weights, operation
for operation: the residual stream `x` starts from the fp32 embedding and stays fp32, norms run in fp32
with fp32 scales, RoPE rotates q and k in fp32 with fp32 cos/sin (HF builds cos/sin in the hidden states'
dtype, fp32 there, and `bf16 * fp32` promotes), and only matmul and attention inputs are cast to the
weights' dtype. Each half-precision shortcut (a bf16 residual stream, a bf16 embedding table, bf16 RoPE)
moves the engine's logprobs away from the trainer's: small on average, but a trained model amplifies them
at single tokens by up to nats (BENCHMARKS.md, "Sampler/trainer logprob agreement").

A layer's closing residual add (`x + mlp_out`, fp32 plus the down matmul's output in the weights' dtype) is
left pending: `attn_out` returns both terms and the next layer's `attn_in` adds them before its RMSNorm, in
the same compiled function, so the add costs no kernel of its own (the matmul library cannot fuse an fp32
add into a half-precision matmul). The sum is the same operation on the same values as an add at the end of
`attn_out`, so results are bit-identical; whoever needs the complete residual mid-stack adds the pending
term first. With fp32 weights nothing is left pending: inductor fuses that add into the matmul (addmm).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ascent.models.logits import logits_fp32
from ascent.rollout.fast.fp8 import linear
from ascent.rollout.fast.spec import ModelSpec


def rms_norm(x: Tensor, w: Tensor, eps: float) -> Tensor:
    """x [..., H], w [H] -> [..., H]: normalise in fp32, cast back, then scale (as HF does)."""
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return w * x32.to(x.dtype)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor, out_dtype: torch.dtype) -> Tensor:
    """x [T, heads, d], cos/sin [T, d] -> x rotated (rotate-half convention) in `out_dtype`.

    Computed in cos/sin's dtype (fp32 tables: as HF under autocast, where bf16 q times fp32 cos is fp32),
    then rounded once to `out_dtype`, the attention kernel's input dtype."""
    c, s = cos[:, None, :], sin[:, None, :]
    x = x.to(cos.dtype)
    x1, x2 = x.chunk(2, dim=-1)
    return (x * c + torch.cat((-x2, x1), dim=-1) * s).to(out_dtype)


def _linear_parts(x: Tensor, ws: tuple[Tensor, ...], bs: tuple[Tensor | None, ...] | None) -> Tensor:
    """x [T, H] through one fused matrix or several stacked ones -> [T, sum of outputs] (a matrix may be
    an FP8 one: fp8.py)."""
    if len(ws) == 1:
        return linear(x, ws[0], bs[0] if bs else None)
    return torch.cat([linear(x, w, bs[i] if bs else None) for i, w in enumerate(ws)], dim=-1)


class LayerMath:
    """The layer functions for one architecture; the spec's sizes are constants for the compiler."""

    def __init__(self, spec: ModelSpec):
        self.nh, self.kvh, self.d = spec.num_heads, spec.num_kv_heads, spec.head_dim
        self.eps = spec.rms_eps
        self.splits = (spec.q_size, spec.kv_size, spec.kv_size)
        self.inter = spec.intermediate_size

    def attn_in(
        self,
        x: Tensor,
        pending: Tensor | None,
        cos: Tensor | None,
        sin: Tensor | None,
        ln_w: Tensor,
        qkv_w: tuple[Tensor, ...],
        qkv_b: tuple[Tensor | None, ...],
        q_norm: Tensor | None,
        k_norm: Tensor | None,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """x [T, H] fp32 residual, pending [T, H] | None (the previous layer's MLP output, not yet added:
        `attn_out`) -> (the complete residual x + pending [T, H] fp32, q [T, nh, d], k [T, kvh, d],
        v [T, kvh, d]: normed, projected, rotated, in the weights' dtype); cos/sin [T, d] (fp32 tables: the
        rotation runs in fp32, see `apply_rope`), or None: q and k unrotated, the decode attention kernel
        rotates them (triton_decode.py)."""
        if pending is not None:  # the previous layer's closing residual add, fused into the norm's kernel
            x = x + pending
        h = rms_norm(x, ln_w, self.eps).to(qkv_w[0].dtype)
        return (x, *self.qkv(h, cos, sin, qkv_w, qkv_b, q_norm, k_norm))

    def qkv(
        self,
        h: Tensor,
        cos: Tensor | None,
        sin: Tensor | None,
        qkv_w: tuple[Tensor, ...],
        qkv_b: tuple[Tensor | None, ...],
        q_norm: Tensor | None,
        k_norm: Tensor | None,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """h [T, H] normed hidden states in the weights' dtype -> q [T, nh, d], k [T, kvh, d], v [T, kvh, d]
        (projected, Qwen3's q/k norms, rotated unless cos/sin are None)."""
        qkv = _linear_parts(h, qkv_w, qkv_b if qkv_b[0] is not None else None)
        t, nq, dt = qkv.shape[0], self.nh + self.kvh, qkv.dtype
        v = qkv[:, nq * self.d :].view(t, self.kvh, self.d)
        if q_norm is None:  # q and k together: one fused rotation kernel, q and k are views of its output
            qk = qkv[:, : nq * self.d].view(t, nq, self.d)
            if cos is not None and sin is not None:  # (None: the attention kernel rotates, runner.py)
                qk = apply_rope(qk, cos, sin, dt)
            return qk[:, : self.nh], qk[:, self.nh :], v
        assert k_norm is not None  # q_norm and k_norm come together (Qwen3)
        q, k, _ = qkv.split(self.splits, dim=-1)
        q = rms_norm(q.reshape(t, self.nh, self.d), q_norm, self.eps)
        k = rms_norm(k.reshape(t, self.kvh, self.d), k_norm, self.eps)
        if cos is None or sin is None:
            return q, k, v
        return apply_rope(q, cos, sin, dt), apply_rope(k, cos, sin, dt), v

    def attn_out(
        self,
        x: Tensor,
        attn: Tensor,
        o_w: Tensor,
        ln_w: Tensor,
        gate_up_w: tuple[Tensor, ...],
        down_w: Tensor,
    ) -> tuple[Tensor, Tensor | None]:
        """x [T, H] fp32 residual, attn [T, nh*d] -> (x after o_proj's residual add [T, H] fp32, the SwiGLU
        MLP's output [T, H] in the weights' dtype). The layer's output is their sum, left pending: the next
        layer's `attn_in` adds it (module doc). With fp32 weights the sum is made here, (x + mlp, None):
        inductor then fuses the add into the down matmul itself (addmm), whose rounding differs."""
        x = x + linear(attn, o_w)
        h = rms_norm(x, ln_w, self.eps).to(down_w.dtype)
        gu = _linear_parts(h, gate_up_w, None)
        gate, up = gu.split(self.inter, dim=-1)
        out = linear(F.silu(gate) * up, down_w)
        if out.dtype == x.dtype:  # fp32: no kernel to save, and addmm's bits to keep
            return x + out, None
        return x, out

    def final_norm(self, x: Tensor, norm_w: Tensor) -> Tensor:
        """x [T, H] fp32 residual -> the final RMSNorm's output (fp32)."""
        return rms_norm(x, norm_w, self.eps)

    def logits(self, x: Tensor, norm_w: Tensor, lm_head: Tensor) -> Tensor:
        """x [T, H] -> logits [T, V] in fp32, computed as the trainer computes them (ascent.models.logits)."""
        return logits_fp32(self.final_norm(x, norm_w).to(lm_head.dtype), lm_head)
