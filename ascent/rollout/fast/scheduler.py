"""Admission of requests into the decode batch (pure Python, CPU-testable).

A request with n samples becomes one `Group` (or several, when n exceeds the decode rows). Admitting a
group reserves the worst-case pages of all its samples, reuses a cached session prefix when the prompt
continues one (or the prefix cache's pages of its longest cached full-page prefix, prefix.py), and takes
the pages of the prompt. Its prompt is prefilled once; afterwards `fork` gives each
sample its block table: the prompt's full pages are shared (ref-counted), the partial last page is copied.
`finish` returns a sequence's pages, or keeps them in the session store for the next turn.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from ascent.rollout.fast.pages import CachedSequence, PageAllocator, SessionStore
from ascent.rollout.fast.prefix import PrefixCache
from ascent.rollout.fast.sequence import Sequence


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass
class Admission:
    """A group cleared for prefill: `pages` hold the prompt (first `reuse` tokens already cached)."""

    seqs: list[Sequence]
    pages: list[int]
    reuse: int
    copies: list[tuple[int, int]] = field(default_factory=list)  # (src, dst) pages to copy before prefill
    hit: int = 0  # of the `reuse` tokens, those the prefix cache supplied (prefix.py)

    @property
    def prompt(self) -> list[int]:
        return self.seqs[0].prompt


class Scheduler:
    """FIFO queue of groups (lists of sibling Sequences) and the page bookkeeping around them."""

    def __init__(
        self,
        alloc: PageAllocator,
        sessions: SessionStore,
        page_size: int,
        keep_sessions: bool = True,
        prefix: PrefixCache | None = None,
    ):
        """`prefix`: the prefix cache across requests (prefix.py), None when off."""
        self.alloc, self.sessions, self.ps = alloc, sessions, page_size
        self.keep_sessions, self.prefix = keep_sessions, prefix
        self.deferred = False  # the last `admit` stopped at a group waiting for its prefix's prefill
        self.waiting: deque[list[Sequence]] = deque()
        self.waiting_rows = 0

    def add(self, group: list[Sequence]) -> None:
        self.waiting.append(group)
        self.waiting_rows += len(group)

    def growth_pages(self, p: int, m: int) -> tuple[int, int]:
        """Pages beyond the shared prompt for (sample 0, each other sample): P prompt, M new tokens."""
        full = cdiv(p + m - 1, self.ps)
        return full - cdiv(p, self.ps), full - p // self.ps

    def _reserve(self, need: int) -> bool:
        """Reserve `need` pages, evicting until they fit (cached sessions no queued request continues, then
        unused prefix-cache pages, then the other sessions; each least recently used first); False if they
        never do."""
        if self.alloc.reserve(need):
            return True
        wanted = {g[0].session_id for g in self.waiting if g[0].session_id is not None}
        while not self.alloc.reserve(need):
            if not (
                self.sessions.evict_one(spare=wanted, strict=True)
                or (self.prefix is not None and self.prefix.evict_one())
                or self.sessions.evict_one(spare=wanted)
            ):
                return False
        return True

    def _reuse(self, entry: CachedSequence | None, m: int) -> tuple[list[int], list[tuple[int, int]]]:
        """Pages of a cached prefix of m tokens -> (kept pages, [(shared boundary page, -1)] if it needs a
        copy)."""
        if entry is None or m == 0:
            if entry is not None:
                self.alloc.release_all(entry.pages)
            return [], []
        keep_n = cdiv(m, self.ps)
        kept, rest = entry.pages[:keep_n], entry.pages[keep_n:]
        self.alloc.release_all(rest)
        copies = []
        if m % self.ps and self.alloc.refs[kept[-1]] > 1:  # boundary page shared: copy on write
            copies.append((kept[-1], -1))
        return kept, copies

    def _prefix_hit(self, seq: Sequence) -> tuple[list[int], bool]:
        """Cached pages of the prompt's longest full-page prefix, and whether more wait for a prefill."""
        if self.prefix is None or seq.image_keys:  # an image's K/V is not a function of its token ids
            return [], False
        return self.prefix.lookup(seq.prompt)

    def try_admit(self, group: list[Sequence], register: bool = True) -> Admission | None:
        """Reserve and take pages for `group`; None (nothing held) if they do not fit now. The longer of a
        cached session prefix and a prefix-cache hit is reused; `register` puts the prompt's full pages in
        the prefix cache (pending until the prefill has run)."""
        s0 = group[0]
        p, m_new = len(s0.prompt), s0.max_new
        found = self.sessions.take(s0.session_id, s0.prompt, s0.image_keys)
        entry, m = found if found else (None, 0)
        hit, _ = self._prefix_hit(s0)
        if len(hit) * self.ps > m:  # the prefix cache reaches further: keep the session's entry cached
            if entry is not None:
                assert s0.session_id is not None  # take() only finds an entry for a session id
                self.sessions.put(s0.session_id, entry)
            assert self.prefix is not None  # (a hit comes from it)
            entry, m = None, len(hit) * self.ps
            self.prefix.acquire(hit)  # held before reserving, so eviction cannot take them
        else:
            hit = []
        g0, g_other = self.growth_pages(p, m_new)
        prompt_new = cdiv(p, self.ps) - cdiv(m, self.ps)
        kept_full = m // self.ps if entry else 0
        cow = 1 if (entry and m % self.ps and self.alloc.refs[entry.pages[cdiv(m, self.ps) - 1]] > 1) else 0
        need = prompt_new + cow + g0 + g_other * (len(group) - 1)
        if not self._reserve(need):
            if entry is not None:
                assert s0.session_id is not None  # take() only finds an entry for a session id
                self.sessions.put(s0.session_id, entry)
            self.alloc.release_all(hit)
            return None
        kept, copies = (hit, []) if hit else self._reuse(entry, m)
        if copies:
            src = copies[0][0]
            dst = self.alloc.take()
            self.alloc.release(src)
            kept[-1] = dst
            copies = [(src, dst)]
        pages = kept + [self.alloc.take() for _ in range(prompt_new)]
        assert len(pages) == cdiv(p, self.ps) and kept_full <= len(kept)
        routes = entry.routes[:m] if entry is not None and entry.routes is not None else None
        for i, s in enumerate(group):
            s.reserved, s.cached = (g0 if i == 0 else g_other), m
            s.routes = [routes] if routes is not None else None  # MoE: the prefix's, from its own turn
        if register and self.prefix is not None and not s0.image_keys:
            self.prefix.register(s0.prompt, pages, computed=m // self.ps)
        return Admission(seqs=group, pages=pages, reuse=m, copies=copies, hit=m if hit else 0)

    def new_tokens(self, seq: Sequence) -> int:
        """Prompt tokens of `seq` that admitting it now would compute (those after a cached session
        prefix or a prefix-cache hit)."""
        found = self.sessions.peek(seq.session_id, seq.prompt, seq.image_keys)
        hit, _ = self._prefix_hit(seq)
        return len(seq.prompt) - max(found[1] if found else 0, len(hit) * self.ps)

    def admit(
        self, free_rows: int, token_budget: int, accept: Callable[[list[Sequence]], bool] | None = None
    ) -> list[Admission]:
        """Admit waiting groups in order while rows, pages and the prefill token budget allow (and
        `accept(group)`, when given, holds). Groups admitted through `accept` are fed, not prefilled: they
        do not register their pages in the prefix cache. A group whose prompt continues pages an earlier
        group of this admission registers stops it, `deferred` set: admit it after their prefill."""
        out: list[Admission] = []
        longest = 0
        self.deferred = False
        while self.waiting:
            group = self.waiting[0]
            if len(group) > free_rows or (accept is not None and not accept(group)):
                break
            if out and self._prefix_hit(group[0])[1]:
                self.deferred = True
                break
            suffix = len(group[0].prompt)  # upper bound before the session lookup
            if out and (len(out) + 1) * max(longest, suffix) > token_budget:
                break
            adm = self.try_admit(group, register=accept is None)
            if adm is None:
                break
            self.waiting.popleft()
            self.waiting_rows -= len(group)
            out.append(adm)
            free_rows -= len(group)
            longest = max(longest, len(adm.prompt) - adm.reuse)
        return out

    def fork(self, adm: Admission) -> list[tuple[int, int]]:
        """Give each sample its pages after the prompt's prefill -> page copies (src, dst) to make."""
        p = len(adm.prompt)
        full = p // self.ps
        copies = []
        for i, s in enumerate(adm.seqs):
            s.num_cached = p
            if i == 0:
                s.pages = list(adm.pages)
                continue
            for page in adm.pages[:full]:
                self.alloc.share(page)
            s.pages = adm.pages[:full]
            if p % self.ps:
                dst = self.take_page(s)
                copies.append((adm.pages[-1], dst))
                s.pages.append(dst)
        return copies

    def take_page(self, seq: Sequence) -> int:
        """One page from the sequence's own reservation."""
        seq.reserved -= 1
        if seq.reserved < 0:
            raise RuntimeError("sequence outgrew its page reservation")
        return self.alloc.take()

    def ensure_page(self, seq: Sequence) -> int | None:
        """Before a decode step writes position num_cached: a new page if it starts one, else None."""
        if seq.num_cached // self.ps < len(seq.pages):
            return None
        page = self.take_page(seq)
        seq.pages.append(page)
        return page

    def finish(self, seq: Sequence, keep: bool = True) -> None:
        """Return a finished sequence's reservation and pages, or keep its cache for the session (unless
        `keep=False`: its K/V came partly from older weights)."""
        self.alloc.unreserve(seq.reserved)
        seq.reserved = 0
        if keep and self.keep_sessions and seq.session_id is not None and seq.finish != "abort":
            n = min(seq.num_cached, len(seq.prompt) + len(seq.tokens))
            routes = seq.routed_experts()  # MoE: keep only tokens whose routes came back, with their routes
            if routes is not None:
                n = min(n, seq.routed)
                routes = routes[:n]
            pages = cdiv(n, self.ps)
            self.alloc.release_all(seq.pages[pages:])
            images = tuple(k for k in seq.image_keys if k[1] <= n)
            self.sessions.put(
                seq.session_id,
                CachedSequence((seq.prompt + seq.tokens)[:n], seq.pages[:pages], images, routes),
            )
        else:
            self.alloc.release_all(seq.pages)
        seq.pages = []
