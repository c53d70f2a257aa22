"""Page allocator, session store and scheduler bookkeeping of the fast engine (pure Python)."""

from __future__ import annotations

import random

import pytest

from ascent.messages import SamplingParams
from ascent.rollout.fast.pages import CachedSequence, PageAllocator, SessionStore, common_prefix, image_fence
from ascent.rollout.fast.scheduler import Scheduler, cdiv
from ascent.rollout.fast.sequence import Sequence


def test_allocator_reserve_take_share_release():
    a = PageAllocator(5)  # pages 1..4
    assert a.available == 4 and a.reserve(3) and not a.reserve(2)
    p = a.take()
    a.share(p)
    a.release(p)
    assert a.refs[p] == 1 and a.available == 1
    a.release(p)
    assert a.available == 2 and a.reserved == 2
    a.unreserve(2)
    assert a.available == 4 and 0 not in [a.take(reserved=False) for _ in range(4)]
    with pytest.raises(RuntimeError):
        a.take(reserved=False)


def test_session_store_takes_longest_prefix_and_evicts_lru():
    a = PageAllocator(10)
    store = SessionStore(a)
    pages = [a.take(reserved=False) for _ in range(3)]
    store.put("x", CachedSequence([1, 2, 3, 4], pages[:1]))
    store.put("x", CachedSequence([1, 2, 9, 9, 9], pages[1:2]))
    store.put("y", CachedSequence([5], pages[2:]))
    entry, m = store.take("x", [1, 2, 9, 9, 9, 7])
    assert entry.pages == pages[1:2] and m == 5 and a.refs[pages[0]] == 1  # the other one stays cached
    assert store.take("x", [1]) is None and common_prefix([1, 2], [1, 3]) == 1
    assert common_prefix(list(range(200)), [*range(150), 7]) == 150
    assert store.evict_one(spare={"x"}) and a.refs[pages[2]] == 0  # "y" first, although more recent
    assert list(store.entries) == ["x"] and store.evict_one() and a.refs[pages[0]] == 0
    assert not store.evict_one() and len(store) == 0


def test_a_cached_prefix_is_reused_only_up_to_an_image_it_does_not_hold():
    """Image tokens are alike whatever the image: reuse stops at the first image run that differs or that
    the prefix would split."""
    a, b, c = (2, 5, "A"), (8, 10, "B"), (8, 10, "C")
    assert image_fence(12, [a, b], [a, b]) == 12  # same images: the whole prefix
    assert image_fence(12, [a, c], [a, b]) == 8  # another image in the second run
    assert image_fence(9, [a, b], [a]) == 8  # the prefix ends inside the second run
    assert image_fence(12, [], [a]) == 2  # the entry showed an image where the prompt shows none
    store = SessionStore(PageAllocator(4))
    store.put("s", CachedSequence(list(range(12)), [1], images=(a, b)))
    assert store.peek("s", list(range(14)), [a, c]) is not None
    assert store.take("s", list(range(14)), [a, c])[1] == 8


def test_session_store_keeps_every_conversation_of_a_shared_session():
    """Conversations interleaved under one session id each continue their own cache; eviction takes the
    least recently cached entry, not the whole session."""
    a = PageAllocator(10)
    store = SessionStore(a)
    p = [a.take(reserved=False) for _ in range(4)]
    store.put("s", CachedSequence([1, 1, 1], p[:1]))  # conversation A, turn 1
    store.put("s", CachedSequence([2, 2, 2], p[1:2]))  # conversation B, turn 1
    entry, m = store.take("s", [1, 1, 1, 5])  # A, turn 2: B stays
    assert entry.pages == p[:1] and m == 3 and [c.tokens for c in store.entries["s"]] == [[2, 2, 2]]
    store.put("s", CachedSequence([1, 1, 1, 5, 6], p[:1] + p[2:3]))  # A's turn 2 done
    store.put("t", CachedSequence([3], p[3:]))
    entry, m = store.take("s", [2, 2, 2, 7])  # B, turn 2: A's latest turn stays
    assert entry.pages == p[1:2] and m == 3
    assert store.take("s", [1, 1, 1, 5, 6, 8])[1] == 5  # type: ignore[index]
    store.put("s", entry)
    assert store.evict_one() and a.refs[p[3]] == 0 and list(store.entries) == ["s"]  # "t" was cached first


def _group(prompt, n, max_new, session=None):
    params = SamplingParams(max_new_tokens=max_new, n=n)
    return [Sequence(0, i, list(prompt), params, i, max_new, frozenset(), session) for i in range(n)]


def _grow(sched, seq, tokens):
    """Simulate decode: write `tokens` more positions (taking pages as needed)."""
    for _ in range(tokens):
        sched.ensure_page(seq)
        seq.num_cached += 1


@pytest.mark.parametrize("plen,n,max_new,ps", [(5, 3, 9, 4), (8, 2, 1, 4), (16, 4, 17, 16), (1, 1, 5, 2)])
def test_scheduler_reserves_worst_case_and_returns_everything(plen, n, max_new, ps):
    a = PageAllocator(200)
    sched = Scheduler(a, SessionStore(a), ps)
    sched.add(_group(range(plen), n, max_new))
    (adm,) = sched.admit(free_rows=n, token_budget=10_000)
    copies = sched.fork(adm)
    assert len(copies) == (n - 1 if plen % ps else 0)
    for s in adm.seqs:
        assert len(s.pages) == cdiv(plen, ps) and s.num_cached == plen
        _grow(sched, s, max_new - 1)  # the last sampled token is never written
        assert s.reserved == 0 and len(s.pages) == cdiv(plen + max_new - 1, ps)
    full = plen // ps
    assert all(a.refs[p] == n for p in adm.pages[:full])
    for s in adm.seqs:
        s.finish = "length"
        sched.finish(s)
    assert a.available == 199 and a.reserved == 0


def test_scheduler_blocks_when_pages_run_out_and_evicts_sessions():
    a = PageAllocator(7)  # 6 usable pages of 4 tokens
    sched = Scheduler(a, SessionStore(a), 4)
    sched.add(_group(range(8), 1, 9, session="s"))  # needs cdiv(16, 4) = 4 pages
    sched.add(_group(range(8), 1, 9))
    (adm,) = sched.admit(free_rows=8, token_budget=10_000)
    assert sched.admit(free_rows=8, token_budget=10_000) == [] and len(sched.waiting) == 1
    (s,) = adm.seqs
    sched.fork(adm)
    _grow(sched, s, 8)
    s.tokens, s.finish = list(range(100, 109)), "length"
    sched.finish(s)  # kept for the session: 16 cached tokens in 4 pages
    assert len(sched.sessions) == 1 and a.available == 2
    assert len(sched.admit(free_rows=8, token_budget=10_000)) == 1 and len(sched.sessions) == 0


def _cache_session(sched, session, prompt, new_tokens):
    """Run one request of `session` to its end and keep its cache -> its sequence."""
    sched.add(_group(prompt, 1, new_tokens + 1, session=session))
    (adm,) = sched.admit(free_rows=8, token_budget=10_000)
    (s,) = adm.seqs
    sched.fork(adm)
    _grow(sched, s, new_tokens)
    s.tokens, s.finish = list(range(100, 100 + new_tokens + 1)), "length"
    sched.finish(s)
    return s


def test_eviction_spares_sessions_that_queued_requests_continue():
    """An ended episode's session goes before an older one whose next turn waits in the queue."""
    a = PageAllocator(9)  # 8 usable pages of 4 tokens
    sched = Scheduler(a, SessionStore(a), 4)
    waited = _cache_session(sched, "waited", list(range(8)), 4)  # 12 tokens in 3 pages (least recent)
    _cache_session(sched, "ended", list(range(20, 28)), 4)  # 3 pages
    assert list(sched.sessions.entries) == ["waited", "ended"] and a.available == 2
    sched.add(_group(range(40, 49), 1, 1))  # a new conversation: 3 pages, one more than are free
    turn2 = waited.prompt + waited.tokens[:4] + [7, 7]
    sched.add(_group(turn2, 1, 2, session="waited"))  # the next turn of "waited", queued behind it
    (adm,) = sched.admit(free_rows=1, token_budget=10_000)
    assert list(sched.sessions.entries) == ["waited"]  # "ended" made room although it is more recent
    (adm2,) = sched.admit(free_rows=1, token_budget=10_000)
    assert adm2.reuse == 12 and adm2.seqs[0].cached == 12


def test_scheduler_reuses_session_prefix_with_copy_on_write():
    a = PageAllocator(50)
    sched = Scheduler(a, SessionStore(a), 4)
    sched.add(_group(range(6), 2, 5, session="s"))
    (adm,) = sched.admit(free_rows=4, token_budget=10_000)
    sched.fork(adm)
    s0, s1 = adm.seqs
    for s in adm.seqs:
        _grow(sched, s, 4)
        s.tokens, s.finish = [50, 51, 52, 53, 54], "length"
    shared = s0.pages[0]  # prompt page, still shared with s1 after s0 finishes
    sched.finish(s0)
    turn2 = list(range(3)) + [99, 98]  # diverges inside the first (shared) page
    sched.add(_group(turn2, 1, 3, session="s"))
    (adm2,) = sched.admit(free_rows=4, token_budget=10_000)
    assert adm2.reuse == 3 and adm2.copies and adm2.copies[0][0] == shared and adm2.pages[0] != shared
    sched.finish(s1)
    (t,) = adm2.seqs
    sched.fork(adm2)
    _grow(sched, t, 2)
    t.finish = "stop"
    sched.finish(t)  # keeps its own pages in the store
    sched.sessions.clear()
    assert a.available == 49 and a.reserved == 0


def test_scheduler_random_churn_never_leaks():
    rng = random.Random(0)
    a = PageAllocator(300)
    sched = Scheduler(a, SessionStore(a), 8)
    live = []
    for _ in range(300):
        if rng.random() < 0.3:
            sid = rng.choice([None, "a", "b"])
            sched.add(
                _group(
                    [rng.randrange(5) for _ in range(rng.randint(1, 30))],
                    rng.randint(1, 3),
                    rng.randint(1, 40),
                    sid,
                )
            )
        for adm in sched.admit(free_rows=16 - len(live), token_budget=64):
            sched.fork(adm)
            live += adm.seqs
        for s in list(live):
            if s.num_cached - len(s.prompt) < s.max_new - 1 and rng.random() < 0.9:
                _grow(sched, s, 1)
            else:
                s.tokens, s.finish = [1] * (s.num_cached - len(s.prompt) + 1), "stop"
                sched.finish(s)
                live.remove(s)
    for s in live:
        s.finish = "abort"
        sched.finish(s)
    sched.sessions.clear()
    assert a.available == 299 and a.reserved == 0 and sum(a.refs) == 0
