"""How many KV-cache pages the fast engine allocates, at build and at every wake (kv_cache.py holds them).

The run asks for a size: `rollout.gpu_memory_fraction` of the card (less the weights and an activation
reserve, `pages_for_budget`), or `kv_cache_tokens`. A colocated engine wakes beside a trainer that holds
more than it did at build (AdamW's moments exist only after the first update), so the asked size may no
longer fit. `PoolSizer` takes min(asked, what is free now less a margin for activations, CUDA graphs and
sampler workspace), rounded down to a 1/32 step of the asked size (the same size from wake to wake while
free memory jitters), and never below what one max_model_len request needs: below that it raises
`KVCacheOutOfMemory`, the clear error naming the settings. A pool smaller than asked logs one warning per
size change; the engine's `kv_cache_tokens` (metric `rollout/kv_tokens`) shows it on the curves.

The free-memory probe is a function parameter: on CUDA `cuda_free_bytes(device)`, in CPU tests a fake one;
None (CPU by default) keeps the asked size.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ascent.rollout.fast.kv_cache import KVCacheOutOfMemory

log = logging.getLogger(__name__)

FreeBytes = Callable[[], int]  # device bytes free now (the CUDA driver's view: every process counts)
STEPS = 32  # a shrunk pool is a multiple of asked / STEPS pages


def cuda_free_bytes(device: torch.device) -> FreeBytes:
    """The probe on a GPU: free bytes of `device` as the driver reports them (other processes included)."""
    return lambda: torch.cuda.mem_get_info(device)[0]


@dataclass
class PoolSizer:
    """Sizes the pool: `asked` pages (what `asked_by` names), at least `least` (one max-length request plus
    the trash page), pages of `page_size` tokens and `page_bytes` bytes, `margin` bytes left free,
    `free_bytes` the probe (None: no probe, the asked size). `pages` is the size settled last."""

    asked: int
    least: int
    page_size: int
    page_bytes: int
    margin: int
    free_bytes: FreeBytes | None
    asked_by: str
    device: str = "cuda"
    pages: int = 0

    def fit(self) -> int:
        """This process's candidate: min(asked, what fits in free memory less the margin), stepped down."""
        if self.free_bytes is None:
            return self.asked
        room = max(0, (self.free_bytes() - self.margin) // self.page_bytes)
        if room >= self.asked:
            return self.asked
        step = max(1, self.asked // STEPS)
        return max(room - room % step, min(room, self.least))

    def settle(self, pages: int) -> int:
        """Accept `pages` (every rank's `fit`, agreed): raise below one max-length request, warn once per
        size change when smaller than asked. -> the pool's pages."""
        floor = min(self.asked, self.least)
        if pages < floor:
            raise KVCacheOutOfMemory(self._too_small(pages))
        pages = min(pages, self.asked)
        if pages < self.asked and pages != self.pages:
            log.warning(self._shrunk(pages))
        elif pages == self.asked and self.pages and self.pages != pages:
            log.info("fast engine: the KV cache is back to its asked %d pages (%s)", pages, self.asked_by)
        self.pages = pages
        return pages

    def _free_text(self) -> str:
        free = self.free_bytes() if self.free_bytes is not None else 0
        return f"{free / 2**30:.1f} GiB is free on {self.device}, less a {self.margin / 2**30:.1f} GiB margin"

    def _shrunk(self, pages: int) -> str:
        ps = self.page_size
        return (
            f"fast engine: KV cache of {pages} pages ({(pages - 1) * ps:,} tokens), smaller than the "
            f"{self.asked} pages ({(self.asked - 1) * ps:,} tokens) {self.asked_by} asks: only "
            f"{self._free_text()} for activations (a colocated trainer's optimizer state and gradients hold "
            "the rest). Fewer sequences decode at once (rollout/kv_tokens in the metrics). To get the pool "
            "back, shrink the trainer's share (train.offload_optimizer=true, model.lora.rank); to ask for "
            "what fits, lower rollout.gpu_memory_fraction."
        )

    def _too_small(self, pages: int) -> str:
        ps, need = self.page_size, min(self.asked, self.least)
        return (
            f"the fast engine's KV cache does not fit: one max_model_len request needs {need} pages "
            f"({need * self.page_bytes / 2**30:.2f} GiB of {ps}-token pages) but only {max(pages, 0)} fit: "
            f"{self._free_text()} for activations. The pool is what {self.asked_by} asks, shrunk at "
            "build and at every wake to what is free (a colocated trainer's optimizer state); shrink the "
            "trainer's share (train.offload_optimizer=true, model.lora.rank) or the engine's context "
            "(max_model_len), or place the engine on its own GPUs (cluster.placement=split)."
        )
