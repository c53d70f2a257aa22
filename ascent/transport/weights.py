"""What the two process-to-process transports share: a rendezvous, bounded waits, and their `Publisher`.

`broadcast` and `cuda_ipc` move weights over a link between a trainer rank's process and a replica's
process, never through the controller. Setup asks trainer rank 0 for an address (`TrainerEnd.address`),
then both sides join at once (`LinkPublisher`; each blocks until the other arrives); a publication runs
`Sender.send` on the trainer ranks next to `Receiver.receive` on the replicas, the tensors travelling in
buckets (`ascent.transport.buckets`), so no process holds more than one bucket beyond its own model.

Every wait is bounded by `cluster.weight_sync_timeout_s`; the error names the transport, what it waited for,
and that knob.
"""

from __future__ import annotations

import datetime
import socket
from dataclasses import dataclass
from typing import Any

from ascent.transport.buckets import TensorMeta
from ascent.transport.publish import ReplicaEnd, TrainerEnd, check_held


@dataclass(frozen=True)
class Rendezvous:
    """Where the publication's store listens (trainer rank 0's node) and who takes part."""

    kind: str  # the link transport: broadcast or cuda_ipc
    host: str
    port: int
    num_replicas: int
    timeout_s: float
    bucket_bytes: int


class WeightSyncTimeout(RuntimeError):
    """A publication did not complete within `cluster.weight_sync_timeout_s`."""


def node_address() -> str:
    """This node's IP address as other nodes reach it (the interface of the default route)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 1))  # no packet is sent: this only picks the outgoing interface
            return str(s.getsockname()[0])
        except OSError:
            return "127.0.0.1"


def timeout_error(rv: Rendezvous, what: str, err: BaseException) -> WeightSyncTimeout:
    """The error of a wait on the link that did not finish: what it waited for, where, and the knobs."""
    return WeightSyncTimeout(
        f"weight transport '{rv.kind}' ({rv.host}:{rv.port}): {what} did not finish within "
        f"{rv.timeout_s:g}s ({type(err).__name__}: {err}). Raise cluster.weight_sync_timeout_s for very "
        "large models or slow links, check that the nodes reach each other on that address (set "
        "GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME to the right interface), or set "
        "cluster.weight_transport=object_store."
    )


def check_version(sent: int, expected: int, rv: Rendezvous) -> None:
    """A receiver got a bucket of another version than the one it was asked to take."""
    if sent != expected:
        raise RuntimeError(
            f"weight transport '{rv.kind}': a replica waiting for version {expected} got version {sent}; a "
            "previous publication was interrupted. Restart the run from its last checkpoint."
        )


def open_store(rv: Rendezvous, is_master: bool, world: int) -> Any:
    """The publication's TCPStore: hosted by trainer rank 0, joined by everyone else."""
    from torch.distributed import TCPStore

    timeout = datetime.timedelta(seconds=rv.timeout_s)
    try:
        return TCPStore(rv.host, rv.port, world, is_master, timeout=timeout, wait_for_workers=False)
    except Exception as e:  # noqa: BLE001 - an unreachable or busy port, said with the knob
        raise timeout_error(rv, "joining the rendezvous store", e) from e


class LinkPublisher:
    """`Publisher` of a link transport: joins the links once, then each publication sends on the trainer
    ranks while the replicas receive (`broadcast.BroadcastPublisher`, `cuda_ipc.CudaIpcPublisher`)."""

    name: str
    in_process = False

    def __init__(self, trainer: TrainerEnd, replicas: ReplicaEnd, timeout_s: float, bucket_bytes: int):
        self.trainer, self.replicas = trainer, replicas
        host, port = trainer.group.call_rank0(trainer.address)
        num = replicas.group.num_workers
        self.rendezvous = Rendezvous(self.name, host, port, num, timeout_s, bucket_bytes)
        senders = trainer.group.call_async(trainer.join, self.rendezvous)
        replicas.group.call(replicas.join, self.rendezvous)
        senders.get()

    def publish(self, version: int) -> None:
        receivers = self.replicas.start(self.replicas.receive, version)
        senders = self.trainer.group.call_async(self.trainer.send, version)
        try:
            held = receivers.get()
        finally:
            senders.get()  # the trainer's own error, when it failed first
        check_held(version, held)

    def describe(self) -> str:
        rv = self.rendezvous
        return f"{self.name} (rendezvous {rv.host}:{rv.port}, {rv.bucket_bytes >> 20} MiB buckets)"


__all__ = ["LinkPublisher", "Rendezvous", "TensorMeta", "WeightSyncTimeout", "node_address"]
