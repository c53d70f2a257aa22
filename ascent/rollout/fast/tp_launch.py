"""One tensor-parallel replica started from one process: `launch_replica(size, builder_kwargs)`.

The calling process (a rollout worker: a Ray actor given `size` GPUs, or the controller inline) becomes
rank 0, the driver; `size - 1` child processes are started on this node, one per other rank (rank r on GPU r
of those the process sees, or the CPU with gloo), each builds the same engine over its shard and serves the
driver (tp_engine.py) until the driver's `shutdown()` (at the latest when this process exits) or until this
process dies. The ranks meet at a TCPStore on a free local port. Children are forked on CPU (fast: nothing
to import again) and spawned on CUDA (a forked process cannot use CUDA).
"""

from __future__ import annotations

import atexit
import ctypes
import multiprocessing
import signal
import socket
from typing import Any

import torch

from ascent.models.loading import resolve_device
from ascent.rollout.fast.tensor_parallel import tp_group
from ascent.rollout.fast.tp_engine import TPEngine

# What only the driver needs (tokenizer facts for stop checks, a module to share): not sent to the children.
PR_SET_PDEATHSIG = 1  # prctl(2)
DRIVER_ONLY = ("model", "decode", "eos_token_ids", "pad_token_id", "tensor_parallel")


def launch_replica(size: int, kwargs: dict[str, Any], timeout_s: float = 600) -> TPEngine:
    """Start ranks 1..size-1 and build rank 0's engine here with `build_fast_engine(**kwargs)` -> the driver."""
    from ascent.rollout.fast import build_fast_engine  # deferred: that module calls this one

    if kwargs.get("model") is not None or kwargs.get("model_path") is None:
        raise ValueError(
            f"rollout.tensor_parallel={size}: every rank loads its shard from model.path; pass model_path, "
            "not a module."
        )
    dev = resolve_device(kwargs.get("device", "auto"))
    if dev.type == "cuda" and (dev.index or 0) + size > torch.cuda.device_count():
        raise ValueError(
            f"rollout.tensor_parallel={size}: this process sees {torch.cuda.device_count()} GPU(s) from "
            f"{dev}; give each rollout replica {size} GPUs (cluster.rollout_gpus) or lower tensor_parallel."
        )
    port = _free_port()
    child_kw = {k: v for k, v in kwargs.items() if k not in DRIVER_ONLY}
    cuda = dev.type == "cuda"
    ctx = multiprocessing.get_context("spawn") if cuda else multiprocessing.get_context("fork")
    children = [
        ctx.Process(
            target=_serve_rank, args=(r, size, port, child_kw, _rank_device(dev, r), timeout_s), daemon=True
        )
        for r in range(1, size)
    ]
    for child in children:
        child.start()
    tp = tp_group(0, size, "127.0.0.1", port, _rank_device(dev, 0), timeout_s)
    engine = build_fast_engine(**{**kwargs, "device": _rank_device(dev, 0), "tensor_parallel": tp})
    assert isinstance(engine, TPEngine)
    engine.children = children
    atexit.register(engine.shutdown)  # before multiprocessing's own exit handler (atexit runs LIFO)
    return engine


def _serve_rank(
    rank: int, size: int, port: int, kwargs: dict, device: torch.device, timeout_s: float
) -> None:
    """A child: rank `rank`'s engine, serving the driver until it shuts down."""
    from ascent.rollout.fast import build_fast_engine  # deferred: that module calls this one

    _die_with_parent()
    if device.type == "cuda":
        torch.cuda.set_device(device)
    tp = tp_group(rank, size, "127.0.0.1", port, device, timeout_s)
    engine = build_fast_engine(**{**kwargs, "device": device, "tensor_parallel": tp})
    assert isinstance(engine, TPEngine)
    engine.serve()


def _die_with_parent() -> None:
    """Linux: this process gets SIGTERM when its parent dies (a Ray actor is killed, not shut down), instead
    of waiting on the driver's next command until the group's timeout. Elsewhere nothing (best effort)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:
        return
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _rank_device(dev: torch.device, rank: int) -> torch.device:
    return torch.device("cuda", (dev.index or 0) + rank) if dev.type == "cuda" else dev


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
