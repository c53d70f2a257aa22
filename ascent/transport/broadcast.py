"""The `broadcast` transport: a process group of its own, trainer rank 0 as rank 0 and replica i as rank i+1.

NCCL between GPUs (split placement, any node), gloo on CPU (how the CPU tests run it). Each bucket is
broadcast as one flat tensor after a small header (meta length, payload length; 0/0 ends a publication).
Only trainer rank 0 sends; the other ranks take part in the gathers (FSDP) and hold no link.
"""

from __future__ import annotations

import datetime
import pickle
from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor

from ascent.transport.buckets import batched, pack, unpack
from ascent.transport.publish import Apply
from ascent.transport.weights import LinkPublisher, Rendezvous, check_version, open_store, timeout_error


class BroadcastPublisher(LinkPublisher):
    """Trainer rank 0 broadcasts every bucket to all replicas at once."""

    name = "broadcast"


def sender(rv: Rendezvous, rank: int, device: torch.device) -> BroadcastLink | None:
    """Trainer rank `rank`'s `Sender` (None: this rank only takes part in the gathers)."""
    return BroadcastLink(rv, 0, device) if rank == 0 else None


def receiver(rv: Rendezvous, replica: int, device: torch.device) -> BroadcastLink:
    """Replica `replica`'s `Receiver`."""
    return BroadcastLink(rv, replica + 1, device)


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
            raise timeout_error(rv, f"forming the process group (rank {rank} of {world})", e) from e

    def _bcast(self, tensor: Tensor, what: str) -> None:
        try:
            self.group.broadcast(tensor, 0).wait()
        except Exception as e:  # noqa: BLE001
            raise timeout_error(self.rv, what, e) from e

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
            check_version(sent_version, version, self.rv)
            if buffer.numel() < size:
                buffer = torch.empty(size, dtype=torch.uint8, device=self.device)
            self._bcast(buffer[:size], f"a bucket of version {version}")
            apply(unpack(buffer, metas))
            received += size
