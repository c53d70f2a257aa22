"""Where the run's weight transport is chosen: the one place that reads a transport's name.

`choose` resolves `cluster.weight_transport` (flat arguments: setup reads the config), `build_publisher`
builds the controller's `Publisher` of that transport, and `sender_link` / `receiver_link` build the
worker-side `Sender` / `Receiver` of a link transport from its `Rendezvous`. A new transport is one module
with a publisher (and, for a link, its sender and receiver) plus one entry in the tables below.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from ascent.transport import broadcast, cuda_ipc
from ascent.transport.inline import InlinePublisher
from ascent.transport.object_store import ObjectStorePublisher
from ascent.transport.publish import Publisher, Receiver, ReplicaEnd, Sender, TrainerEnd
from ascent.transport.weights import Rendezvous

FORWARDED: dict[str, Callable[[TrainerEnd, ReplicaEnd], Publisher]] = {
    "inline": InlinePublisher,
    "object_store": ObjectStorePublisher,
}


class Link(NamedTuple):
    """A link transport's three parts: the controller's publisher, a trainer rank's and a replica's end."""

    publisher: Callable[[TrainerEnd, ReplicaEnd, float, int], Publisher]
    sender: Callable[[Rendezvous, int, torch.device], Sender | None]
    receiver: Callable[[Rendezvous, int, torch.device], Receiver]


LINKS: dict[str, Link] = {
    "broadcast": Link(broadcast.BroadcastPublisher, broadcast.sender, broadcast.receiver),
    "cuda_ipc": Link(cuda_ipc.CudaIpcPublisher, cuda_ipc.sender, cuda_ipc.receiver),
}


def choose(
    backend: str,
    requested: str,
    placement: str,
    device: str,
    gpus_per_worker: float,
    num_trainers: int,
    num_replicas: int,
) -> str:
    """The transport `requested` (`cluster.weight_transport`) resolves to. Inline everything shares one
    process. `auto`: cuda_ipc when trainer ranks and replicas share GPUs one to one, the object store when
    they share GPUs otherwise (NCCL needs distinct GPUs), else broadcast (split GPUs, or CPUs over gloo)."""
    if backend == "inline":
        return "inline"
    if requested != "auto":
        return requested
    gpus = gpus_per_worker > 0 and device != "cpu"
    if gpus and (placement == "colocated" or gpus_per_worker < 1):
        return "cuda_ipc" if num_replicas == num_trainers else "object_store"
    return "broadcast"


def build_publisher(
    kind: str, trainer: TrainerEnd, replicas: ReplicaEnd, timeout_s: float, bucket_bytes: int
) -> Publisher:
    """The `Publisher` of transport `kind`; a link transport joins its links here (both sides at once, each
    waiting at most `timeout_s` for the other)."""
    if kind in FORWARDED:
        return FORWARDED[kind](trainer, replicas)
    return LINKS[kind].publisher(trainer, replicas, timeout_s, bucket_bytes)


def sender_link(rv: Rendezvous, rank: int, device: torch.device) -> Sender | None:
    """The `Sender` trainer rank `rank` publishes on (None: this rank only takes part in the gathers)."""
    return LINKS[rv.kind].sender(rv, rank, device)


def receiver_link(rv: Rendezvous, replica: int, device: torch.device) -> Receiver:
    """The `Receiver` replica `replica` takes publications on."""
    return LINKS[rv.kind].receiver(rv, replica, device)
