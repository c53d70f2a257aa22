"""The machinery `PolicyWorker` and `CriticWorker` share, as plain functions over a worker's parts.

Both workers hold the same training parts (`TrainerParts`: model, AdamW, LR schedule, loss scaler, step
counter, sharding flags) and differ only in what a micro-batch computes. The functions here take those parts
(the worker itself, by composition) and run the common steps:

- set-up: `wrap_model` (the optional `parallelize` seam, FSDP2 via `train.sharding`) and `build_training`
  (optimizer, scheduler, fp16 GradScaler);
- forwards: `autocast`, `eval_mode`, `oom_guard` (OutOfMemoryError -> `TrainerOutOfMemory` naming what to
  lower), `forward_per_sample` (packed no-grad forwards split back per sample, lock-step fillers) and
  `filler_backward`;
- the optimizer step: `run_update` (plan micro-batches, accumulate, all-reduce grads, step, reduce metrics)
  and `step_optimizer`;
- checkpoints: `write_shard` / `write_state` (save) and `load_state` (optimizer, scheduler, scaler, step, RNG;
  a sharded optimizer through torch.distributed.checkpoint, `ascent.trainer.sharded_state`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol, cast

import torch
from torch import Tensor, nn
from torch.optim.lr_scheduler import LambdaLR

from ascent.errors import AscentError
from ascent.messages import TrainSample
from ascent.models.parallel import is_sharded
from ascent.trainer import sharded_state
from ascent.trainer.checkpoint import read_trainer_state, set_rng_state, write_trainer_state
from ascent.trainer.distributed import all_reduce_grads, all_reduce_max, all_reduce_sum, world_size
from ascent.trainer.loss import MetricSums
from ascent.trainer.offload import OffloadedAdamW
from ascent.trainer.optim import build_optimizer, build_scheduler, optimizer_step
from ascent.trainer.packing import PackedBatch, pack, plan_micro_batches
from ascent.trainer.settings import OptimSettings
from ascent.trainer.sharded import filler_sample, missing_micro_batches, sharding_parallelize

log = logging.getLogger("ascent")


class TrainerOutOfMemory(AscentError, RuntimeError):
    """The accelerator ran out of memory in a trainer worker; the message says which settings to lower."""


class TrainerParts(Protocol):
    """What a trainer worker holds that the shared steps use (`PolicyWorker`, `CriticWorker`)."""

    model: nn.Module
    device: torch.device
    compute_dtype: torch.dtype
    max_tokens: int
    sharded: bool
    grads_synced_by_wrapper: bool
    optim_settings: OptimSettings
    optimizer: torch.optim.Optimizer
    scheduler: LambdaLR
    scaler: torch.amp.GradScaler
    step: int


# ------------------------------------------------------------------------------------------------ set-up
def wrap_model(
    model: nn.Module,
    parallelize: Callable[[nn.Module], nn.Module] | None,
    sharding: str,
    *,
    param_dtype: torch.dtype,
    compute_dtype: torch.dtype,
    lora: bool,
) -> tuple[nn.Module, bool, bool]:
    """Seam for FSDP2: a wrapper that shards the model and reduces (sums) gradients in backward.

    -> (model, grads_synced_by_wrapper, sharded).
    """
    parallelize = parallelize or sharding_parallelize(
        sharding, param_dtype=param_dtype, compute_dtype=compute_dtype, lora=lora
    )
    if parallelize is not None:
        model = parallelize(model)
    return model, parallelize is not None, is_sharded(model)


def build_training(
    model: nn.Module, settings: OptimSettings, device: torch.device, compute_dtype: torch.dtype
) -> tuple[torch.optim.Optimizer, LambdaLR, torch.amp.GradScaler]:
    """AdamW, its LR schedule and the loss scaler (enabled for fp16 compute only)."""
    optimizer = build_optimizer(model, **settings.optimizer_kwargs())
    scheduler = build_scheduler(optimizer, **settings.scheduler_kwargs())
    scaler = torch.amp.GradScaler(device.type, enabled=compute_dtype == torch.float16)
    return optimizer, scheduler, scaler


# ---------------------------------------------------------------------------------------------- forwards
def autocast(device: torch.device, compute_dtype: torch.dtype) -> contextlib.AbstractContextManager:
    """`torch.autocast(compute_dtype)`, off for fp32 compute."""
    return torch.autocast(device.type, dtype=compute_dtype, enabled=compute_dtype != torch.float32)


@contextlib.contextmanager
def eval_mode(model: nn.Module) -> Iterator[None]:
    """The model in eval mode inside, its training flag restored after."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


@contextlib.contextmanager
def oom_guard(parts: TrainerParts, samples: Sequence[TrainSample], who: str, advice: str) -> Iterator[None]:
    """An accelerator OutOfMemoryError -> `TrainerOutOfMemory` naming the budget, the longest sequence and
    `advice` (the worker's own settings to lower); gradients are dropped first."""
    try:
        yield
    except torch.OutOfMemoryError as e:
        parts.optimizer.zero_grad(set_to_none=True)
        longest = max((s.num_tokens for s in samples), default=0)
        raise TrainerOutOfMemory(
            f"out of accelerator memory in the {who} worker (micro-batches of up to "
            f"train.max_tokens_per_micro_batch={parts.max_tokens} tokens; longest sequence {longest}). "
            "Lower train.max_tokens_per_micro_batch (not below the longest sequence), set "
            f"model.gradient_checkpointing=true, {advice}"
        ) from e


def forward_per_sample(
    parts: TrainerParts,
    samples: Sequence[TrainSample],
    forward: Callable[[PackedBatch], Tensor],
    filler: Callable[[PackedBatch], Any],
    sharded: bool,
) -> list[list[float]]:
    """`forward` (packed micro-batch -> one value per response token) split back per sample, input order.

    Samples are packed into micro-batches of at most `parts.max_tokens` tokens; `sharded`: ranks run
    `filler` forwards until all reach the same count (lock-step). Call it under no_grad and eval mode.
    """
    return forward_per_sample_many(parts, samples, lambda packed: (forward(packed),), filler, sharded, 1)[0]


def forward_per_sample_many(
    parts: TrainerParts,
    samples: Sequence[TrainSample],
    forward: Callable[[PackedBatch], tuple[Tensor, ...]],
    filler: Callable[[PackedBatch], Any],
    sharded: bool,
    outputs: int,
) -> list[list[list[float]]]:
    """`forward_per_sample` for a forward giving `outputs` per-token values (a tuple of [M] tensors): one list
    per value, of one list per sample."""
    out: list[list[list[float]]] = [[[] for _ in samples] for _ in range(outputs)]
    plan = plan_micro_batches([s.num_tokens for s in samples], parts.max_tokens)
    fillers = missing_micro_batches(len(plan), parts.device, sharded)
    for idx in plan:
        packed = pack([samples[i] for i in idx], parts.device)
        for k, flat in enumerate(forward(packed)):
            for i, values in zip(idx, packed.split(flat), strict=True):
                out[k][i] = values
    for _ in range(fillers):  # lock-step forwards of a sharded model
        filler(pack([filler_sample()], parts.device))
    return out


def filler_backward(parts: TrainerParts, forward: Callable[[PackedBatch], Tensor]) -> None:
    """A zero-gradient forward + backward that keeps this rank in lock-step with the others (FSDP)."""
    with autocast(parts.device, parts.compute_dtype):
        out = forward(pack([filler_sample()], parts.device))
    (out.sum() * 0.0).backward()


# ------------------------------------------------------------------------------------------------ update
def run_update(
    parts: TrainerParts,
    samples: Sequence[TrainSample],
    accumulate: Callable[[list[list[int]]], MetricSums],
    guard: contextlib.AbstractContextManager,
    step: bool = True,
    reducers: tuple[Callable[[Tensor], Tensor], Callable[[Tensor], Tensor]] | None = None,
) -> tuple[dict[str, float], float, float, bool]:
    """ONE optimizer step: plan micro-batches, `accumulate` them (under `guard`), sum gradients over workers
    (unless the wrapper did), step; -> (metrics reduced over workers, lr of the step, grad norm, skipped).
    `step=False`: the same forwards, backwards and metrics, but no step (see `optim.optimizer_step`).
    `reducers`: the (sum, max) that combine the metrics (default: over all workers; sequence parallelism
    reduces over its data-parallel group)."""
    parts.model.train()
    micro = plan_micro_batches([s.num_tokens for s in samples], parts.max_tokens)
    try:
        with guard:
            metrics = accumulate(micro)
            if not parts.grads_synced_by_wrapper:
                all_reduce_grads(parts.model.parameters())
            # optimizer lrs are floats (build_optimizer); torch types them float | Tensor
            lr = cast(float, parts.scheduler.get_last_lr()[0])
            grad_norm, skipped = step_optimizer(parts, step)
    finally:
        parts.optimizer.zero_grad(set_to_none=True)
    metrics.reduce(*(reducers or (all_reduce_sum, all_reduce_max)))
    return metrics.result(), lr, grad_norm, skipped


def step_optimizer(parts: TrainerParts, step: bool = True) -> tuple[float, bool]:
    """Unscale, clip (global norm), step optimizer and scheduler; skip the step on a non-finite norm.
    `step=False`: measure the grad norm and drop the gradients; the step count stays."""
    out = optimizer_step(
        parts.optimizer,
        parts.scheduler,
        parts.scaler,
        parts.model.parameters(),
        parts.optim_settings.max_grad_norm,
        step,
    )
    parts.step += int(step)
    return out


# ------------------------------------------------------------------------------------------- checkpoints
def write_shard(parts: TrainerParts, out: Path, optimizer: bool = True, rng: bool = False) -> bool:
    """Sharded (a collective): write this rank's optimizer shards into `out/optimizer_shards` (unless not
    `optimizer`) and, with `rng`, its RNG states. -> whether this rank writes the rest (rank 0: unsharded,
    its state is every rank's; sharded, it gathered what is gathered)."""
    if parts.sharded:
        out.mkdir(parents=True, exist_ok=True)
        if optimizer:
            sharded_state.save_sharded_optimizer(parts.model, parts.optimizer, out)
        if rng:
            sharded_state.write_rank_rng(out)
    return not (world_size() > 1 and torch.distributed.get_rank() != 0)


def write_state(parts: TrainerParts, out: Path, optimizer: bool = True) -> None:
    """trainer_state.pt: optimizer (unless sharded: see `write_shard`; none without `optimizer`), scheduler,
    scaler, step, RNG. `optimizer_saved` records whether a resume will find AdamW's moments, and
    `optimizer_fresh` that there were none yet (no step taken: a resume starts a fresh optimizer)."""
    write_trainer_state(
        out,
        optimizer_state=None if parts.sharded or not optimizer else parts.optimizer.state_dict(),
        scheduler_state=parts.scheduler.state_dict(),
        scaler=parts.scaler.state_dict(),
        step=parts.step,
        optimizer_saved=optimizer,
        optimizer_fresh=not parts.optimizer.state,
    )


def load_state(parts: TrainerParts, src: Path, *, rng: bool) -> None:
    """Restore optimizer, scheduler, scaler, step (and the RNG if `rng`) from `write_state` / `write_shard`,
    after the weights were loaded (offloaded masters are refreshed from them). The optimizer may come from
    a run with another number of ranks, sharded or not (`load_optimizer`)."""
    if isinstance(parts.optimizer, OffloadedAdamW):
        parts.optimizer.refresh_masters()
    state = read_trainer_state(src, map_location="cpu")
    if rng and not sharded_state.read_rank_rng(src):
        set_rng_state(state["rng"])  # unsharded, or a rank the saving run did not have: rank 0's
    saved = state.get("optimizer_saved", True)
    if state.get("optimizer_fresh"):
        pass  # saved before the first step: this run's fresh optimizer is that state
    elif saved:
        load_optimizer(parts, src, state.get("optimizer"))
    else:
        log.warning(
            "%s has no optimizer state (saved with checkpoint.save_optimizer=false): AdamW restarts from "
            "zero moments, so this resume is not an exact continuation.",
            src,
        )
    if state.get("scheduler") is not None:
        parts.scheduler.load_state_dict(state["scheduler"])
    use_configured_lr(parts)
    if state.get("scaler"):
        parts.scaler.load_state_dict(state["scaler"])
    parts.step = int(state.get("step", 0))


def use_configured_lr(parts: TrainerParts) -> None:
    """After a load: the peak lr is this run's setting, not the checkpoint's (the optimizer's and scheduler's
    saved states carry the saving run's lr; a resume that changes train.lr, accepted with --accept-changes,
    must train at the new one). The schedule's position (its step count) is kept."""
    scheduler = parts.scheduler
    scheduler.base_lrs = [parts.optim_settings.lr for _ in parts.optimizer.param_groups]
    for group, base, factor in zip(
        parts.optimizer.param_groups, scheduler.base_lrs, scheduler.lr_lambdas, strict=True
    ):
        group["initial_lr"] = base
        group["lr"] = base * factor(scheduler.last_epoch)
    scheduler._last_lr = [group["lr"] for group in parts.optimizer.param_groups]


def load_optimizer(parts: TrainerParts, src: Path, full: dict[str, Any] | None) -> None:
    """The optimizer state of checkpoint `src`, whichever layout holds it: DCP shards (any number of ranks
    -> this run's), the full state of an unsharded run (`full`, from trainer_state.pt; cut into shards when
    this run is sharded), or per-rank files of older sharded checkpoints (same number of ranks only)."""
    if sharded_state.has_sharded_optimizer(src):
        sharded_state.load_sharded_optimizer(parts.model, parts.optimizer, src)
    elif full is not None and parts.sharded:
        sharded_state.load_full_optimizer(parts.optimizer, full)
    elif full is not None:
        parts.optimizer.load_state_dict(full)
    elif sharded_state.has_legacy_shards(src):
        sharded_state.read_legacy_shard(src, parts.optimizer, parts.sharded)
    else:  # an old checkpoint without the `optimizer_saved` flag, saved without the optimizer
        log.warning("%s holds no optimizer state: AdamW restarts from zero moments.", src)
