"""The `cuda_ipc` transport: colocated on one node, trainer rank i hands replica i its GPU memory.

Trainer rank i packs each bucket into a CUDA buffer and publishes an IPC handle to it through a `TCPStore`;
replica i opens the handle, copies the bucket into its engine and acknowledges; no copy leaves the GPU.
Every trainer rank holds the full weights (FSDP gathers per bucket), so rank i serves replica i. The module
imports on a CPU-only machine; it runs only on GPUs (tests/gpu/test_cuda_ipc_gpu.py, bench/publish.py).
"""

from __future__ import annotations

import datetime
import pickle
from collections.abc import Iterable

import torch
from torch import Tensor

from ascent.transport.buckets import batched, pack, unpack
from ascent.transport.publish import Apply
from ascent.transport.weights import LinkPublisher, Rendezvous, check_version, open_store, timeout_error


class CudaIpcPublisher(LinkPublisher):
    """Every trainer rank i serves replica i on its GPU (as many replicas as trainer ranks)."""

    name = "cuda_ipc"


def sender(rv: Rendezvous, rank: int, device: torch.device) -> CudaIpcLink:
    """Trainer rank `rank`'s `Sender` (it serves replica `rank`)."""
    return CudaIpcLink(rv, rank, sender=True, store_world=2 * rv.num_replicas)


def receiver(rv: Rendezvous, replica: int, device: torch.device) -> CudaIpcLink:
    """Replica `replica`'s `Receiver`."""
    return CudaIpcLink(rv, replica, sender=False, store_world=2 * rv.num_replicas)


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
            raise timeout_error(self.rv, f"{what} (pair {self.pair})", e) from e

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
            check_version(sent_version, version, self.rv)
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
