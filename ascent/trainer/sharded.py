"""What the trainer workers need around an FSDP2-sharded model (`ascent.models.parallel`), in one place.

- `sharding_parallelize`: `train.sharding` -> the `parallelize=` function of `PolicyWorker` / `CriticWorker`
  (or None: one rank, or sharding off), with the combinations we do not support named.
- Lock-step micro-batches: every forward of a sharded model all-gathers each layer on ALL ranks, so every
  rank must run the same number of forwards (and backwards). Ranks with fewer micro-batches in their share
  run `filler_sample` micro-batches (one masked token, zero loss) until all ranks reach the maximum
  (`missing_micro_batches`, agreed on before the first forward).
- Checkpoints: weights and optimizer go through torch.distributed.checkpoint, each rank its own shards, and
  load on any number of ranks (`ascent.models.parallel.save_shards`, `ascent.trainer.sharded_state`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from ascent.messages import TrainSample
from ascent.models.parallel import fsdp_parallelize
from ascent.trainer.distributed import all_reduce_max, world_size

SHARDINGS = ("none", "fsdp")


def sharding_parallelize(
    sharding: str, *, param_dtype: torch.dtype, compute_dtype: torch.dtype, lora: bool
) -> Callable[[nn.Module], nn.Module] | None:
    """`train.sharding` -> a parallelize function, or None (sharding off, or a single rank: nothing to
    shard)."""
    if sharding not in SHARDINGS:
        raise ValueError(f"train.sharding={sharding!r}: unknown; use one of {', '.join(SHARDINGS)}.")
    if sharding == "none" or world_size() == 1:
        return None
    if compute_dtype == torch.float16:
        raise ValueError(
            "train.sharding=fsdp with model.dtype=fp16: the fp16 loss scaler would see only this rank's "
            "gradient shard; use model.dtype=bf16 (or fp32)."
        )
    if lora:  # the trainable adapters are fp32 (peft), the frozen base model.dtype: gathered in compute dtype
        return fsdp_parallelize(torch.float32, compute_dtype)
    return fsdp_parallelize(param_dtype, compute_dtype)


def filler_sample() -> TrainSample:
    """A one-token sample with its only response token masked: a lock-step forward that adds nothing."""
    return TrainSample(prompt_ids=[0], response_ids=[0], loss_mask=[0], advantages=[0.0])


def missing_micro_batches(count: int, device: torch.device, sharded: bool) -> int:
    """How many filler micro-batches this rank must add so that all ranks run max(count); 0 if unsharded.

    A collective itself: call it BEFORE the first forward (a rank that asks after its own forwards would
    meet the others' all-gathers).
    """
    if not sharded:
        return 0
    most = all_reduce_max(torch.tensor(count, device=device))
    return int(most.item()) - count
