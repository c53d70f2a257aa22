"""FP8 rollout (`rollout.quantization=fp8`): the fast engine's linear weights held in float8_e4m3fn.

What is quantised: the matrices of every decoder layer's attention (fused q/k/v, o) and dense MLP (fused
gate/up, down). The embedding table, the norms and the LM head stay as they are: the embedding is a lookup
(no matmul to speed up), the norms are vectors, and the head's logits are the logprobs the trainer compares
against (vLLM's and SGLang's FP8 checkpoints keep it in bf16 too).

Scales: one fp32 scale per **output channel** (row) of each matrix, `scale = max|row| / 448`; activations
are quantised per token on the fly (dynamic), so a matmul is `(x_q @ w_q^T) * s_x[T, 1] * s_w[1, N]`.
Row scales rather than 128x128 blocks (DeepSeek-V3 / Qwen FP8 checkpoints) because every row's scale
depends on that row only: a publication's q_proj lands in its rows of the fused q/k/v matrix with its own
scales whatever order the tensors arrive in, a tensor-parallel shard quantises its own rows or columns
without block boundaries to respect (k/v of a small model are < 128 rows), and row-wise scales are what
`torch._scaled_mm` takes on Hopper (scale_a [M, 1], scale_b [1, N], fp32, bf16 out).

Where: on the engine, as each published tensor arrives (`ModelWeights.writers`): the transport, its buckets,
tensor-parallel sharding and the trainer are unchanged (they move the trainer's bf16/fp32 tensors), the
engine keeps no full-precision copy (fp8 storage + [N] scales), and the quantisation is a few elementwise
passes over the tensor on the engine's device (bench/fp8_rollout.py measures the publication). Trainer-side
quantisation would halve the bytes moved, but every transport would then carry (fp8, scale) pairs.
Under tensor parallelism each rank quantises its own shard: the column-parallel matrices' rows (and scales)
are the single-GPU ones, but the row-parallel o and down shards get their own row scales and their inputs
their own per-token scales, so a TP replica's FP8 model differs from one GPU's by quantisation-sized amounts
(about 0.01 nat on the tiny test model, checked by hand), where a bf16 replica agrees to rounding.

The matmul: `torch._scaled_mm` on GPUs with FP8 tensor cores (compute capability >= 8.9: Ada, Hopper,
Blackwell) for matrices whose sides are multiples of 16; elsewhere (CPU: the tests) the same quantised
operands dequantised to fp32 and multiplied, so CPU runs see the quantisation error the GPU sees. A GPU
without FP8 is refused (`check_fp8_device`): emulation there is slower than not quantising at all.
The engine samples and reports logprobs from the same forward, so its logprobs are the FP8 model's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from ascent.errors import AscentError

if TYPE_CHECKING:  # (layers.py imports this module, and weights.py imports moe.py, which imports layers.py)
    from ascent.rollout.fast.weights import LayerWeights, ModelWeights

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # largest finite float8_e4m3fn
_TINY = 1e-12  # floor of amax: an all-zero row (padding) gets a finite scale
QUANTIZATIONS = ("none", "fp8")


class Fp8Error(AscentError, ValueError):
    """rollout.quantization=fp8 where it cannot run (exit 2, naming the fix)."""


class Fp8Weight(NamedTuple):
    """A quantised matrix: q [N, K] float8_e4m3fn, scale [N] fp32 (w ~ q * scale[:, None]); `dtype` is the
    engine's compute dtype (what activations are cast to before the matmul and what it returns)."""

    q: Tensor
    scale: Tensor
    dtype: torch.dtype

    def dim(self) -> int:
        return self.q.dim()


def quantize_rows(w: Tensor) -> tuple[Tensor, Tensor]:
    """w [N, K] (any float dtype) -> (q [N, K] float8_e4m3fn, scale [N] fp32), one scale per row."""
    w32 = w.float()
    scale = w32.abs().amax(dim=-1).clamp(min=_TINY) / FP8_MAX
    return (w32 / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


def dequantize(q: Tensor, scale: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """q [N, K] fp8, scale [N] -> [N, K] in `dtype`."""
    return (q.float() * scale[:, None]).to(dtype)


def _hardware(x: Tensor, w: Fp8Weight) -> bool:
    """Whether `torch._scaled_mm` takes this product (CUDA, both sides of the matrix multiples of 16)."""
    n, k = w.q.shape
    return x.is_cuda and n % 16 == 0 and k % 16 == 0


def fp8_linear(x: Tensor, w: Fp8Weight, bias: Tensor | None = None) -> Tensor:
    """x [T, K] -> [T, N] in w.dtype: x quantised per token (dynamic), times the FP8 weight, both scales
    applied to the fp32 accumulator; `_scaled_mm` on the GPU, dequantise-then-matmul (fp32) elsewhere."""
    xq, sx = quantize_rows(x)
    if _hardware(x, w):
        out = torch._scaled_mm(
            xq, w.q.t(), scale_a=sx[:, None], scale_b=w.scale[None, :], out_dtype=torch.bfloat16
        )
    else:
        out = (xq.float() @ w.q.float().t()) * sx[:, None] * w.scale[None, :]
    out = out.to(w.dtype)
    return out if bias is None else out + bias


def linear(x: Tensor, w: Tensor | Fp8Weight, bias: Tensor | None = None) -> Tensor:
    """F.linear for a plain weight, `fp8_linear` for a quantised one (the layer math calls this)."""
    if isinstance(w, Fp8Weight):
        return fp8_linear(x, w, bias)
    return F.linear(x, w, bias)


def check_fp8_device(device: torch.device) -> None:
    """Raise Fp8Error on a GPU without FP8 matmuls (compute capability < 8.9); CPU runs the emulation."""
    if device.type != "cuda":
        return
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) < (8, 9):
        name = torch.cuda.get_device_name(device)
        raise Fp8Error(
            f"rollout.quantization=fp8 on {name} (compute capability {major}.{minor}): the card has no FP8 "
            "matmuls (they need 8.9+: Ada, Hopper, Blackwell), and emulating them would be slower than not "
            "quantising; set rollout.quantization=none."
        )


def _writer(q: Tensor, scale: Tensor) -> Callable[[Tensor], None]:
    """How `ModelWeights.update` writes an incoming full-precision tensor into rows of a quantised one."""

    def write(t: Tensor) -> None:
        tq, ts = quantize_rows(t.to(q.device))
        q.copy_(tq)
        scale.copy_(ts)

    return write


def _quantize(weights: ModelWeights, fused: Tensor, dtype: torch.dtype) -> Fp8Weight:
    """One owned matrix -> its Fp8Weight; every engine name that was a row slice of it now writes through a
    quantising writer into the matching rows (and scales)."""
    q, scale = quantize_rows(fused)
    base, cols = fused.untyped_storage().data_ptr(), fused.shape[1]
    for name, t in list(weights.targets.items()):
        if t.untyped_storage().data_ptr() != base or t.dim() != 2:
            continue
        start = (t.storage_offset() - fused.storage_offset()) // cols  # t is fused[start : start + rows]
        rows = slice(start, start + t.shape[0])
        weights.targets[name] = q[rows]
        weights.writers[name] = _writer(q[rows], scale[rows])
    return Fp8Weight(q, scale, dtype)


def _quantize_layer(weights: ModelWeights, lw: LayerWeights) -> LayerWeights:
    """A dense layer's four matrices -> Fp8Weights (the layer math reads them through `linear`; an
    Fp8Weight has the `.dtype` and `.dim()` the runner asks a matrix for)."""
    dt = lw.o_w.dtype
    lw.qkv_w = (_quantize(weights, lw.qkv_w[0], dt),)  # type: ignore[assignment]
    lw.o_w = _quantize(weights, lw.o_w, dt)  # type: ignore[assignment]
    lw.gate_up_w = (_quantize(weights, lw.gate_up_w[0], dt),)  # type: ignore[assignment]
    lw.down_w = _quantize(weights, lw.down_w, dt)  # type: ignore[assignment]
    return lw


def quantize_weights(weights: ModelWeights, device: torch.device) -> ModelWeights:
    """Owned, dense weights -> the same `ModelWeights` with every layer's linear matrices in FP8 (in place:
    the full-precision matrices are dropped as each layer is done). Refuses what it cannot quantise."""
    check_fp8_device(device)
    if weights.shared:
        raise Fp8Error(
            "rollout.quantization=fp8 with weights shared with the trainer's module: FP8 needs the engine's "
            "own copy; build the engine with share_weights=False."
        )
    if any(lw.down_w.dim() == 3 for lw in weights.layers):
        raise Fp8Error(
            "rollout.quantization=fp8 with a mixture-of-experts model: the experts' FP8 matmuls are not "
            "written yet; set rollout.quantization=none."
        )
    if any(len(lw.qkv_w) != 1 or len(lw.gate_up_w) != 1 for lw in weights.layers):
        raise Fp8Error("rollout.quantization=fp8 needs fused q/k/v and gate/up matrices (owned weights).")
    weights.layers = [_quantize_layer(weights, lw) for lw in weights.layers]
    return weights


def refuse_adapters(name: str) -> Tensor:
    """The engine's `AdapterMerger.read` under FP8: adapter-only publication needs full-precision bases."""
    raise Fp8Error(
        f"a LoRA adapter for {name} reached an FP8 engine (rollout.quantization=fp8): adapters merge into "
        "full-precision base weights; set model.lora.publish=merged (or rollout.quantization=none)."
    )
