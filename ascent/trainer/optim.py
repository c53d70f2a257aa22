"""The optimizer and learning-rate schedule of the policy update (design: "trainer/ ... optimizer").

AdamW over the trainable parameters (fused kernels on CUDA, foreach on CPU). Weight decay applies to
matrices only (ndim >= 2); biases and norm weights are not decayed. The schedule is a `LambdaLR` whose
factor is indexed by optimizer step s = 0, 1, ... (the factor of step s is the one used by the s-th update):

    warm-up   s < W:  (s + 1) / W                      (the first step already moves, the W-th is at full lr)
    constant  s >= W: 1
    cosine    s >= W: r + (1 - r) * (1 + cos(pi * p)) / 2,  p = (s - W) / (total - W - 1) clamped to [0, 1]

so with cosine the first post-warm-up step runs at the peak lr and the last step (s = total - 1) at
`min_lr_ratio * lr`. `optimizer_step` is the step both trainer workers share: unscale, clip to the GLOBAL
gradient norm (sharded gradients included), step, schedule.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from ascent.trainer.distributed import clip_grad_norm
from ascent.trainer.offload import OffloadedAdamW


def param_groups(params: Iterable[tuple[str, nn.Parameter]], weight_decay: float) -> list[dict]:
    """Named trainable params -> two AdamW groups: matrices with weight decay, vectors without."""
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    for _, p in params:
        if p.requires_grad:
            (decay if p.ndim >= 2 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


def build_optimizer(
    model: nn.Module,
    *,
    lr: float,
    weight_decay: float = 0.0,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    offload: bool = False,
) -> torch.optim.Optimizer:
    """AdamW over the model's trainable parameters; fused when they live on CUDA, foreach otherwise.

    `offload`: keep the AdamW state and fp32 master weights on the CPU (`OffloadedAdamW`).
    """
    groups = param_groups(model.named_parameters(), weight_decay)
    if not groups:
        raise ValueError("the model has no trainable parameters (all requires_grad=False).")
    if offload:
        return OffloadedAdamW(groups, lr=lr, betas=(betas[0], betas[1]), eps=eps)
    on_cuda = groups[0]["params"][0].is_cuda
    kind = {"fused": True} if on_cuda else {"foreach": True}
    return torch.optim.AdamW(groups, lr=lr, betas=(betas[0], betas[1]), eps=eps, **kind)


def lr_factor(
    step: int, *, warmup_steps: int, total_steps: int, schedule: str = "constant", min_lr_ratio: float = 0.0
) -> float:
    """The lr multiplier of optimizer step `step` (0-based); see the module docstring for the formula."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    if schedule != "cosine":
        raise ValueError(f"train.schedule={schedule!r}: unknown; use constant or cosine.")
    span = max(total_steps - warmup_steps - 1, 1)
    progress = min(max((step - warmup_steps) / span, 0.0), 1.0)
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def build_scheduler(
    optimizer: torch.optim.Optimizer,
    *,
    total_steps: int,
    warmup_steps: int = 0,
    schedule: str = "constant",
    min_lr_ratio: float = 0.0,
) -> LambdaLR:
    """LambdaLR with warm-up then constant or cosine decay over `total_steps` optimizer steps."""
    if schedule not in ("constant", "cosine"):
        raise ValueError(f"train.schedule={schedule!r}: unknown; use constant or cosine.")
    if schedule == "cosine" and total_steps <= 0:
        raise ValueError(
            f"total optimizer steps={total_steps}: a cosine schedule needs the run's step count."
        )

    def factor(step: int) -> float:
        return lr_factor(
            step,
            warmup_steps=warmup_steps,
            total_steps=total_steps,
            schedule=schedule,
            min_lr_ratio=min_lr_ratio,
        )

    fn: Callable[[int], float] = factor
    return LambdaLR(optimizer, fn)


def optimizer_step(
    optimizer: torch.optim.Optimizer,
    scheduler: LambdaLR,
    scaler: torch.amp.GradScaler,
    params: Iterable[nn.Parameter],
    max_grad_norm: float | None,
    step: bool = True,
) -> tuple[float, bool]:
    """Unscale, clip, step optimizer and scheduler -> (grad norm before clipping, skipped).

    The optimizer step is skipped on a non-finite grad norm (the fp16 scaler then lowers its scale).
    `step=False` (a mini-batch the controller found without a gradient to follow): only the norm is
    measured; the gradients are dropped and nothing else moves (weights, AdamW moments and step count, the
    LR schedule, the loss scale), so the state is bit-identical to before the mini-batch.
    """
    trainable = [p for p in params if p.requires_grad]
    if not step:
        scale = scaler.get_scale() if scaler.is_enabled() else 1.0
        norm = clip_grad_norm(trainable, math.inf) / scale
        optimizer.zero_grad(set_to_none=True)
        return norm, False
    scaler.unscale_(optimizer)
    norm = clip_grad_norm(trainable, max_grad_norm or math.inf)
    skipped = not math.isfinite(norm)
    if skipped and not scaler.is_enabled():
        optimizer.zero_grad(set_to_none=True)
    else:
        scaler.step(optimizer)
    scaler.update()
    scheduler.step()
    return norm, skipped
