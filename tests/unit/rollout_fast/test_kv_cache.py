"""The fast engine's paged KV cache: sleep/wake reallocation and the error when it no longer fits."""

from __future__ import annotations

from types import SimpleNamespace
from typing import cast

import pytest
import torch

from ascent.entrypoints.guard import is_user_error
from ascent.rollout.fast import kv_cache
from ascent.rollout.fast.kv_cache import KVCache, KVCacheOutOfMemory
from ascent.rollout.fast.spec import ModelSpec

SPEC = cast(ModelSpec, SimpleNamespace(num_layers=2, num_kv_heads=2, head_dim=8))  # the fields KVCache reads


def test_free_then_allocate_gives_zeroed_tensors_of_the_same_shape() -> None:
    cache = KVCache(SPEC, num_pages=4, page_size=16, dtype=torch.float32, device=torch.device("cpu"))
    k, _ = cache.tensors()
    k.fill_(1.0)
    cache.free()
    assert cache.nbytes == 0
    cache.allocate()
    k2, v2 = cache.tensors()
    assert k2.shape == (2, 4, 2, 16, 8) and not k2.any() and not v2.any()
    assert cache.nbytes == 2 * 2 * 4 * 2 * 16 * 8 * 4


def test_a_cache_that_no_longer_fits_at_wake_names_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    """A colocated engine wakes after the update; its cache was sized before the optimizer state existed."""
    cache = KVCache(SPEC, num_pages=1024, page_size=16, dtype=torch.bfloat16, device=torch.device("cpu"))
    cache.free()

    def no_room(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 13.36 GiB.")

    monkeypatch.setattr(kv_cache.torch, "zeros", no_room)
    with pytest.raises(KVCacheOutOfMemory, match=r"rollout\.gpu_memory_fraction") as err:
        cache.allocate()
    assert "1024 pages" in str(err.value) and "train.offload_optimizer" in str(err.value)
    assert is_user_error(err.value)  # exit 2 with this message, not a traceback
    assert cache.nbytes == 0  # still asleep: a later wake may retry
