"""The fast engine's KV pool sized at build and every wake to what is free (pool.py), with an injected probe:
it shrinks when less is free, keeps its size when enough is, warns once per size change, refuses below one
max-length request, and a shrunk engine samples the same tokens for the same seeds."""

from __future__ import annotations

import logging

import pytest

from ascent.entrypoints.guard import is_user_error
from ascent.messages import GenerationRequest, SamplingParams
from ascent.orchestrator.loop import kv_pool_metrics
from ascent.rollout.fast import FastEngine, build_fast_engine
from ascent.rollout.fast.kv_cache import KVCacheOutOfMemory
from ascent.rollout.fast.pool import PoolSizer

MIB = 2**20
PAGE = MIB  # bytes of one page in the sizer tests
PROMPTS = [[2, 5, 6, 7, 8, 9, 10, 11, 12], [3, 4], [40, 41, 42, 43, 44]]
PARAMS = [
    SamplingParams(temperature=0.0, max_new_tokens=20),
    SamplingParams(temperature=1.0, max_new_tokens=20, n=2, seed=7),
]


class Probe:
    """Free device bytes, set by the test: `margin` plus `pages` pages."""

    def __init__(self, margin: int, page_bytes: int, pages: int = 10**6):
        self.margin, self.page_bytes, self.pages = margin, page_bytes, pages

    def __call__(self) -> int:
        return self.margin + self.pages * self.page_bytes


def sizer(free_pages: int, asked: int = 64, least: int = 5) -> PoolSizer:
    probe = Probe(100 * MIB, PAGE, free_pages)
    return PoolSizer(asked, least, 16, PAGE, 100 * MIB, probe, "rollout.gpu_memory_fraction=0.5")


def test_the_pool_is_what_is_asked_when_enough_is_free_and_what_fits_otherwise() -> None:
    assert sizer(free_pages=1000).fit() == 64
    assert sizer(free_pages=64).fit() == 64
    assert sizer(free_pages=41).fit() == 40  # a multiple of 64 / 32 pages: steady while free memory jitters
    assert sizer(free_pages=6).fit() == 6
    assert sizer(free_pages=3).fit() == 3  # (settle refuses it)
    no_probe = PoolSizer(64, 5, 16, PAGE, 100 * MIB, None, "kv_cache_tokens=1008")
    assert no_probe.fit() == 64


def test_a_shrunk_pool_warns_once_per_size_and_says_why_and_what_to_turn(
    caplog: pytest.LogCaptureFixture,
) -> None:
    s = sizer(free_pages=41)
    with caplog.at_level(logging.WARNING, logger="ascent.rollout.fast.pool"):
        assert s.settle(s.fit()) == 40
        assert s.settle(s.fit()) == 40  # the same size again: no second line
    [line] = [r.getMessage() for r in caplog.records]
    assert "40 pages (624 tokens)" in line and "64 pages (1,008 tokens)" in line
    assert "rollout.gpu_memory_fraction" in line and "train.offload_optimizer" in line
    assert "rollout/kv_tokens" in line
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="ascent.rollout.fast.pool"):
        assert s.settle(30) == 30 and s.settle(64) == 64
    assert len(caplog.records) == 1  # a new size warns again; back to the asked size does not warn


def test_below_one_max_length_request_the_clear_error() -> None:
    s = sizer(free_pages=3, least=5)
    with pytest.raises(KVCacheOutOfMemory, match=r"rollout\.gpu_memory_fraction") as err:
        s.settle(s.fit())
    assert "needs 5 pages" in str(err.value) and "train.offload_optimizer" in str(err.value)
    assert is_user_error(err.value)
    assert sizer(free_pages=3, asked=3, least=5).settle(3) == 3  # asked below one request: not shrunk


def test_kv_pool_metric_is_the_smallest_replica() -> None:
    assert kv_pool_metrics([4096, 1024]) == {"rollout/kv_tokens": 1024.0}
    assert kv_pool_metrics([None]) == {}


def _run(engine: FastEngine) -> list[list[list[int]]]:
    reqs = [
        GenerationRequest(list(p), params, request_id=i) for i, p in enumerate(PROMPTS) for params in PARAMS
    ]
    return [[g.token_ids for g in r] for r in engine.generate(reqs)]


def test_an_engine_woken_with_less_free_memory_samples_the_same_tokens(fast_tiny_path) -> None:
    """8 rows x 4 pages of a 64-token context ask 33 pages; waking with room for 6 admits two or three
    sequences at a time (admission by free pages), and the seeded samples stay the same."""
    probe = Probe(2**40, 0)  # plenty free at build (margin and page size known once built)
    engine = build_fast_engine(
        model_path=fast_tiny_path,
        dtype="fp32",
        device="cpu",
        page_size=16,
        max_model_len=64,
        max_batch_size=8,
        free_memory=probe,
    )
    assert engine.pool is not None
    probe.margin, probe.page_bytes = engine.pool.margin, engine.pool.page_bytes
    assert engine.cache.num_pages == engine.alloc.num_pages == 33
    start = engine.stats["steps"]
    before = _run(engine)
    full_steps, start = engine.stats["steps"] - start, engine.stats["steps"]
    engine.sleep()
    probe.pages = 6
    engine.wake()
    assert engine.cache.num_pages == engine.alloc.num_pages == 6 and engine.kv_cache_tokens == 5 * 16
    assert engine.cache.tensors()[0].shape[1] == 6
    assert _run(engine) == before
    assert engine.stats["steps"] - start > 2 * full_steps  # the sequences queued for pages, a few at a time
    engine.sleep()
    probe.pages = 3  # less than one 64-token request: the clear error, and the engine stays asleep
    with pytest.raises(KVCacheOutOfMemory, match="max_model_len request needs 5 pages"):
        engine.wake()
    assert engine.asleep and engine.cache.nbytes == 0
    probe.pages = 1000
    engine.wake()  # room again: back to the asked size
    assert engine.cache.num_pages == engine.alloc.num_pages == 33
    assert _run(engine) == before
