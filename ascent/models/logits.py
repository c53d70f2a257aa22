"""LM-head logits in fp32 from half-precision operands: the one definition the sampler and trainer share.

A bf16 matmul rounds its output to bf16: at logits of magnitude 32-64 that is a step of 0.25, and two
computations of the same logits that differ in the last bit of the hidden state can land a whole step
apart. Once the sampler and the trainer each round their own logits, a token's logprob can differ by more
than half a nat between them (seen in the GPU learning run: 0.5-0.9 nat on the uncertain last digit of an
answer). Products of bf16 values are exact in fp32, so computing the same matmul with an fp32 output
(`torch.mm(..., out_dtype=float32)` on CUDA: the same tensor-core kernel, fp32 stores) removes that
rounding; what remains is the hidden states' own difference.
"""

from __future__ import annotations

import torch
from torch import Tensor


def logits_fp32(x: Tensor, weight: Tensor) -> Tensor:
    """x [N, H], weight [V, H] of one dtype -> x @ weight.T as [N, V] fp32, its sums never rounded to x's
    dtype (CUDA: an fp32-output matmul; CPU: the same math through an fp32 upcast)."""
    if x.dtype == torch.float32:
        return x @ weight.T
    if x.is_cuda:
        return torch.mm(x, weight.T, out_dtype=torch.float32)  # type: ignore[call-overload]
    return x.float() @ weight.float().T
