"""Prefix caching across requests (prefix.py) and the batch-invariant mode (runner.py), on CPU."""

from __future__ import annotations

import pytest
import torch

from ascent.messages import GenerationRequest, SamplingParams
from ascent.rollout.fast import build_fast_engine
from ascent.rollout.fast.pages import PageAllocator
from ascent.rollout.fast.prefix import PrefixCache

from .conftest import HEAD_SCALE

SYSTEM = list(range(4, 44))  # 40 tokens: two full pages of 16 are shared


def _engine(path, scale=HEAD_SCALE, **kw):
    kw.setdefault("max_model_len", 96)
    fast = build_fast_engine(model_path=path, dtype="fp32", device="cpu", page_size=16, **kw)
    head = fast.weights.lm_head.detach().clone() * scale
    fast.update_weights([("lm_head.weight", head)])
    return fast


def _requests(tails, system=SYSTEM, **params):
    params = {"temperature": 0.0, "max_new_tokens": 6} | params
    return [
        GenerationRequest(system + t, SamplingParams(**params), request_id=i) for i, t in enumerate(tails)
    ]


def _tails(k, seed=0, length=10):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(50, 88, (length,), generator=g).tolist() for _ in range(k)]


def _flat(out):
    return [(g.token_ids, g.logprobs) for req in out for g in req]


def test_trie_pending_lookup_and_leaf_first_eviction():
    alloc = PageAllocator(8)
    cache = PrefixCache(alloc, page_size=2)
    pages = [alloc.take(reserved=False) for _ in range(3)]
    cache.register([1, 2, 3, 4, 5, 6, 7], pages, computed=1)  # pages 2 and 3 still pending
    assert cache.lookup([1, 2, 3, 4, 5, 6, 9]) == (pages[:1], True)
    cache.ready()
    assert cache.lookup([1, 2, 3, 4, 5, 6, 9]) == (pages, False)
    assert cache.lookup([1, 2, 3, 4, 5, 6]) == (pages[:2], False)  # one token is left to prefill
    assert cache.lookup([1, 9, 3, 4, 5]) == ([], False)  # same later tokens, another path: no hit
    assert not cache.evict_one()  # the sequence still holds every page
    alloc.release_all(pages)
    assert cache.evict_one() and cache.lookup([1, 2, 3, 4, 5, 6, 9]) == (pages[:2], False)  # the leaf
    cache.clear()
    assert len(cache) == 0 and alloc.available == 7  # every reference given back


def test_shared_prefix_prefilled_once_same_tokens_and_logprobs(fast_tiny_path):
    plain = _engine(fast_tiny_path)
    cached = _engine(fast_tiny_path, prefix_caching=True)
    reqs = _requests(_tails(4)) + [
        GenerationRequest(list(range(60, 75)), SamplingParams(temperature=0.0, max_new_tokens=4))
    ]
    want, got = plain.generate(reqs), cached.generate(reqs)
    assert [g.token_ids for r in got for g in r] == [g.token_ids for r in want for g in r]
    for (_, a), (_, b) in zip(_flat(got), _flat(want), strict=True):
        assert a == pytest.approx(b, abs=1e-4)
    # the first prompt is prefilled whole; the others wait one pass and reuse its two full pages
    assert cached.stats["prefix_hit_tokens"] == 3 * 32 == cached.stats["reused_tokens"]
    assert cached.stats["prefill_tokens"] == plain.stats["prefill_tokens"] - 3 * 32
    assert cached.stats["prompt_tokens"] == plain.stats["prompt_tokens"] == 4 * 50 + 15
    # a later call reuses the pages too, while the weights stay the same
    again = cached.generate(_requests(_tails(1, seed=5)))
    assert cached.stats["prefix_hit_tokens"] == 4 * 32 and again[0][0].cached_tokens == 32


def test_requests_fed_into_a_running_call_reuse_the_prefix(fast_tiny_path):
    """generate_live (the HTTP server's path): requests that arrive between decode steps, fed through the
    decode steps or prefilled, compute only what follows the cached system prompt."""
    plain = _engine(fast_tiny_path, max_batch_size=4)
    cached = _engine(fast_tiny_path, max_batch_size=4, prefix_caching=True)
    reqs = _requests(_tails(4, seed=2), max_new_tokens=10)
    queued, answers, polls = list(reqs[1:]), {}, [0]

    def more(fits):
        polls[0] += 1
        if polls[0] < 3:  # the first request is decoding by then
            return []
        take = [r for r in queued if fits(r)]
        queued.clear()
        return take

    cached.generate_live(reqs[:1], more, lambda i, samples: answers.__setitem__(i, samples))
    assert [answers[i][0].token_ids for i in range(4)] == [r[0].token_ids for r in plain.generate(reqs)]
    # one joins fed (no more join than run), the others are prefilled: all three after the cached prefix
    assert cached.stats["fed_tokens"] == 50 - 32 and cached.stats["prefix_hit_tokens"] == 3 * 32
    assert cached.alloc.reserved == 0


def test_a_publication_drops_every_cached_page(fast_tiny_path):
    plain = _engine(fast_tiny_path)
    cached = _engine(fast_tiny_path, prefix_caching=True)
    cached.generate(_requests(_tails(2)))
    assert len(cached.prefix) > 0
    for e in (plain, cached):  # new weights: the cached K/V is stale
        e.update_weights([("lm_head.weight", e.weights.lm_head.detach().clone() * 0.5)])
    assert len(cached.prefix) == 0
    hits = cached.stats["prefix_hit_tokens"]
    reqs = _requests(_tails(1, seed=3))
    assert [g.token_ids for g in cached.generate(reqs)[0]] == [g.token_ids for g in plain.generate(reqs)[0]]
    assert cached.stats["prefix_hit_tokens"] == hits
    cached.sleep()
    assert len(cached.prefix) == 0
    cached.wake()


def test_eviction_under_memory_pressure_keeps_results(fast_tiny_path):
    """A cache of 8 pages: every call's prefix pages must be evicted for the next distinct prefixes;
    sessions share the pages with the prefix cache and their turns still continue correctly."""
    plain = _engine(fast_tiny_path, max_batch_size=2)
    cached = _engine(fast_tiny_path, max_batch_size=2, prefix_caching=True, kv_cache_tokens=8 * 16)
    for seed in range(4):
        system = _tails(1, seed=10 + seed, length=36)[0]
        reqs = _requests(_tails(2, seed=seed), system=system)
        reqs[0] = GenerationRequest(reqs[0].prompt_ids, reqs[0].params, session_id=f"s{seed}")
        want, got = plain.generate(reqs), cached.generate(reqs)
        assert [g.token_ids for r in got for g in r] == [g.token_ids for r in want for g in r]
        turn2 = GenerationRequest(
            reqs[0].prompt_ids + got[0][0].token_ids + [7, 8], reqs[0].params, session_id=f"s{seed}"
        )
        assert cached.generate([turn2])[0][0].token_ids == plain.generate([turn2])[0][0].token_ids
    assert cached.prefix.evicted > 0 and cached.stats["prefix_hit_tokens"] > 0
    assert cached.alloc.reserved == 0


def test_batch_invariant_request_alone_equals_batched(fast_tiny_path):
    """Seeded sampling: a request's tokens and logprobs are bitwise those it gets alone, whatever shares
    its prefill and decode steps (prompts of other lengths, other sample counts, rows joining later)."""
    engine = _engine(fast_tiny_path, scale=3.0, batch_invariant=True, max_batch_size=4)
    g = torch.Generator().manual_seed(1)
    reqs = [
        GenerationRequest(
            torch.randint(4, 88, (length,), generator=g).tolist(),
            SamplingParams(temperature=1.0, max_new_tokens=m, n=n, seed=7 + i),
            request_id=i,
        )
        for i, (length, m, n) in enumerate([(9, 8, 1), (23, 5, 2), (4, 10, 1), (31, 6, 2)])
    ]
    together = engine.generate(reqs)
    for i, req in enumerate(reqs):
        alone = engine.generate([req])[0]
        assert [(g.token_ids, g.logprobs) for g in alone] == [(g.token_ids, g.logprobs) for g in together[i]]


def test_batch_invariant_refuses_prefix_caching(fast_tiny_path):
    with pytest.raises(ValueError, match="prefix_caching=True with batch_invariant=True"):
        _engine(fast_tiny_path, prefix_caching=True, batch_invariant=True)
