"""The paged KV cache: one preallocated K and V tensor per engine, addressed by token slots.

Layout: k, v [num_layers, num_pages, kv_heads, page_size, head_dim], so one page of one KV head is a
contiguous block the decode kernel reads in one go. Token t of a sequence lives at slot
`pages[t // page_size] * page_size + t % page_size` (page, offset), where `pages` is the sequence's block
table (host bookkeeping in pages.py). Page 0 is the trash page: padding tokens write there.
The size comes from a memory budget (`pages_for_budget`), capped by free memory at build and at every
wake (pool.py: `resize` between `free()` and `allocate()`); `free()` / `allocate()` implement sleep/wake.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ascent.errors import AscentError
from ascent.rollout.fast.spec import ModelSpec


class KVCacheOutOfMemory(AscentError, RuntimeError):
    """The KV cache, sized at start-up, did not fit when it was allocated again (an engine waking beside a
    colocated trainer); the message names the setting to lower."""


def pages_for_budget(
    spec: ModelSpec,
    dtype: torch.dtype,
    device: torch.device,
    gpu_memory_fraction: float,
    page_size: int,
    reserve_bytes: int,
) -> int:
    """How many pages fit in `gpu_memory_fraction` of the device, less what is allocated and a reserve.

    The reserve covers activations (prefill, logits, CUDA graph pools). Raises when nothing fits.
    """
    total = torch.cuda.get_device_properties(device).total_memory
    used = torch.cuda.memory_allocated(device)
    budget = int(gpu_memory_fraction * total) - used - reserve_bytes
    page_bytes = spec.kv_bytes_per_token(dtype) * page_size
    pages = budget // page_bytes
    if pages < 2:
        raise ValueError(
            f"rollout gpu_memory_fraction={gpu_memory_fraction}: {gpu_memory_fraction * total / 2**30:.1f} "
            f"GiB minus {used / 2**30:.1f} GiB already allocated and a {reserve_bytes / 2**30:.1f} GiB "
            "activation reserve leaves no room for the KV cache; raise gpu_memory_fraction or lower "
            "max_batch_size."
        )
    return int(pages)


class KVCache:
    """K and V for every layer, [L, num_pages, kvh, page_size, d] each."""

    def __init__(
        self, spec: ModelSpec, num_pages: int, page_size: int, dtype: torch.dtype, device: torch.device
    ):
        self.spec, self.num_pages, self.page_size = spec, num_pages, page_size
        self.dtype, self.device = dtype, device
        self.k: Tensor | None = None
        self.v: Tensor | None = None
        self.allocate()

    @property
    def num_slots(self) -> int:
        return self.num_pages * self.page_size

    @property
    def nbytes(self) -> int:
        """Bytes of K and V allocated now (0 between `free()` and `allocate()`)."""
        if self.k is None or self.v is None:
            return 0
        return self.k.nbytes + self.v.nbytes

    def tensors(self) -> tuple[Tensor, Tensor]:
        """(k, v) of an allocated cache (not between `free()` and `allocate()`)."""
        assert self.k is not None and self.v is not None, "the KV cache is freed (engine asleep)"
        return self.k, self.v

    def allocate(self) -> None:
        """(Re)create zeroed K/V tensors (zeros: masked reads of never-written slots stay finite)."""
        if self.k is not None:
            return
        spec = self.spec
        shape = (spec.num_layers, self.num_pages, spec.num_kv_heads, self.page_size, spec.head_dim)
        try:
            self.k = torch.zeros(shape, dtype=self.dtype, device=self.device)
            self.v = torch.zeros(shape, dtype=self.dtype, device=self.device)
        except torch.OutOfMemoryError as e:
            self.k = self.v = None
            raise KVCacheOutOfMemory(self._out_of_memory(shape)) from e

    def _out_of_memory(self, shape: tuple[int, ...]) -> str:
        need = 2 * torch.Size(shape).numel() * self.dtype.itemsize / 2**30
        where = str(self.device)
        if self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            held = torch.cuda.memory_allocated(self.device) / 2**30
            where += f" ({free / 2**30:.1f} GiB free, {held:.1f} GiB allocated by this process)"
        return (
            f"the fast engine's KV cache ({need:.1f} GiB, {self.num_pages} pages) does not fit on {where}. "
            "Its size was set at start-up by rollout.gpu_memory_fraction, before a colocated trainer held "
            "its gradients and optimizer state; lower rollout.gpu_memory_fraction (`ascent doctor` shows "
            "each phase's peak), or shrink the trainer's share (train.offload_optimizer=true, model.lora.rank)."
        )

    def free(self) -> None:
        """Drop the tensors (the caller empties the allocator cache)."""
        self.k = self.v = None

    def resize(self, num_pages: int) -> None:
        """Take `num_pages` pages at the next `allocate()` (a freed cache only: pool.py sizes it at wake)."""
        assert self.k is None, "resize a freed KV cache (engine asleep)"
        self.num_pages = num_pages

    def write(self, layer: int, slots: Tensor, k: Tensor, v: Tensor) -> None:
        """slots [T] int64, k/v [T, kvh, d] -> stored at those slots of `layer`."""
        page, off = slots // self.page_size, slots % self.page_size
        k_all, v_all = self.tensors()
        k_all[layer][page, :, off] = k
        v_all[layer][page, :, off] = v

    def copy_pages(self, src: list[int], dst: list[int]) -> None:
        """Copy whole pages src[i] -> dst[i] in every layer (fork of a shared prompt's last page)."""
        if not src:
            return
        s, d = torch.tensor(src, device=self.device), torch.tensor(dst, device=self.device)
        k, v = self.tensors()
        k[:, d] = k[:, s]
        v[:, d] = v[:, s]
