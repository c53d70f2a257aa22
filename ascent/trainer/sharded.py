"""What the trainer workers need around an FSDP2-sharded model (`ascent.models.parallel`), in one place.

- `sharding_parallelize`: `train.sharding` -> the `parallelize=` function of `PolicyWorker` / `CriticWorker`
  (or None: one rank, or sharding off), with the combinations we do not support named.
- Lock-step micro-batches: every forward of a sharded model all-gathers each layer on ALL ranks, so every
  rank must run the same number of forwards (and backwards). Ranks with fewer micro-batches in their share
  run `filler_sample` micro-batches (one masked token, zero loss) until all ranks reach the maximum
  (`missing_micro_batches`, agreed on before the first forward).
- Checkpoints: each rank writes its own optimizer shard, `optimizer_rank00003.pt` next to the HF weights
  (`write_optimizer_shard` / `read_optimizer_shard`); resume needs the same number of ranks. DTensor moment
  buffers are stored as their local shards and rebuilt against the parameters on load.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from ascent.messages import TrainSample
from ascent.models.parallel import fsdp_parallelize
from ascent.trainer.checkpoint import rng_state, set_rng_state
from ascent.trainer.distributed import all_reduce_max, world_size

SHARDINGS = ("none", "fsdp")


def sharding_parallelize(
    sharding: str, *, param_dtype: torch.dtype, compute_dtype: torch.dtype, lora: bool
) -> Callable[[nn.Module], nn.Module] | None:
    """`train.sharding` -> a parallelize function, or None (sharding off, or a single rank: nothing to shard)."""
    if sharding not in SHARDINGS:
        raise ValueError(f"train.sharding={sharding!r}: unknown; use one of {', '.join(SHARDINGS)}.")
    if sharding == "none" or world_size() == 1:
        return None
    if lora:
        raise ValueError(
            "train.sharding=fsdp with model.lora.rank > 0: LoRA runs are not sharded yet (the adapters are "
            "small and the frozen base is held in model.dtype); set train.sharding=none."
        )
    if compute_dtype == torch.float16:
        raise ValueError(
            "train.sharding=fsdp with model.dtype=fp16: the fp16 loss scaler would see only this rank's "
            "gradient shard; use model.dtype=bf16 (or fp32)."
        )
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


# ------------------------------------------------------------------------------------ optimizer shards
def shard_file(directory: str | Path, rank: int) -> Path:
    return Path(directory) / f"optimizer_rank{rank:05d}.pt"


def _params(optimizer: torch.optim.Optimizer) -> list[Any]:
    return [p for group in optimizer.param_groups for p in group["params"]]


def write_optimizer_shard(directory: str | Path, optimizer: torch.optim.Optimizer) -> None:
    """Write this rank's optimizer state (DTensors as local shards) and RNG state to `shard_file`."""
    rank = torch.distributed.get_rank()
    sd = optimizer.state_dict()
    was_dtensor = [[i, k] for i, s in sd["state"].items() for k, v in s.items() if isinstance(v, DTensor)]
    state = {
        i: {k: v.to_local() if isinstance(v, DTensor) else v for k, v in s.items()}
        for i, s in sd["state"].items()
    }
    blob = {
        "optimizer": {**sd, "state": state},
        "dtensor_keys": was_dtensor,
        "world_size": world_size(),
        "rng": rng_state(),
    }
    torch.save(blob, shard_file(directory, rank))


def replicated_optimizer_state(state: dict[str, Any], directory: str | Path) -> dict[str, Any] | None:
    """The optimizer state in `trainer_state.pt` for an unsharded worker (None if not saved); an error if
    the checkpoint holds optimizer shards instead (resuming would silently restart AdamW)."""
    if state.get("optimizer") is None and shard_file(directory, 0).is_file():
        raise ValueError(
            f"{str(directory)!r} holds a sharded optimizer (saved with train.sharding=fsdp); resume with "
            "train.sharding=fsdp and the same number of trainer ranks."
        )
    return state.get("optimizer")


def read_optimizer_shard(directory: str | Path, optimizer: torch.optim.Optimizer) -> None:
    """Load what `write_optimizer_shard` wrote for this rank into `optimizer`; restore this rank's RNG."""
    rank, world = torch.distributed.get_rank(), world_size()
    path = shard_file(directory, rank)
    if not path.is_file():
        raise FileNotFoundError(
            f"{str(path)!r} not found: a sharded (train.sharding=fsdp) resume needs the optimizer shard of "
            f"every rank; was the checkpoint saved with {world} trainer ranks?"
        )
    blob = torch.load(path, map_location="cpu", weights_only=True)
    if blob["world_size"] != world:
        raise ValueError(
            f"{str(path)!r} was saved by {blob['world_size']} ranks, this run has {world}: resume with "
            f"cluster.num_trainer_workers={blob['world_size']}."
        )
    sd = blob["optimizer"]
    params = _params(optimizer)
    for i, key in blob["dtensor_keys"]:
        p, local = params[i], sd["state"][i][key]
        sd["state"][i][key] = DTensor.from_local(
            local.to(p.device), p.device_mesh, p.placements, run_check=False, shape=p.shape, stride=p.stride()
        )
    optimizer.load_state_dict(sd)
    set_rng_state(blob["rng"])
