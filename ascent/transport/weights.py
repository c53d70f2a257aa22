"""Versioned weight publication from the trainer's processes to the rollout replicas' processes.

design.md: "Weights move through one versioned transport (`publish(version)`) ... The controller never
holds weights." The controller only starts the two sides of a publication (`send` on the trainer ranks,
`receive` on the replicas) and checks the version every replica reports; the tensors go process to process
in buckets (`ascent.transport.buckets`), so no process holds more than one bucket beyond its own model.

Transports (`cluster.weight_transport`):
- `broadcast`: a process group of its own, trainer rank 0 as rank 0 and replica i as rank i+1, NCCL
  between GPUs (split placement, any node) and gloo on CPU. Each bucket is broadcast as one flat tensor
  after a small header (meta length, payload length; 0/0 ends a publication).
- `cuda_ipc`: colocated on one node, trainer rank i hands replica i the CUDA memory of each bucket (an IPC
  handle through a `TCPStore`), the replica copies it into its engine and acknowledges; no copy leaves the
  GPU. Every trainer rank holds the full weights (FSDP gathers per bucket), so rank i serves replica i.
- The Ray object store (`object_store`) is the fallback and lives in the loop (`publish_weights`).

Every wait is bounded by `cluster.weight_sync_timeout_s`; the error names the transport and that knob.
"""

from __future__ import annotations

import datetime
import pickle
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor

from ascent.transport.buckets import TensorMeta, batched, pack, unpack

Kind = Literal["broadcast", "cuda_ipc"]
Apply = Callable[[list[tuple[str, Tensor]]], None]  # copies one bucket's (name, view) pairs into an engine


@dataclass(frozen=True)
class Rendezvous:
    """Where the publication's store listens (trainer rank 0's node) and who takes part."""

    kind: Kind
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


def _timeout_error(rv: Rendezvous, what: str, err: BaseException) -> WeightSyncTimeout:
    return WeightSyncTimeout(
        f"weight transport '{rv.kind}' ({rv.host}:{rv.port}): {what} did not finish within "
        f"{rv.timeout_s:g}s ({type(err).__name__}: {err}). Raise cluster.weight_sync_timeout_s for very "
        "large models or slow links, check that the nodes reach each other on that address (set "
        "GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME to the right interface), or set "
        "cluster.weight_transport=object_store."
    )


def open_store(rv: Rendezvous, is_master: bool, world: int) -> Any:
    """The publication's TCPStore: hosted by trainer rank 0, joined by everyone else."""
    from torch.distributed import TCPStore

    timeout = datetime.timedelta(seconds=rv.timeout_s)
    try:
        return TCPStore(rv.host, rv.port, world, is_master, timeout=timeout, wait_for_workers=False)
    except Exception as e:  # noqa: BLE001 - an unreachable or busy port, said with the knob
        raise _timeout_error(rv, "joining the rendezvous store", e) from e


class BroadcastLink:
    """One side of the `broadcast` transport: rank 0 sends, ranks 1..N receive."""

    def __init__(self, rv: Rendezvous, rank: int, device: torch.device) -> None:
        from torch.distributed import PrefixStore

        self.rv, self.rank, self.device = rv, rank, device
        world = rv.num_replicas + 1
        self.store = open_store(rv, is_master=rank == 0, world=world)
        prefix = PrefixStore("ascent-weights", self.store)
        timeout = datetime.timedelta(seconds=rv.timeout_s)
        try:
            if device.type == "cuda":
                from torch.distributed import ProcessGroupNCCL

                opts = ProcessGroupNCCL.Options()
                opts._timeout = timeout
                self.group: Any = ProcessGroupNCCL(prefix, rank, world, opts)
            else:
                from torch.distributed import ProcessGroupGloo

                self.group = ProcessGroupGloo(prefix, rank, world, timeout)
        except Exception as e:  # noqa: BLE001
            raise _timeout_error(rv, f"forming the process group (rank {rank} of {world})", e) from e

    def _bcast(self, tensor: Tensor, what: str) -> None:
        try:
            self.group.broadcast(tensor, 0).wait()
        except Exception as e:  # noqa: BLE001
            raise _timeout_error(self.rv, what, e) from e

    def send(self, named: Iterable[tuple[str, Tensor]], version: int) -> int:
        """Broadcast every weight of `named` in buckets; returns the bytes sent."""
        sent, buffer = 0, torch.empty(0, dtype=torch.uint8, device=self.device)
        for part in batched(named, self.rv.bucket_bytes):
            part = [(n, t.to(self.device)) for n, t in part]
            need = sum(t.numel() * t.element_size() + 16 for _, t in part)
            if buffer.numel() < need:
                buffer = torch.empty(need, dtype=torch.uint8, device=self.device)
            metas = pack(part, buffer)
            header = pickle.dumps((version, metas))
            size = metas[-1].offset + metas[-1].nbytes
            self._send_header(len(header), size)
            meta_t = torch.frombuffer(bytearray(header), dtype=torch.uint8).to(self.device)
            self._bcast(meta_t, f"bucket metadata of version {version}")
            self._bcast(buffer[:size], f"a bucket of version {version}")
            sent += size
        self._send_header(0, 0)
        return sent

    def _send_header(self, meta_len: int, size: int) -> None:
        header = torch.tensor([meta_len, size], dtype=torch.int64, device=self.device)
        self._bcast(header, "a bucket header")

    def receive(self, apply: Apply, version: int) -> int:
        """Receive buckets until the end marker, handing each to `apply`; returns the bytes received."""
        received, buffer = 0, torch.empty(0, dtype=torch.uint8, device=self.device)
        while True:
            header = torch.zeros(2, dtype=torch.int64, device=self.device)
            self._bcast(header, f"a bucket header of version {version}")
            meta_len, size = (int(x) for x in header.tolist())
            if meta_len == 0:
                return received
            meta_t = torch.empty(meta_len, dtype=torch.uint8, device=self.device)
            self._bcast(meta_t, f"bucket metadata of version {version}")
            sent_version, metas = pickle.loads(meta_t.cpu().numpy().tobytes())
            _check_version(sent_version, version, self.rv)
            if buffer.numel() < size:
                buffer = torch.empty(size, dtype=torch.uint8, device=self.device)
            self._bcast(buffer[:size], f"a bucket of version {version}")
            apply(unpack(buffer, metas))
            received += size


def _check_version(sent: int, expected: int, rv: Rendezvous) -> None:
    if sent != expected:
        raise RuntimeError(
            f"weight transport '{rv.kind}': a replica waiting for version {expected} got version {sent}; a "
            "previous publication was interrupted. Restart the run from its last checkpoint."
        )


class CudaIpcLink:
    """One side of the `cuda_ipc` transport: trainer rank i sends to replica i on the same GPU."""

    def __init__(self, rv: Rendezvous, pair: int, sender: bool, store_world: int) -> None:
        self.rv, self.pair, self.sender = rv, pair, sender
        self.store = open_store(rv, is_master=sender and pair == 0, world=store_world)

    def _key(self, version: int, k: int, what: str) -> str:
        return f"ipc/{self.pair}/{version}/{k}/{what}"

    def _wait(self, key: str, what: str) -> None:
        try:
            self.store.wait([key], datetime.timedelta(seconds=self.rv.timeout_s))
        except Exception as e:  # noqa: BLE001
            raise _timeout_error(self.rv, f"{what} (pair {self.pair})", e) from e

    def send(self, named: Iterable[tuple[str, Tensor]], version: int) -> int:
        from torch.multiprocessing.reductions import reduce_tensor

        sent, k, buffer = 0, 0, None
        for part in batched(named, self.rv.bucket_bytes):
            need = sum(t.numel() * t.element_size() + 16 for _, t in part)
            if buffer is None or buffer.numel() < need:
                buffer = torch.empty(max(need, self.rv.bucket_bytes), dtype=torch.uint8, device="cuda")
            metas = pack([(n, t.to(buffer.device)) for n, t in part], buffer)
            torch.cuda.current_stream().synchronize()
            self.store.set(
                self._key(version, k, "data"), pickle.dumps((version, reduce_tensor(buffer), metas))
            )
            self._wait(self._key(version, k, "ack"), f"the replica's copy of bucket {k} of version {version}")
            for what in ("data", "ack"):
                self.store.delete_key(self._key(version, k, what))
            sent += metas[-1].offset + metas[-1].nbytes
            k += 1
        self.store.set(self._key(version, k, "data"), pickle.dumps((version, None, [])))
        self._wait(self._key(version, k, "ack"), f"the end of version {version}")
        for what in ("data", "ack"):
            self.store.delete_key(self._key(version, k, what))
        return sent

    def receive(self, apply: Apply, version: int) -> int:
        received, k = 0, 0
        while True:
            key = self._key(version, k, "data")
            self._wait(key, f"bucket {k} of version {version}")
            sent_version, handle, metas = pickle.loads(self.store.get(key))
            _check_version(sent_version, version, self.rv)
            if handle is not None:
                rebuild, args = handle
                buffer = rebuild(*args)
                apply(unpack(buffer, metas))
                torch.cuda.current_stream().synchronize()  # copied out before the sender reuses the memory
                received += (metas[-1].offset + metas[-1].nbytes) if metas else 0
                del buffer
            self.store.set(self._key(version, k, "ack"), b"1")
            if handle is None:
                return received
            k += 1


def sender_link(rv: Rendezvous, rank: int, device: torch.device) -> BroadcastLink | CudaIpcLink | None:
    """The link trainer rank `rank` sends on (None: this rank only takes part in gathers)."""
    if rv.kind == "broadcast":
        return BroadcastLink(rv, 0, device) if rank == 0 else None
    return CudaIpcLink(rv, rank, sender=True, store_world=2 * rv.num_replicas)


def receiver_link(rv: Rendezvous, replica: int, device: torch.device) -> BroadcastLink | CudaIpcLink:
    """The link replica `replica` receives on."""
    if rv.kind == "broadcast":
        return BroadcastLink(rv, replica + 1, device)
    return CudaIpcLink(rv, replica, sender=False, store_world=2 * rv.num_replicas)


__all__ = ["Rendezvous", "TensorMeta", "WeightSyncTimeout", "node_address", "receiver_link", "sender_link"]
