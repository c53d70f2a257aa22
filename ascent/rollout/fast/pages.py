"""Host bookkeeping of KV-cache pages: a ref-counted allocator with reservations, and finished sessions.

Pure Python (no torch), so the CPU tests check it exhaustively.

- `PageAllocator`: page 0 is the trash page and never handed out. A sequence admitted to decoding first
  *reserves* the pages its worst case needs (prompt plus max_new_tokens), then takes them one by one as it
  grows; so a running sequence never fails to get a page and no preemption is needed. Pages are
  ref-counted because the n samples of a prompt share the prompt's full pages.
- `SessionStore`: KV pages of finished multi-turn sequences, kept so that the next turn of the conversation
  prefills only its new tokens; one session id may hold several conversations (the HTTP server's). Its
  memory is the cache's free pages: when a request needs pages, cached sequences are evicted least recently
  cached first, those of sessions that queued requests continue last (an episode that ended is never asked
  for again, so its pages go first). A weight update or sleep drops them all.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Container, Iterable, Sequence
from dataclasses import dataclass
from typing import Any


class PageAllocator:
    """Pages 1..num_pages-1 with reference counts and a reservation counter."""

    def __init__(self, num_pages: int):
        if num_pages < 2:
            raise ValueError(f"num_pages={num_pages}: need at least 2 (page 0 is the trash page).")
        self.num_pages = num_pages
        self.reset()

    def resize(self, num_pages: int) -> None:
        """A pool of `num_pages` pages, all free (the engine's wake with another KV cache size: pool.py)."""
        if num_pages < 2:
            raise ValueError(f"num_pages={num_pages}: need at least 2 (page 0 is the trash page).")
        self.num_pages = num_pages
        self.reset()

    def reset(self) -> None:
        """Forget everything: all pages free, nothing reserved."""
        self.refs = [0] * self.num_pages
        self.free_pages = list(range(self.num_pages - 1, 0, -1))
        self.reserved = 0

    @property
    def available(self) -> int:
        """Pages neither taken nor promised."""
        return len(self.free_pages) - self.reserved

    def reserve(self, n: int) -> bool:
        """Promise n future `take`s; False (and nothing reserved) if that many are not available."""
        if n > self.available:
            return False
        self.reserved += n
        return True

    def unreserve(self, n: int) -> None:
        """Give back n promised pages that will not be taken."""
        if n > self.reserved:
            raise RuntimeError(f"unreserve({n}) with only {self.reserved} reserved")
        self.reserved -= n

    def take(self, reserved: bool = True) -> int:
        """A free page with one reference; `reserved=True` uses up one reservation."""
        if reserved:
            if self.reserved <= 0:
                raise RuntimeError("take(reserved=True) without a reservation")
            self.reserved -= 1
        elif self.available <= 0:
            raise RuntimeError("no unreserved free page left")
        page = self.free_pages.pop()
        self.refs[page] = 1
        return page

    def share(self, page: int) -> None:
        """One more reference to a taken page."""
        assert self.refs[page] > 0, page
        self.refs[page] += 1

    def release(self, page: int) -> None:
        """Drop one reference; the page is free again at zero."""
        assert self.refs[page] > 0, page
        self.refs[page] -= 1
        if self.refs[page] == 0:
            self.free_pages.append(page)

    def release_all(self, pages: list[int]) -> None:
        for p in pages:
            self.release(p)


@dataclass(eq=False)  # compared by identity: the store finds an entry among its session's others
class CachedSequence:
    """A finished sequence's cache: `tokens[i]` has its K/V in slot i of the pages in `pages`."""

    tokens: list[int]
    pages: list[int]
    images: tuple[tuple[int, int, Any], ...] = ()  # (start, end, image key) of each image-token run
    routes: Any = None  # MoE: the experts of `tokens` [len(tokens), layers, k] (host), as their turn chose


def image_fence(n: int, spans: Sequence[tuple[int, int, Any]], cached: Sequence[tuple[int, int, Any]]) -> int:
    """A reusable prefix length `n` cut back to the start of the first image run (start, end, image key),
    of the prompt's `spans` or the cached entry's `cached`, that it would split or that the other lacks."""
    cuts = [s[0] for s in set(spans) ^ set(cached)] + [s[0] for s in spans if s[1] > n]
    return min([n, *cuts])


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of two token lists."""
    n = min(len(a), len(b))
    i, step = 0, 64
    while i + step <= n and a[i : i + step] == b[i : i + step]:  # whole chunks at C speed (a system prompt)
        i += step
    while i < n and a[i] == b[i]:
        i += 1
    return i


class SessionStore:
    """session_id -> cached sequences of its last turns, the least recently cached evicted first.

    A session id may hold several conversations at once (the HTTP server's requests of one session, or
    clients that share one): a request takes the entry its prompt continues and leaves the others cached.
    """

    def __init__(self, allocator: PageAllocator):
        self.alloc = allocator
        self.entries: dict[str, list[CachedSequence]] = {}  # by session, oldest first
        self._order: OrderedDict[int, tuple[str, CachedSequence]] = OrderedDict()  # by id, oldest first

    def __len__(self) -> int:
        return len(self.entries)

    def put(self, session_id: str, seq: CachedSequence) -> None:
        """Keep `seq` (its page references move to the store)."""
        self.entries.setdefault(session_id, []).append(seq)
        self._order[id(seq)] = (session_id, seq)

    def take(
        self, session_id: str | None, prompt: list[int], images: Sequence[tuple[int, int, Any]] = ()
    ) -> tuple[CachedSequence, int] | None:
        """Pop the session's entry sharing the longest prefix with `prompt` -> (entry, usable prefix length).

        The usable prefix leaves at least one prompt token to prefill (its logits start the reply). The
        session's other entries stay cached, in their place for eviction; None when nothing useful is cached.
        `images`: the prompt's image runs (start, end, image key), see `image_fence`.
        """
        found = self.peek(session_id, prompt, images)
        if found is None:
            return None
        assert session_id is not None  # peek finds entries only under a session id
        self._remove(session_id, found[0])
        return found

    def peek(
        self, session_id: str | None, prompt: list[int], images: Sequence[tuple[int, int, Any]] = ()
    ) -> tuple[CachedSequence, int] | None:
        """What `take` would return, leaving the store as it is."""
        if session_id is None or session_id not in self.entries:
            return None
        best, best_len = None, 0
        for c in self.entries[session_id]:
            n = min(common_prefix(c.tokens, prompt), len(prompt) - 1)
            if images or c.images:
                n = image_fence(n, images, c.images)
            if n > best_len:
                best, best_len = c, n
        return None if best is None else (best, best_len)

    def evict_one(self, spare: Container[str] = (), strict: bool = False) -> bool:
        """Free the least recently cached entry's pages, those of sessions in `spare` (wanted by queued
        requests) last (`strict`: never); False when nothing was evicted."""
        if not self._order:
            return False
        victims = (v for v in self._order.values() if v[0] not in spare)
        found = next(victims, None)
        if found is None and strict:
            return False
        session_id, victim = found or next(iter(self._order.values()))
        self._remove(session_id, victim)
        self.alloc.release_all(victim.pages)
        return True

    def clear(self) -> None:
        while self.evict_one():
            pass

    def _remove(self, session_id: str, seq: CachedSequence) -> None:
        del self._order[id(seq)]
        left = [c for c in self.entries[session_id] if c is not seq]
        if left:
            self.entries[session_id] = left
        else:
            del self.entries[session_id]


def unzip_pairs(pairs: Iterable[tuple[int, int]]) -> tuple[list[int], list[int]]:
    """(src, dst) page pairs -> ([src...], [dst...]), the form `KVCache.copy_pages` takes."""
    pairs = list(pairs)
    return [a for a, _ in pairs], [b for _, b in pairs]
