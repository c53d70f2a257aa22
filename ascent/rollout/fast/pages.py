"""Host bookkeeping of KV-cache pages: a ref-counted allocator with reservations, and finished sessions.

Pure Python (no torch), so the CPU tests check it exhaustively.

- `PageAllocator`: page 0 is the trash page and never handed out. A sequence admitted to decoding first
  *reserves* the pages its worst case needs (prompt plus max_new_tokens), then takes them one by one as it
  grows; so a running sequence never fails to get a page and no preemption is needed. Pages are
  ref-counted because the n samples of a prompt share the prompt's full pages.
- `SessionStore`: KV pages of finished multi-turn sequences, kept so that the next turn of the conversation
  prefills only its new tokens. Its memory is the cache's free pages: when a request needs pages, sessions
  are evicted least recently used first, those that queued requests continue last (an episode that ended is
  never asked for again, so its pages go first). A weight update or sleep drops them all.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Container
from dataclasses import dataclass


class PageAllocator:
    """Pages 1..num_pages-1 with reference counts and a reservation counter."""

    def __init__(self, num_pages: int):
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


@dataclass
class CachedSequence:
    """A finished sequence's cache: `tokens[i]` has its K/V in slot i of the pages in `pages`."""

    tokens: list[int]
    pages: list[int]


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of two token lists."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class SessionStore:
    """session_id -> cached sequences of its last turn, least recently used evicted first."""

    def __init__(self, allocator: PageAllocator):
        self.alloc = allocator
        self.entries: OrderedDict[str, list[CachedSequence]] = OrderedDict()

    def __len__(self) -> int:
        return len(self.entries)

    def put(self, session_id: str, seq: CachedSequence) -> None:
        """Keep `seq` (its page references move to the store)."""
        self.entries.setdefault(session_id, []).append(seq)
        self.entries.move_to_end(session_id)

    def take(self, session_id: str | None, prompt: list[int]) -> tuple[CachedSequence, int] | None:
        """Pop the session's entry sharing the longest prefix with `prompt` -> (entry, usable prefix length).

        The usable prefix leaves at least one prompt token to prefill (its logits start the reply). The
        session's other entries are released; None when nothing useful is cached.
        """
        if session_id is None or session_id not in self.entries:
            return None
        cands = self.entries.pop(session_id)
        best, best_len = None, 0
        for c in cands:
            n = min(common_prefix(c.tokens, prompt), len(prompt) - 1)
            if n > best_len:
                best, best_len = c, n
        for c in cands:
            if c is not best:
                self.alloc.release_all(c.pages)
        return (best, best_len) if best is not None else None

    def evict_one(self, spare: Container[str] = ()) -> bool:
        """Free the least recently used session's pages, sessions in `spare` (wanted by queued requests)
        last; False when the store is empty."""
        if not self.entries:
            return False
        victim = next((sid for sid in self.entries if sid not in spare), next(iter(self.entries)))
        cands = self.entries.pop(victim)
        for c in cands:
            self.alloc.release_all(c.pages)
        return True

    def clear(self) -> None:
        while self.evict_one():
            pass
