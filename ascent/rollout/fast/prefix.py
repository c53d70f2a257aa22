"""Prefix caching across requests: full KV pages found again by the tokens up to their end (pure Python).

Prompts of different requests that share a prefix (a system prompt, few-shot examples) reuse the K/V pages
of that prefix instead of prefilling it again, page by page, as vLLM's automatic prefix caching does. A
cached page is a node of a trie keyed exactly (no hash collisions): `(parent page, the page's tokens)`,
the root's parent being page 0 (the trash page, never cached). The K/V of a page depends only on the tokens
up to its end (and on the weights), so any prompt that walks the same path from the root may read it.

Memory: the cache holds one reference on each of its pages (pages.py `PageAllocator`); a running sequence
that reuses a page holds another. A page only the cache references is free to evict: under memory
pressure the least recently used such page is released, leaves first (a page whose children are cached
stays, so a child's key never names a page id that was handed out again). A publication, `sleep` or an
in-place step of shared weights clears it (cached K/V belongs to the weights that computed it).

Pages registered by an admission whose prefill has not run yet are *pending*: a lookup stops at them and
says so, and the scheduler admits that request after the prefill instead (scheduler.py), so a prefix that
many queued prompts share is prefilled once. Prompts with images are neither looked up nor registered (the
K/V of an image's tokens depends on the image, not on the token ids).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from ascent.rollout.fast.pages import PageAllocator

Key = tuple[int, tuple[int, ...]]  # (parent page, the page's tokens)


class PrefixCache:
    """Full KV pages by their token path from the start of the prompt, with LRU eviction of unused ones."""

    def __init__(self, alloc: PageAllocator, page_size: int):
        self.alloc, self.ps = alloc, page_size
        self.reset()

    def __len__(self) -> int:
        return len(self._key_of)

    def reset(self) -> None:
        """Forget every page without releasing it (after `PageAllocator.reset`)."""
        self._page_of: dict[Key, int] = {}
        self._key_of: dict[int, Key] = {}
        self._children: dict[int, int] = {}  # page -> how many cached pages continue it
        self._lru: OrderedDict[int, None] = OrderedDict()  # pages, least recently used first
        self.pending: set[int] = set()
        self.evicted = getattr(self, "evicted", 0)  # pages released under memory pressure, ever

    def _chunks(self, tokens: Sequence[int], pages: int) -> list[tuple[int, ...]]:
        ps = self.ps
        return [tuple(tokens[i * ps : (i + 1) * ps]) for i in range(pages)]

    def lookup(self, tokens: Sequence[int]) -> tuple[list[int], bool]:
        """The cached pages of the longest run of full pages of `tokens` that leaves at least one token to
        prefill -> (pages, whether the next page is cached but pending). Holds no reference."""
        found: list[int] = []
        parent = 0
        for chunk in self._chunks(tokens, (len(tokens) - 1) // self.ps):
            page = self._page_of.get((parent, chunk))
            if page is None:
                return found, False
            if page in self.pending:
                return found, True
            found.append(page)
            parent = page
        return found, False

    def acquire(self, pages: list[int]) -> None:
        """Take one reference on each of `pages` for a sequence and mark them used now (the first page
        most recently, so the chain is evicted from its end)."""
        for page in reversed(pages):
            self.alloc.share(page)
            self._lru.move_to_end(page)

    def register(self, tokens: Sequence[int], pages: list[int], computed: int) -> None:
        """Cache the full pages of a prompt `tokens` held in `pages` (its block table); those from page
        index `computed` on are pending until `ready()` (their prefill has not run). A page whose path is
        cached already (the same tokens in another page) is skipped and the path goes on through that one."""
        parent = 0
        for i, chunk in enumerate(self._chunks(tokens, len(tokens) // self.ps)):
            key = (parent, chunk)
            known = self._page_of.get(key)
            if known is None:
                page = pages[i]
                if page in self._key_of:  # (the page holds another path: not possible for a full page)
                    return
                self.alloc.share(page)
                self._page_of[key], self._key_of[page] = page, key
                self._children[parent] = self._children.get(parent, 0) + 1
                self._lru[page] = None
                if i >= computed:
                    self.pending.add(page)
                known = page
            parent = known

    def ready(self) -> None:
        """The pending pages' prefill has run: lookups may return them."""
        self.pending.clear()

    def evict_one(self) -> bool:
        """Release the least recently used page that only the cache holds and that no cached page
        continues; False when there is none."""
        refs = self.alloc.refs
        for page in self._lru:
            if refs[page] == 1 and not self._children.get(page) and page not in self.pending:
                self._drop(page)
                self.alloc.release(page)
                self.evicted += 1
                return True
        return False

    def clear(self) -> None:
        """Release every cached page (a publication: the cached K/V belongs to the old weights)."""
        for page in list(self._key_of):
            self.alloc.release(page)
        self.reset()

    def _drop(self, page: int) -> None:
        key = self._key_of.pop(page)
        del self._page_of[key], self._lru[page]
        parent = key[0]
        self._children[parent] -= 1
        if not self._children[parent]:
            del self._children[parent]
