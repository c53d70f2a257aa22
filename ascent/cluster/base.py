"""The worker-group interface the RL loop talks to, and what every backend shares.

A worker group runs N copies of a plain Python class (rank 0..N-1). The controller calls a method on all of
them (`call`), on each with its own shard (`call_split`) or on rank 0 only (`call_rank0`); results come back
in rank order. The `_async` variants return a `PendingCall` at once so two groups can work at the same time.
Backends (inline, Ray) implement `_submit` and `shutdown` and must behave the same.

Before a worker's class is constructed, the group sets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
MASTER_ADDR and MASTER_PORT (a free port on rank 0's node), so the worker may call
`torch.distributed.init_process_group()` with the env:// defaults.

Errors: a worker's `AscentError` (a user error: bad path, bad value) reaches the caller as itself; any
other exception becomes a `WorkerError` naming group, rank and method; see `ascent.cluster.errors`.
"""

from __future__ import annotations

import socket
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any


def find_free_port() -> int:
    """A TCP port that is free on this machine right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


def rank_env(
    *,
    rank: int,
    world_size: int,
    local_rank: int,
    local_world_size: int,
    master_addr: str,
    master_port: int,
    extra: dict[str, str] | None = None,
) -> dict[str, str]:
    """The environment variables a worker of `rank` gets before its class is constructed."""
    env = {
        "RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_RANK": str(local_rank),
        "LOCAL_WORLD_SIZE": str(local_world_size),
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
    }
    env.update({k: str(v) for k, v in (extra or {}).items()})
    return env


class PendingCall(ABC):
    """A call in flight on some ranks of a group; `get()` waits and returns the results in rank order."""

    @abstractmethod
    def get(self) -> list[Any]: ...


class WorkerGroup(ABC):
    """N workers of one class, driven from the controller. Build one with `make_worker_group`."""

    backend: str = ""

    def __init__(self, cls: type, *, name: str, num_workers: int, timeout_s: float) -> None:
        if num_workers < 1:
            raise ValueError(f"worker group '{name}': num_workers={num_workers}; it needs at least 1 worker.")
        self.cls = cls
        self.name = name
        self.num_workers = num_workers
        self.timeout_s = timeout_s

    # what a backend implements ---------------------------------------------------------------------
    @abstractmethod
    def _submit(self, method: str, calls: Sequence[tuple[int, tuple, dict]]) -> PendingCall:
        """Start `method(*args, **kwargs)` on each (rank, args, kwargs) of `calls`."""

    @abstractmethod
    def shutdown(self) -> None:
        """Stop the workers and free their resources. Safe to call twice."""

    # the interface ---------------------------------------------------------------------------------
    def call(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        """`method(*args, **kwargs)` on every worker; results in rank order."""
        return self.call_async(method, *args, **kwargs).get()

    def call_split(self, method: str, shards: Sequence[Any], **kwargs: Any) -> list[Any]:
        """`method(shards[i], **kwargs)` on worker i; results in rank order."""
        return self.call_split_async(method, shards, **kwargs).get()

    def call_rank0(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """`method(*args, **kwargs)` on rank 0 only; its result."""
        return self._submit(self._check_method(method), [(0, args, kwargs)]).get()[0]

    def call_async(self, method: str, *args: Any, **kwargs: Any) -> PendingCall:
        """Like `call`, but returns at once; `.get()` the result."""
        method = self._check_method(method)
        return self._submit(method, [(rank, args, kwargs) for rank in range(self.num_workers)])

    def call_split_async(self, method: str, shards: Sequence[Any], **kwargs: Any) -> PendingCall:
        """Like `call_split`, but returns at once; `.get()` the result."""
        method = self._check_method(method)
        if len(shards) != self.num_workers:
            raise ValueError(
                f"worker group '{self.name}': call_split('{method}') got {len(shards)} shards for "
                f"{self.num_workers} workers; pass exactly one shard per worker (e.g. split the batch "
                f"with {self.num_workers} parts)."
            )
        return self._submit(method, [(rank, (shard,), kwargs) for rank, shard in enumerate(shards)])

    def _check_method(self, method: str) -> str:
        if method.startswith("_") or not callable(getattr(self.cls, method, None)):
            raise AttributeError(
                f"worker group '{self.name}': {self.cls.__name__} has no public method '{method}'."
            )
        return method

    def __enter__(self) -> WorkerGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, cls={self.cls.__name__}, num_workers={self.num_workers})"
