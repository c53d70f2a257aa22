"""The resume state of sharded trainer workers (train.sharding=fsdp): optimizer and RNG, any number of ranks.

The weights of a sharded run go through `torch.distributed.checkpoint` (DCP) in `ascent.models.parallel`
(`model_shards/`); this module does the same for AdamW:

- `save_sharded_optimizer` writes `optimizer_shards/`: torch's `get_optimizer_state_dict` names every moment
  by its parameter's name (not by its index) and keeps it a DTensor, so DCP records which slice of which
  tensor each rank wrote. Nothing is gathered. An optimizer that has not stepped yet writes nothing.
- `load_sharded_optimizer` reads it back on ANY number of ranks (DCP reslices: 2 ranks -> 1, 1 -> 2, ...)
  into a sharded or an unsharded optimizer (a collective of the current ranks, or a single process).
- `load_full_optimizer`: the index-keyed optimizer state an unsharded run keeps in `trainer_state.pt`,
  cut into this rank's shards (a 1-rank checkpoint resumed on N sharded ranks; no communication).
- RNG: every rank writes its own `rng_rank00003.pt`; a rank that the saving run did not have takes rank 0's.
- Checkpoints written before DCP held one `optimizer_rank00003.pt` per rank: `read_legacy_shard` still loads
  them on the same number of ranks and names the fix otherwise.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.distributed.tensor import DTensor, distribute_tensor

from ascent.errors import AscentError
from ascent.models.parallel import dcp_load
from ascent.trainer.checkpoint import rng_state, set_rng_state
from ascent.trainer.distributed import world_size

log = logging.getLogger("ascent")

OPTIMIZER_DIR = "optimizer_shards"


class CheckpointFormatError(AscentError, ValueError):
    """A checkpoint's optimizer state cannot be loaded by this run; the message names the fix."""


def _rank() -> int:
    return torch.distributed.get_rank() if world_size() > 1 else 0


# ------------------------------------------------------------------------------------ DCP optimizer
def has_sharded_optimizer(directory: str | Path) -> bool:
    return (Path(directory) / OPTIMIZER_DIR / ".metadata").is_file()


def save_sharded_optimizer(model: nn.Module, optimizer: torch.optim.Optimizer, directory: str | Path) -> bool:
    """Write `optimizer`'s state to `directory/optimizer_shards` with DCP, each rank its own shards (a
    collective). Moments are keyed by parameter name, so any number of ranks can read them back.

    An optimizer that has not stepped yet has no state, and nothing is written (-> False; the ranks step
    together, so all of them agree): torch's `get_optimizer_state_dict` would create that state with a
    zero-gradient step at lr=0, leaving AdamW's step count at 1 and the run's first real update off."""
    # deferred: torch.distributed.checkpoint, only for sharded checkpoints
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    if not optimizer.state:
        return False
    state = get_optimizer_state_dict(model, optimizer)
    dcp.save(
        state,
        checkpoint_id=str(Path(directory) / OPTIMIZER_DIR),
        no_dist=not torch.distributed.is_initialized(),
    )
    return True


def load_sharded_optimizer(model: nn.Module, optimizer: torch.optim.Optimizer, directory: str | Path) -> None:
    """Load what `save_sharded_optimizer` wrote, by any number of ranks, into `optimizer` (of `model`, whose
    weights are loaded already): each rank reads the slices of its own shards (a collective)."""
    # deferred: torch.distributed.checkpoint, only for sharded checkpoints
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

    state = get_optimizer_state_dict(model, optimizer)  # the layout this run holds; DCP fills it in place
    dcp_load(state, Path(directory) / OPTIMIZER_DIR)
    set_optimizer_state_dict(model, optimizer, state)


def _params(optimizer: torch.optim.Optimizer) -> list[Any]:
    return [p for group in optimizer.param_groups for p in group["params"]]


def load_full_optimizer(optimizer: torch.optim.Optimizer, full: dict[str, Any]) -> None:
    """Load an unsharded optimizer state dict (index-keyed, full tensors) into the optimizer of a sharded
    model: every tensor shaped like its DTensor parameter is cut to this rank's shard (local, no comms)."""
    params = _params(optimizer)
    state: dict[Any, dict[str, Any]] = {}
    for i, entry in full["state"].items():
        p = params[int(i)]
        state[i] = {k: _like_param(v, p) for k, v in entry.items()}
    optimizer.load_state_dict({**full, "state": state})


def _like_param(value: Any, param: Tensor) -> Any:
    if not (isinstance(param, DTensor) and isinstance(value, Tensor) and value.shape == param.shape):
        return value
    src = value.to(param.to_local().device)
    return distribute_tensor(src, param.device_mesh, param.placements, src_data_rank=None)


# ------------------------------------------------------------------------------------------- RNG
def rng_file(directory: str | Path, rank: int) -> Path:
    return Path(directory) / f"rng_rank{rank:05d}.pt"


def write_rank_rng(directory: str | Path) -> None:
    """Write this rank's RNG states (python, numpy, torch, CUDA) to `rng_file`."""
    torch.save(rng_state(), rng_file(directory, _rank()))


def read_rank_rng(directory: str | Path) -> bool:
    """Restore this rank's RNG from `rng_file` if the saving run had this rank; -> whether it did."""
    path = rng_file(directory, _rank())
    if not path.is_file():
        return False
    set_rng_state(torch.load(path, map_location="cpu", weights_only=True))
    return True


# --------------------------------------------------------------------- per-rank files (before DCP)
def legacy_shard_file(directory: str | Path, rank: int) -> Path:
    return Path(directory) / f"optimizer_rank{rank:05d}.pt"


def has_legacy_shards(directory: str | Path) -> bool:
    return legacy_shard_file(directory, 0).is_file()


def read_legacy_shard(directory: str | Path, optimizer: torch.optim.Optimizer, sharded: bool) -> None:
    """Load this rank's `optimizer_rank*.pt` (and RNG), written by the same number of sharded ranks; else
    raise `CheckpointFormatError` naming the rank count to resume with."""
    path = legacy_shard_file(directory, _rank())
    saved_by = len(list(Path(directory).glob("optimizer_rank*.pt")))
    world = world_size() if sharded else 1
    if saved_by != world or not path.is_file():
        raise CheckpointFormatError(
            f"{str(directory)!r} holds per-rank optimizer files (optimizer_rank*.pt, written before "
            f"checkpoints went through torch.distributed.checkpoint) by {saved_by} sharded ranks; this run "
            f"has {world}{'' if sharded else ' unsharded'}. Resume it once with train.sharding=fsdp and "
            f"cluster.num_trainer_workers={saved_by}: the next checkpoint it writes loads on any number."
        )
    blob = torch.load(path, map_location="cpu", weights_only=True)
    sd = blob["optimizer"]
    params = _params(optimizer)
    for i, key in blob["dtensor_keys"]:
        p, local = params[i], sd["state"][i][key]
        sd["state"][i][key] = DTensor.from_local(
            local.to(p.to_local().device),
            p.device_mesh,
            p.placements,
            run_check=False,
            shape=p.shape,
            stride=p.stride(),
        )
    optimizer.load_state_dict(sd)
    set_rng_state(blob["rng"])
