"""The continuous-batching loop of `FastEngine` (engine.py): requests -> queued sequences, admission
(prefill, or feeding a short prompt through decode steps), launching and processing decode steps,
compaction, and what a weight swap between two steps does to the sequences in flight.

Routing replay (an MoE model): every sequence collects the experts of each token a forward computed, in
order (`Sequence.routes`): a cached session prefix keeps those of the turn that computed it (pages.py), a
prefill gives the prompt's to all its samples, and each decode step's host copy (state.py) gives its row's
input token's, fed prompt tokens included.

`BatchingLoop` is a base class of `FastEngine`: it holds no state of its own; the attributes it works on
are declared below and set by `FastEngine.__init__` (engine.py, whose module docstring tells the loop).
"""

from __future__ import annotations

import heapq
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Literal

import torch

from ascent.messages import GenerationRequest
from ascent.rollout.fast.graphs import GraphRunner, pick_bucket
from ascent.rollout.fast.kv_cache import KVCache
from ascent.rollout.fast.live import LiveCall
from ascent.rollout.fast.pages import unzip_pairs
from ascent.rollout.fast.runner import ModelRunner
from ascent.rollout.fast.scheduler import Admission, Scheduler
from ascent.rollout.fast.sequence import Sequence, check_finished, expand_requests
from ascent.rollout.fast.state import DecodeState, Flags, HostOutputs
from ascent.rollout.fast.swap import WeightSwaps
from ascent.rollout.fast.vision import RowImages, VisionTower


class BatchingLoop:
    """The loop half of `FastEngine`; see the module docstring."""

    runner: ModelRunner
    vision: VisionTower | None
    cache: KVCache
    state: DecodeState
    sched: Scheduler
    swaps: WeightSwaps
    graphs: GraphRunner | None
    eos: frozenset[int]
    decode: Callable[[list[int]], str] | None
    interval: int
    max_rows: int
    max_model_len: int
    max_prefill_tokens: int
    feed_limit: int
    lag: int
    rows: list[Sequence | None]
    free_rows: list[int]
    on_swap: Literal["continue", "restart"]
    stats: dict[str, float]
    _blocked: bool
    _live: LiveCall | None
    _host: HostOutputs

    def _feed(self, requests: list[GenerationRequest]) -> None:
        """Queue a live call's new requests; answer at once those with no room to generate."""
        live = self._live
        assert live is not None
        start = live.add(requests)
        self._expand(requests, live.out, offset=start)
        live.answer_ready(start)

    def _finished(self, s: Sequence) -> None:
        """A sequence is done: in a live call, answer its request once all its samples are. Its K/V stays
        for the session's next turn only if no swap happened since it was admitted."""
        self.sched.finish(s, keep=s.epoch == self.swaps.epoch)
        if self._live is not None:
            self._live.finished(s.req, s.sample, s.generation(self.swaps.version is not None))

    # ---- requests -> sequences ------------------------------------------------------------------------

    def _expand(
        self, requests: list[GenerationRequest], out: list[list[Any]], offset: int = 0
    ) -> list[Sequence]:
        """Queue the requests' samples in groups of at most max_rows (see `expand_requests`)."""
        groups = expand_requests(
            requests,
            out,
            offset,
            eos=self.eos,
            max_model_len=self.max_model_len,
            can_decode=self.decode is not None,
            fresh_seed=lambda: int(torch.randint(0, 2**62, ()).item()),
            image_token=self.vision.image_token_id if self.vision is not None else None,
        )
        for group in groups:
            for start in range(0, len(group), self.max_rows):
                self.sched.add(group[start : start + self.max_rows])
        return [s for group in groups for s in group]

    # ---- the loop -------------------------------------------------------------------------------------

    @property
    def running(self) -> int:
        return self.max_rows - len(self.free_rows)

    def _run(self, flags: Flags) -> None:
        pending: deque = deque()
        self._blocked = False
        epoch = self.swaps.epoch
        while True:
            self.swaps.gate.boundary()  # a publication waiting for the weights is applied here
            if self._live is not None:
                self._feed(self._live.more(self._live.fits))
            self.swaps.check()  # (one that failed partway: never go on with half-copied weights)
            if epoch != self.swaps.epoch:  # (or one made by a callback of this loop)
                epoch = self.swaps.epoch
                self._swapped(pending)
            if not (self.sched.waiting or self.running):
                break
            if self.sched.waiting and self.running and self.feed_limit and not flags.penalty:
                self._admit_fed()
            if self.sched.waiting and self._want_admit():
                self._drain(pending)
                self._admit(flags)
                if not self.running and self._blocked:
                    raise RuntimeError(
                        "a request does not fit in the KV cache even alone; raise gpu_memory_fraction "
                        "(or kv_cache_tokens), or lower max_new_tokens / max_model_len."
                    )
            if not self.sched.waiting:
                self._maybe_compact(pending)
            t0 = time.perf_counter()
            step = self._launch(flags)
            self.stats["launch_s"] += time.perf_counter() - t0
            if step is not None:
                pending.append(step)
            if pending and (step is None or len(pending) > self.lag):
                self._process(pending.popleft())
        self._drain(pending)

    def _swapped(self, pending: deque) -> None:
        """New weights since the last step: count it, and with on_swap=restart sample every sequence in
        flight again from its prompt (tokens of steps launched before the swap are processed first)."""
        self.stats["swaps"] += 1
        if self.on_swap != "restart":
            return
        self._drain(pending)
        again = [s for s in self.rows if s is not None]
        self.state.release([s.row for s in again])
        for s in reversed(again):
            self.sched.finish(s, keep=False)
            self.rows[s.row] = None
            s.restart()
            self.sched.waiting.appendleft([s])
        self.sched.waiting_rows += len(again)
        self.free_rows = [r for r in range(self.max_rows) if self.rows[r] is None]
        heapq.heapify(self.free_rows)
        self._blocked = False
        self.stats["restarted"] += len(again)

    def _want_admit(self) -> bool:
        if self._blocked:
            return False
        if not self.running:
            return True
        need = len(self.sched.waiting[0])
        threshold = max(need, min(self.max_rows // 8, self.sched.waiting_rows))
        return len(self.free_rows) >= threshold

    def _admit(self, flags: Flags) -> None:
        """Prefill admitted groups together, fork them into samples, sample first tokens, fill rows. Groups
        that continue a prefix an earlier group of the pass registers in the prefix cache wait for its
        prefill and go in a next pass (scheduler.py `deferred`): the shared prefix is prefilled once."""
        adms = self.sched.admit(len(self.free_rows), self.max_prefill_tokens)
        if not adms:
            self._blocked = True
            return
        while adms:
            self._prefill(adms, flags)
            deferred = self.sched.deferred and self.free_rows
            adms = self.sched.admit(len(self.free_rows), self.max_prefill_tokens) if deferred else []

    def _prefill(self, adms: list[Admission], flags: Flags) -> None:
        self.cache.copy_pages(*unzip_pairs(c for a in adms for c in a.copies))
        images = self._images(adms)
        hidden = self.runner.prefill(
            [a.prompt[a.reuse :] for a in adms], [a.reuse for a in adms], [a.pages for a in adms], images
        )
        if self.sched.prefix is not None:
            self.sched.prefix.ready()  # the pages the admitted prompts registered hold their K/V now
        self.cache.copy_pages(*unzip_pairs(c for a in adms for c in self.sched.fork(a)))
        if self.runner.prefill_routes is not None:
            for a, routes in zip(adms, self.runner.prefill_routes, strict=True):
                for s in a.seqs:  # the samples share the prompt's routes
                    s.routes = [*(s.routes or []), routes[: len(a.prompt) - a.reuse]]
        self.stats["prefills"] += 1
        self.stats["prefill_tokens"] += sum(len(a.prompt) - a.reuse for a in adms)
        self._count_reuse(adms)
        seqs = [s for a in adms for s in a.seqs]
        version, epoch = self.swaps.version or 0, self.swaps.epoch  # of the weights that ran the prefill
        group = [i for i, a in enumerate(adms) for _ in a.seqs]
        if self.runner.action is not None:  # an action head: each sample's turn is one action (action.py)
            acts = self.runner.act_first(hidden, group, seqs)
            first = [(tok, lp) for tok, lp, _ in acts]
            for s, (_, _, chunk) in zip(seqs, acts, strict=True):
                s.action = chunk
        else:
            first = self.runner.sample_first(hidden, group, seqs, flags)
        live = []
        for s, (tok, lp) in zip(seqs, first, strict=True):
            s.tokens, s.logprobs, s.versions, s.launched, s.epoch = [tok], [lp], [version], 1, epoch
            if check_finished(s, self.decode, self.interval):
                self._finished(s)
            else:
                s.row = heapq.heappop(self.free_rows)
                self.rows[s.row] = s
                live.append(s)
        if live:
            self.state.admit(live, [s.row for s in live])

    def _count_reuse(self, adms: list[Admission]) -> None:
        self.stats["prompt_tokens"] += sum(len(a.prompt) for a in adms)
        self.stats["reused_tokens"] += sum(a.reuse for a in adms)
        self.stats["prefix_hit_tokens"] += sum(a.hit for a in adms)

    def _images(self, adms: list[Admission]) -> list[RowImages | None] | None:
        """The admitted prompts' multimodal inputs (vision.py; each distinct image of them through the tower
        once), their rows' rope deltas set on the samples; None when no prompt shows an image."""
        if self.vision is None or not any(a.seqs[0].images for a in adms):
            return None
        rows, deltas = self.vision.rows([(a.prompt, a.seqs[0].images) for a in adms], [a.reuse for a in adms])
        for a, delta in zip(adms, deltas, strict=True):
            for s in a.seqs:
                s.rope_delta = delta
        return rows

    def _admit_fed(self) -> None:
        """Start waiting single-sample requests with short new prompts in free rows, without a prefill
        (module doc): in arrival order, while they fit and no more join than were running."""
        running, joined = self.running, 0

        def accept(group: list[Sequence]) -> bool:
            nonlocal joined
            ok = (
                len(group) == 1
                and not group[0].images  # image prompts are prefilled (their embeddings, their positions)
                and joined < running
                and self.sched.new_tokens(group[0]) <= self.feed_limit
            )
            joined += ok
            return ok

        adms = self.sched.admit(len(self.free_rows), self.max_prefill_tokens, accept)
        if not adms:
            return
        self.cache.copy_pages(*unzip_pairs(c for a in adms for c in a.copies))
        seqs, feeds = [], []
        for a in adms:
            self.sched.fork(a)  # one sample: its pages are the prompt's, nothing to copy
            (s,) = a.seqs
            s.num_cached, s.launched, s.epoch = a.reuse, 0, self.swaps.epoch
            s.fed = len(a.prompt) - a.reuse
            if self.runner.route_shape is not None:
                s.routes = s.routes or []  # the fed tokens' routes come with the steps that compute them
            s.skip = s.fed - 1  # every fed step but the last samples a throw-away token
            s.row = heapq.heappop(self.free_rows)
            self.rows[s.row] = s
            seqs.append(s)
            feeds.append(a.prompt[a.reuse :])
        self.stats["fed_tokens"] += sum(len(f) for f in feeds)
        self._count_reuse(adms)
        self.state.admit(seqs, [s.row for s in seqs], feeds)

    def _bucket(self, n: int) -> int:
        return pick_bucket(self.graphs.buckets, n) if self.graphs is not None else n

    def _launch(self, flags: Flags):
        """Queue one decode step over the active rows -> (sequences, host tokens, host logprobs, event)."""
        live, idle = [], []
        new_pages: tuple[list[int], list[int], list[int]] = ([], [], [])  # rows, page slots, pages
        for s in self.rows:
            if s is None:
                continue
            if s.exhausted:
                if not s.idle:
                    idle.append(s.row)
                    s.idle = True
                continue
            page = self.sched.ensure_page(s)
            if page is not None:
                for lst, val in zip(new_pages, (s.row, len(s.pages) - 1, page), strict=True):
                    lst.append(val)
            live.append(s)
        self.state.release(idle)
        self.state.set_pages(*new_pages)
        if not live:
            return None
        b = self._bucket(max(s.row for s in live) + 1)
        max_ctx = max(s.num_cached for s in live) + 1
        for s in live:
            s.num_cached += 1
            s.launched += 1
        version = self.swaps.version or 0  # of the weights this step runs on
        self._decode_step(b, flags, max_ctx)
        self.stats["steps"] += 1
        return (live, version, *self._host.copy(self.state, b))

    def _decode_step(self, b: int, flags: Flags, max_len: int) -> None:
        """Queue the decode step over rows [0, b): a replay of its graph, or eagerly (the torch attention
        reading at most `max_len` keys)."""
        if self.graphs is not None:
            self.graphs.replay(b, flags)
        else:
            self.runner.decode(self.state, b, flags, max_len=max_len)

    def _graph_step(self, b: int, flags: Flags) -> None:
        self.runner.decode(self.state, b, flags)

    def _process(self, step) -> None:
        """Append a finished step's tokens; finish sequences that stop; free their rows."""
        live, version, toks_t, lps_t, routes_t, event = step
        if event is not None:
            event.synchronize()
        t0 = time.perf_counter()
        toks, lps = toks_t.tolist(), lps_t.tolist()
        routes = routes_t.clone() if routes_t is not None else None  # (the ring buffer comes round)
        released = []
        for s in live:
            if s.finish is not None:
                continue
            if routes is not None and s.routes is not None:  # the experts of the token the step read
                s.routes.append(routes[s.row : s.row + 1])
            if s.skip:  # the step read a prompt token: what it sampled is not the sequence's
                s.skip -= 1
                continue
            s.tokens.append(toks[s.row])
            s.logprobs.append(lps[s.row])
            s.versions.append(version)
            if check_finished(s, self.decode, self.interval):
                self._finished(s)
                released.append(s.row)
                self.rows[s.row] = None
                heapq.heappush(self.free_rows, s.row)
                self._blocked = False
        self.state.release(released)
        self.stats["process_s"] += time.perf_counter() - t0

    def _drain(self, pending: deque) -> None:
        while pending:
            self._process(pending.popleft())

    def _maybe_compact(self, pending: deque) -> None:
        """Move active rows to the front when that lets a smaller bucket (graph) run the step."""
        used = [r for r, s in enumerate(self.rows) if s is not None]
        if not used or self._bucket(used[-1] + 1) <= self._bucket(len(used)):
            return
        self._drain(pending)
        used = [r for r, s in enumerate(self.rows) if s is not None]
        if not used:
            return
        self.state.compact(used, used[-1] + 1)
        moved = [s for s in self.rows if s is not None]  # the rows at `used`, in order
        for i, s in enumerate(moved):
            s.row = i
        self.rows = moved + [None] * (self.max_rows - len(moved))
        self.free_rows = list(range(len(moved), self.max_rows))
        self.stats["compactions"] += 1
