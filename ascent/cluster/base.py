"""The worker-group interface the RL loop talks to, and what every backend shares.

A worker group runs N copies of a plain Python class (rank 0..N-1). The controller calls a method on all of
them (`call`), on each with its own shard (`call_split`) or on rank 0 only (`call_rank0`); results come back
in rank order. A call names the method itself (`group.call(TrainerWorker.save, path)`), a typed handle:
mypy checks its arguments and result type, and a reader can jump to the definition. The `_async` variants
return a `PendingCall` at once so two groups can work at the same time. A worker runs its calls one at a
time, in the order sent; `call_alongside_async` is the one exception (on Ray it runs next to a call in
progress: a rollout replica takes new weights while a long generate call runs). Backends (inline, Ray)
implement `_submit` and `shutdown` and must behave the same.

Before a worker's class is constructed, the group sets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
MASTER_ADDR and MASTER_PORT (a free port on rank 0's node), so the worker may call
`torch.distributed.init_process_group()` with the env:// defaults.

Errors: a worker's `AscentError` (a user error: bad path, bad value) reaches the caller as itself; any
other exception becomes a `WorkerError` naming group, rank and method; see `ascent.cluster.errors`.
"""

from __future__ import annotations

import socket
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar

W = TypeVar("W")  # the worker class of a group
R = TypeVar("R")  # a method's result
S = TypeVar("S")  # the shard type of a split call
P = ParamSpec("P")  # a method's other arguments


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


class PendingCall(ABC, Generic[R]):
    """A call in flight on some ranks of a group; `get()` waits and returns the results in rank order.

    `forward(i)` hands result i to another group's call without bringing it to the controller (weights go
    trainer -> engine directly): on Ray an object reference that the receiving worker resolves, inline the
    value itself. `others(i)` then waits for the remaining results (and raises their errors)."""

    @abstractmethod
    def get(self) -> list[R]: ...

    @abstractmethod
    def forward(self, index: int = 0) -> R: ...

    @abstractmethod
    def others(self, index: int = 0) -> list[R]: ...


class WorkerGroup(ABC, Generic[W]):
    """N workers of class `W`, driven from the controller. Build one with `make_worker_group`.

    Calls name a method of the worker class itself, not a string: `group.call(TrainerWorker.save, path)`
    runs `save(path)` on every worker and is typed `list[None]`, so a reader (and mypy) can follow the call
    to its definition, and a misspelt or private method fails before anything is sent.
    """

    backend: str = ""

    def __init__(self, cls: type[W], *, name: str, num_workers: int, timeout_s: float) -> None:
        if num_workers < 1:
            raise ValueError(f"worker group '{name}': num_workers={num_workers}; it needs at least 1 worker.")
        self.cls = cls
        self.name = name
        self.num_workers = num_workers
        self.timeout_s = timeout_s

    # what a backend implements ---------------------------------------------------------------------
    @abstractmethod
    def _submit(
        self, method: str, calls: Sequence[tuple[int, tuple, dict]], alongside: bool = False
    ) -> PendingCall[Any]:
        """Start the worker method named `method` with (*args, **kwargs) on each (rank, args, kwargs);
        `alongside`: next to a call in progress instead of after it (see `call_alongside_async`)."""

    @abstractmethod
    def shutdown(self) -> None:
        """Stop the workers and free their resources. Safe to call twice."""

    # the interface ---------------------------------------------------------------------------------
    def call(self, method: Callable[Concatenate[W, P], R], *args: P.args, **kwargs: P.kwargs) -> list[R]:
        """`method(*args, **kwargs)` on every worker; results in rank order."""
        return self.call_async(method, *args, **kwargs).get()

    def call_split(
        self,
        method: Callable[Concatenate[W, S, P], R],
        shards: Sequence[S],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> list[R]:
        """`method(shards[i], *args, **kwargs)` on worker i; results in rank order."""
        return self.call_split_async(method, shards, *args, **kwargs).get()

    def call_rank0(self, method: Callable[Concatenate[W, P], R], *args: P.args, **kwargs: P.kwargs) -> R:
        """`method(*args, **kwargs)` on rank 0 only; its result."""
        return self._submit(self._check_method(method), [(0, args, kwargs)]).get()[0]

    def call_async(
        self, method: Callable[Concatenate[W, P], R], *args: P.args, **kwargs: P.kwargs
    ) -> PendingCall[R]:
        """Like `call`, but returns at once; `.get()` the result."""
        name = self._check_method(method)
        return self._submit(name, [(rank, args, kwargs) for rank in range(self.num_workers)])

    def call_alongside_async(
        self, method: Callable[Concatenate[W, P], R], *args: P.args, **kwargs: P.kwargs
    ) -> PendingCall[R]:
        """Like `call_async`, but on Ray each worker runs it on a second thread, next to a call it is running
        (one such call at a time), instead of after the calls queued before it. The method must be safe to run
        next to the worker's others: `RolloutWorker.receive_weights` waits for a decode-step boundary of
        the generate call in progress. Inline a call never runs next to another: the same as `call_async`."""
        name = self._check_method(method)
        return self._submit(name, [(rank, args, kwargs) for rank in range(self.num_workers)], alongside=True)

    def call_split_async(
        self,
        method: Callable[Concatenate[W, S, P], R],
        shards: Sequence[S],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> PendingCall[R]:
        """Like `call_split`, but returns at once; `.get()` the result."""
        name = self._check_method(method)
        if len(shards) != self.num_workers:
            raise ValueError(
                f"worker group '{self.name}': call_split({self.cls.__name__}.{name}) got {len(shards)} "
                f"shards for {self.num_workers} workers; pass exactly one shard per worker (e.g. split the "
                f"batch with {self.num_workers} parts)."
            )
        return self._submit(name, [(rank, (shard, *args), kwargs) for rank, shard in enumerate(shards)])

    def _check_method(self, method: Callable[..., Any]) -> str:
        """The name of `method` if it is a public method of the worker class; else AttributeError."""
        name = getattr(method, "__name__", "")
        if not name or name.startswith("_") or getattr(self.cls, name, None) is not method:
            raise AttributeError(
                f"worker group '{self.name}': {method!r} is not a public method of {self.cls.__name__}; "
                f"pass one of its methods, e.g. group.call({self.cls.__name__}.<method>, ...)."
            )
        return name

    def __enter__(self) -> WorkerGroup[W]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(name={self.name!r}, cls={self.cls.__name__}, "
            f"num_workers={self.num_workers})"
        )
