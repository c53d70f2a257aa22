"""FastEngine: continuous batching over the paged KV cache, behind the RolloutEngine protocol.

This module holds the public API and the engine's lifecycle (generate, weights, sleep/wake); the loop
below lives in batching.py (`BatchingLoop`, the engine's base class).

The loop of `generate`:
1. admit waiting requests while decode rows and cache pages allow: prefill each prompt once (reusing a
   cached session prefix), fork it into its n samples, sample every sample's first token. A single-sample
   request with at most `feed_prompt_tokens` new prompt tokens that joins a running batch (no more joining
   than running) is fed instead: its row starts at once and the decode steps compute its prompt, one token
   per step (state.py), since a prefill pass would hold up every running row for far longer (host-bound:
   10-17 ms on an H100 or H200 for a 0.5B model, ~14 decode steps, however short the prompt);
2. launch a decode step over the active rows (a CUDA-graph replay on GPU), without waiting for it;
3. process the previous step's tokens on the host (one step behind, so host work overlaps the GPU):
   append, check stop tokens / stop strings / budgets, free finished rows for waiting requests.
Rows are compacted when the batch shrinks to a smaller graph bucket.

Multi-turn: a request with a `session_id` leaves its K/V pages in the session store when it finishes; the
next request of that session (previous prompt + response + new tokens) prefills only what follows the
longest cached prefix (`Generation.cached_tokens`, `stats["reused_tokens"]`). Cached K/V belongs to the
weights that computed it: `update_weights`, `sleep` and an in-place step of shared weights drop every session.

Prefix caching (`prefix_caching=True`, prefix.py): across requests, a prompt reuses the K/V of its longest
run of full pages that another prompt computed (the longer of that and a session prefix wins); a prompt
that continues pages a prompt of the same admission registers waits for that prefill (batching.py), so a
prefix shared by many queued prompts is prefilled once. Dropped with the sessions (weights changed).
Batch-invariant mode (`batch_invariant=True`, runner.py): every row runs alone, so a request's samples do
not depend on what shares its steps; no prompt feeding, no prefix caching.

Images (a vision-language model, vision.py): an image prompt is always prefilled (never fed); the prefill
runs the vision tower once per distinct image of the admitted prompts (so a group's n samples share one
encoding and one prefill of the image K/V) and rotates by multimodal RoPE positions; decode steps stay text
only. A session entry remembers which image each image-token run showed, so a next turn reuses the K/V of
earlier turns' images and encodes only its new ones, and never reuses a run that showed another image.

An action head (`model.action_head`, action.py): every request is one action turn, sampled by the head at
its prefill (never fed), one placeholder token that ends it; published `action_head.*` tensors go to the head.

Weight swaps between decode steps (swap.py): a publication may arrive from another thread while a call
runs; it is applied at the next step boundary, never inside a step (weights are copied into the tensors the
CUDA graphs read, so a replay after it uses them). By default (`on_swap="continue"`) the sequences in flight
keep the K/V computed so far and go on with the new weights; `on_swap="restart"` samples them again from
their prompt instead. Each token records the policy version that sampled it (`Generation.token_versions`,
once a publisher has named one), so a sequence's versions may change mid-way; a session whose sequence saw a
swap is not kept for its next turn.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterable
from typing import Any, Literal

import torch

from ascent.messages import Generation, GenerationRequest
from ascent.rollout.adapter import AdapterMerger
from ascent.rollout.fast.batching import BatchingLoop
from ascent.rollout.fast.graphs import GraphRunner, clear_cublas_workspaces
from ascent.rollout.fast.live import Done, LiveCall, More, fits
from ascent.rollout.fast.pages import PageAllocator, SessionStore
from ascent.rollout.fast.pool import PoolSizer
from ascent.rollout.fast.prefix import PrefixCache
from ascent.rollout.fast.runner import ModelRunner
from ascent.rollout.fast.scheduler import Scheduler
from ascent.rollout.fast.sequence import Sequence
from ascent.rollout.fast.state import DecodeState, Flags, HostOutputs
from ascent.rollout.fast.swap import WeightSwaps
from ascent.rollout.fast.vision import VisionTower
from ascent.rollout.fast.weights import ModelWeights


class FastEngine(BatchingLoop):
    """See the module docstring; build one with `ascent.rollout.fast.build_fast_engine`."""

    def __init__(
        self,
        runner: ModelRunner,
        weights: ModelWeights,
        *,
        eos_token_ids: Iterable[int],
        decode: Callable[[list[int]], str] | None,
        max_batch_size: int,
        max_model_len: int,
        buckets: list[int] | None,
        keep_sessions: bool = True,
        max_prefill_tokens: int = 16384,
        stop_check_interval: int = 8,
        on_swap: Literal["continue", "restart"] = "continue",
        feed_prompt_tokens: int = 256,
        vision: VisionTower | None = None,
        prefix_caching: bool = False,
        batch_invariant: bool = False,
        pool: PoolSizer | None = None,
    ):
        """`prefix_caching`: reuse the K/V of full prompt pages across requests (prefix.py);
        `batch_invariant`: a request's samples do not depend on what else is batched (module doc);
        `pool`: sizes the KV cache again at every wake (pool.py; None: the size it was built with)."""
        if prefix_caching and batch_invariant:
            raise ValueError(
                "prefix_caching=True with batch_invariant=True: a prefix-cache hit depends on the other "
                "requests (and computes the prompt another way); turn one of them off."
            )
        self.runner, self.weights, self.cache = runner, weights, runner.cache
        # LoRA adapter-only publications merge into pristine copies of the adapted layers (rollout/adapter.py)
        self.adapters = AdapterMerger(lambda name: weights.targets[weights.rename(name)])
        self.vision = vision  # a vision-language model's tower (vision.py): image prompts; None: text only
        self.device = self.cache.device
        self.eos = frozenset(int(t) for t in eos_token_ids)
        self.decode, self.interval = decode, stop_check_interval
        self.max_rows, self.max_model_len = max_batch_size, max_model_len
        self.max_prefill_tokens = max_prefill_tokens
        self.pool = pool
        self.alloc = PageAllocator(self.cache.num_pages)
        self.sessions = SessionStore(self.alloc)
        self.prefix = PrefixCache(self.alloc, self.cache.page_size) if prefix_caching else None
        self.sched = Scheduler(self.alloc, self.sessions, self.cache.page_size, keep_sessions, self.prefix)
        self.batch_invariant = batch_invariant
        max_pages = -(-max_model_len // self.cache.page_size)
        # batch-invariant: never feed (whether a prompt is fed depends on the running batch); an action head
        # acts on a prefill's hidden state (action.py)
        never_feed = batch_invariant or runner.action is not None
        self.feed_limit = 0 if never_feed else max(0, min(feed_prompt_tokens, max_model_len))
        self.state = DecodeState(
            max_batch_size,
            max_pages,
            runner.spec.vocab_size,
            self.device,
            self.feed_limit,
            runner.route_shape,
            share_page_size=self.cache.page_size if runner.shared_prefix else 0,
        )
        self.graphs = GraphRunner(self._graph_step, buckets) if buckets else None
        self.lag = 1 if self.device.type == "cuda" else 0
        self.rows: list[Sequence | None] = [None] * max_batch_size
        self.free_rows = list(range(max_batch_size))
        self.asleep, self._blocked = False, False
        self._live: LiveCall | None = None  # the requests of a `generate_live` call in progress
        self._host = HostOutputs(
            max_batch_size, self.device, runner.route_shape
        )  # where each step's tokens come back
        self._stamp = weights.stamp() if weights.shared else ()
        self.on_swap = on_swap  # what sequences in flight do when weights change between steps (module doc)
        self.swaps = WeightSwaps(self.device, self._drop_cached, writes=lambda: self.weights.writes)
        self.stats = {"steps": 0, "prefills": 0, "compactions": 0, "launch_s": 0.0, "process_s": 0.0}
        self.stats["prefill_tokens"] = 0  # prompt tokens computed by prefill (each group's prompt once)
        self.stats["reused_tokens"] = 0  # prompt tokens whose K/V a cached session prefix supplied
        self.stats["prefix_hit_tokens"] = 0  # of those, supplied by the prefix cache (prefix.py)
        # prompt tokens admitted: reused_tokens / prompt_tokens is the hit rate
        self.stats["prompt_tokens"] = 0
        self.stats["fed_tokens"] = 0  # prompt tokens computed by decode steps (fed, not prefilled)
        self.stats["swaps"] = 0  # publications applied while a call was running (between two steps)
        self.stats["restarted"] = 0  # sequences sampled again from their prompt (on_swap=restart)

    # ---- RolloutEngine protocol -------------------------------------------------------------------------

    @torch.no_grad()
    def generate(self, requests: list[GenerationRequest]) -> list[list[Generation]]:
        """For each request, `params.n` generations in order (see ascent.rollout.base)."""
        with self.swaps.running():
            return self._generate(requests)

    def _generate(self, requests: list[GenerationRequest]) -> list[list[Generation]]:
        self.wake()
        self._drop_stale_sessions()
        out: list[list[Generation | None]] = [[None] * r.params.n for r in requests]
        seqs = self._expand(requests, out)
        flags = Flags.of([r.params for r in requests])
        self._ensure_state(flags)
        try:
            if self.graphs is not None and seqs:
                self._capture(flags, min(len(seqs), self.max_rows))
            self._run(flags)
        except BaseException:
            self._abort_all()
            raise
        for s in seqs:
            out[s.req][s.sample] = s.generation(self.swaps.version is not None)
        return out  # type: ignore[return-value]

    @torch.no_grad()
    def generate_live(self, requests: list[GenerationRequest], more: More, done: Done) -> None:
        """`generate`, taking requests while it runs (continuous batching for a server): between decode
        steps `more(fits)` returns requests queued since, those for which `fits(request)` holds (their
        sampling needs no stage the call's graphs lack), and `done(i, generations)` is called as soon as
        request i's samples are finished (requests numbered in arrival order, `requests` first). Returns
        when nothing runs and `more` has nothing."""
        with self.swaps.running():
            self._generate_live(requests, more, done)

    def _generate_live(self, requests: list[GenerationRequest], more: More, done: Done) -> None:
        self.wake()
        flags = Flags.of([r.params for r in requests])
        self._ensure_state(flags)
        self._live = LiveCall(more, done, lambda r: fits(flags, r.params))
        try:
            self._feed(requests)
            if self.graphs is not None:
                self._capture(flags, self.max_rows)
            self._run(flags)
        except BaseException:
            self._abort_all()
            raise
        finally:
            self._live = None

    def _ensure_state(self, flags: Flags) -> None:
        """Allocate the per-row masks the call's sampling stages read (state.py)."""
        if flags.penalty:
            self.state.ensure_seen()
        if flags.restricted:
            self.state.ensure_allowed()

    def _capture(self, flags: Flags, rows: int) -> None:
        """Capture the decode graphs a call needs. After the engine's first capture, freeze the heap built
        so far (the model, compiled code, graphs) out of the cyclic GC's full passes, which otherwise walk
        it mid-decode (one took 0.37 s on an H200 behind the HTTP endpoint). Frozen objects are still freed
        when unreferenced; only cycles among them stay (once: later captures freeze nothing new)."""
        assert self.graphs is not None
        first = not self.graphs.graphs and not self.graphs.warmed
        self.graphs.capture(flags, rows)
        if first:
            gc.freeze()

    def update_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> None:
        """Copy new weights in place (HF names, any device/dtype, any bucketing); drops cached sessions.
        A LoRA adapter (`layer.lora_A` / `lora_B` / `lora_scaling`) is merged into the layer's pristine
        base weight (`ascent.rollout.adapter`).

        After `sleep(release_weights=True)` the first call re-allocates the weights; `wake`/`generate` then
        wait for every weight to have arrived (over one or several calls). From another thread while a call
        runs, it waits for the next decode-step boundary; a publication sent in several calls (buckets) is
        whole only inside `publication`, which also names its version.
        """
        if self.runner.action is not None:  # the head's `action_head.*` tensors go to it (action.py)
            named_tensors = self.runner.action.take(named_tensors)
        with self.publication():
            self.weights.update(self.adapters.apply(named_tensors))

    def publication(self, version: int | None = None) -> contextlib.AbstractContextManager[None]:
        """A block holding the weights for one publication (any number of `update_weights` calls), from any
        thread: while a call runs on another thread it waits for the call's next decode-step boundary, and
        the call goes on with the new weights when it ends; tokens sampled from then on record `version`.
        Cached sessions are dropped (swap.py)."""
        return self.swaps.publication(version)

    def sleep(self, release_weights: bool = False) -> None:
        """Free the KV cache and the decode graphs (cached sessions are lost).

        `release_weights=True` also frees the engine's own weight copy (its storages shrink to 0 bytes; the
        tensors stay), for a colocated trainer's update. The engine then needs a full set of weights through
        `update_weights` before `wake`/`generate`, which raise until it has one. Weights shared with a
        trainer's module are never freed. Calling it while asleep can still release the weights.
        """
        if not self.asleep:
            if self.graphs is not None:
                self.graphs.clear()
            self._drop_cached()
            self.alloc.reset()
            self.cache.free()
            self.asleep = True
        if release_weights:
            self.weights.release()
        if self.device.type == "cuda":
            clear_cublas_workspaces()
            torch.cuda.empty_cache()

    def wake(self) -> None:
        """Reallocate the KV cache, sized again to what is free now (pool.py; graphs are recaptured by the
        next generate).

        Raises when the weights were released by `sleep(release_weights=True)` and not all sent since, and
        `KVCacheOutOfMemory` when not even one max-length request fits.
        """
        self._check_weights()
        if self.asleep:
            if self.device.type == "cuda":  # hand the trainer's cached free blocks back first, so the
                torch.cuda.empty_cache()  # cache's new segments do not stack on top of them (reserved peak)
            self._resize_pool()
            self.cache.allocate()
            self.asleep = False

    def _resize_pool(self) -> None:
        """While asleep (no page held): the pool's size for this wake, the page bookkeeping resized with it
        (admission counts free pages; block tables are [rows, pages of one sequence], whatever the pool)."""
        if self.pool is None:
            return
        pages = self.pool.settle(self._agree_pages(self.pool.fit()))
        if pages != self.cache.num_pages:
            self.cache.resize(pages)
            self.alloc.resize(pages)
            if self.prefix is not None:
                self.prefix.reset()

    def _agree_pages(self, pages: int) -> int:
        """The pages every process of the replica can hold (one process: its own; TPEngine: the minimum)."""
        return pages

    @property
    def kv_cache_tokens(self) -> int:
        """Tokens the KV cache holds for requests (its size now, the trash page aside): rollout/kv_tokens."""
        return (self.cache.num_pages - 1) * self.cache.page_size

    def memory(self) -> dict[str, int]:
        """Device bytes the engine holds now: {"weights": own weight copy (0 released or shared),
        "kv_cache": K and V (0 asleep)}. CUDA graph pools and activations are not counted."""
        return {"weights": self.weights.nbytes, "kv_cache": self.cache.nbytes}

    def _drop_stale_sessions(self) -> None:
        """Cached sessions hold K/V computed with the weights of their turn: drop them when shared weights
        were stepped in place since (owned weights change only through `update_weights`, which drops them)."""
        if not self.weights.shared:
            return
        stamp = self.weights.stamp()
        if stamp != self._stamp:
            self._drop_cached()
            self._stamp = stamp

    def _drop_cached(self) -> None:
        """Forget all cached K/V (sessions, prefix cache): it belongs to the weights that computed it."""
        self.sessions.clear()
        if self.prefix is not None:
            self.prefix.clear()

    def _check_weights(self) -> None:
        """Raise while a publication failed partway or a weight freed by `sleep(release_weights=True)` is
        unsent."""
        self.swaps.check()
        missing = self.weights.missing()
        if missing:
            raise RuntimeError(
                f"rollout engine: sleep(release_weights=True) freed the weights and {len(missing)} of them "
                f"were not sent again since (e.g. {missing[:3]}); publish a full set of weights with "
                "update_weights before wake/generate, or sleep without release_weights."
            )

    def _abort_all(self) -> None:
        """After an error inside generate: drop queued work, free every row and page (no stale state)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.sched.waiting.clear()
        self.sched.waiting_rows = 0
        self.sessions.clear()
        self.alloc.reset()
        if self.prefix is not None:
            self.prefix.reset()  # (its references went with the allocator's)
        self.state.release(list(range(self.max_rows)))
        self.rows = [None] * self.max_rows
        self.free_rows = list(range(self.max_rows))
