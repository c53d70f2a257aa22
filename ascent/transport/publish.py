"""The weight transport's one protocol: a controller-side `Publisher` and worker-side `Sender` / `Receiver`.

design.md: "The transport is one protocol, `Publisher.publish(version)` on the trainer side and a `Receiver`
on the engine side, with one module per way of moving weights, chosen in one place." The modules:
`inline` (shared tensors, one process), `object_store` (Ray's object store, the fallback), `broadcast`
(a NCCL/gloo process group) and `cuda_ipc` (GPU memory handed over on one node); `select` chooses one.

A publisher drives the trainer ranks and the rollout replicas through their worker groups with typed handles
(`cluster.base`: a method of the worker class, not a name). The worker classes live above this package, so
setup hands their methods in as a `TrainerEnd` and a `ReplicaEnd`. The controller never holds weights: they
go from trainer to replica as an object reference (forwarded) or over a link between the two processes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from torch import Tensor

from ascent.cluster.base import PendingCall, WorkerGroup

Apply = Callable[[list[tuple[str, Tensor]]], None]  # copies one bucket's (name, view) pairs into an engine


class Publisher(Protocol):
    """Controller side: `publish(version)` puts the trainer's current weights, as policy `version`, into every
    replica and returns once each reports holding them (else raises, naming what it waited for)."""

    name: (
        str  # the transport's name, as `cluster.weight_transport` spells it ("inline" for the inline backend)
    )
    in_process: bool  # trainer and engines share this process (and its CUDA allocator)

    def publish(self, version: int) -> None: ...

    def describe(self) -> str:
        """One line for the controller's log: the transport and how it is set up."""
        ...


class Sender(Protocol):
    """Worker side, on a trainer rank: send every named weight as `version`; returns the bytes sent."""

    def send(self, named: Iterable[tuple[str, Tensor]], version: int) -> int: ...


class Receiver(Protocol):
    """Worker side, on a replica: hand every bucket of `version` to `apply`; returns the bytes received."""

    def receive(self, apply: Apply, version: int) -> int: ...


@dataclass(frozen=True)
class TrainerEnd:
    """The trainer's worker group and the methods of its worker class a publication calls."""

    group: WorkerGroup[Any]
    named_weights: Callable[..., dict[str, Tensor]]  # (to_cpu) -> rank 0's weights; other ranks gather
    address: Callable[..., tuple[str, int]]  # () -> (node IP, free port) for a link's rendezvous
    join: Callable[..., None]  # (Rendezvous) -> None: form this rank's `Sender`
    send: Callable[..., int]  # (version) -> bytes sent over the joined `Sender`


@dataclass(frozen=True)
class ReplicaEnd:
    """The rollout replicas' worker group and the methods of its worker class a publication calls."""

    group: WorkerGroup[Any]
    update_weights: Callable[..., int]  # (named tensors, version) -> version held
    join: Callable[..., None]  # (Rendezvous) -> None: form this replica's `Receiver`
    receive: Callable[..., int]  # (version) -> version held, taken over the joined `Receiver`
    alongside: bool = False  # reach a replica between two decode steps of a running generate call

    def start(self, method: Callable[..., int], *args: Any) -> PendingCall[int]:
        """`method(*args)` on every replica: after the calls queued before it, or alongside the one
        running."""
        if self.alongside:
            return self.group.call_alongside_async(method, *args)
        return self.group.call_async(method, *args)


def check_held(version: int, held: list[int]) -> None:
    """Every replica reports the version it holds after a publication: all of them must hold `version`."""
    if any(v != version for v in held):
        raise RuntimeError(f"weight publication of version {version}: the rollout replicas report {held}.")


def publish_forwarded(trainer: TrainerEnd, replicas: ReplicaEnd, version: int, to_cpu: bool) -> None:
    """Trainer rank 0's weights go to every replica as one forwarded result (`PendingCall.forward`): the value
    itself inline, an object reference on Ray that the replicas resolve (the controller never holds them).
    The other ranks take part in the gather (FSDP); their errors surface after the replicas'."""
    pending = trainer.group.call_async(trainer.named_weights, to_cpu=to_cpu)
    try:
        held = replicas.start(replicas.update_weights, pending.forward(0), version).get()
    except Exception:
        pending.get()  # the trainer's own error, when it failed first
        raise
    pending.others(0)
    check_held(version, held)
