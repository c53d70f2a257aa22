"""Per-row decode state on the device: what a (CUDA-graph captured) decode step reads and advances.

Row r of every tensor belongs to one running sequence or is idle (active 0, block table all trash page 0,
position 0: an idle row computes garbage that lands in the trash page and is never read). A decode step
over rows [0, b) reads input_ids/positions/block_tables/sampling params, samples, then writes the sampled
token back as the next input and advances positions and steps of active rows, so consecutive steps need
no host round trip. The host only touches rows when sequences join, leave, or cross into a new page, and
those writes go through pinned buffers without waiting (`_put`), so the host can stay a step ahead.

Prompt feeding: a row may join with prompt tokens still to compute (`feed_buf[row, :feed_len]`, the first
already in `input_ids`). While `feed_pos < feed_len` a step's sampled token is thrown away and the next
prompt token becomes the input instead, so the decode step itself writes the prompt's K/V, one token per
step, with no prefill pass; the step that reads the last prompt token samples the first real one (its
sampling step counter `steps` starts counting there, as after a prefill).

Routing replay (an MoE model, `route_shape` given): `out_routes` [rows, MoE layers, k] holds the experts
each row's input token went to in the last step, written in place by the step and copied to the host with
the sampled tokens (`HostOutputs`); a dense model has none and pays nothing.

Allowed tokens (a VLA's action tokens, `SamplingParams.allowed_token_ids`): `allowed` [rows, V] bool holds
each row's ids (every token for a row without any), made only once a request names some (`ensure_allowed`);
the sampler masks the others out like a grammar does, and the logprob stays that of the unfiltered
distribution (the reference engine's and the trainer's convention, `ascent.rollout.sampling.sample`).

Shared-prefix groups (`share_page_size` given: attn_options["shared_prefix"], triton_cascade.py): `groups`
[rows, 2 + MEMBERS] int32 says which rows read the same leading pages (prefix_groups.py). The host keeps
each row's key (`share_keys`) and rebuilds the table whenever rows are admitted, released or compacted,
in the same stream order as the block-table writes, so a step never sees a row's previous occupant in a
group; appending a page changes no key (a new page is the row's own).
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence as Seq
from typing import NamedTuple

import torch
from torch import Tensor

from ascent.messages import SamplingParams
from ascent.models.moe import ROUTES_DTYPE
from ascent.rollout.fast.prefix_groups import MEMBERS, find_groups, pack_groups, shareable_pages
from ascent.rollout.fast.sequence import Sequence
from ascent.rollout.sampling import SamplingTensors, token_presence


class Flags(NamedTuple):
    """Which optional sampling stages a batch needs (host bools; one captured graph per combination)."""

    top_k_top_p: bool
    min_p: bool
    penalty: bool
    all_greedy: bool
    restricted: bool = False  # some row samples only among its `allowed_token_ids`

    @classmethod
    def of(cls, params: Seq[SamplingParams]) -> Flags:
        return cls(
            top_k_top_p=any(p.top_k > 0 or p.top_p < 1.0 for p in params),
            min_p=any(p.min_p > 0 for p in params),
            penalty=any(p.repetition_penalty != 1.0 for p in params),
            all_greedy=all(p.temperature == 0 for p in params),
            restricted=any(p.allowed_token_ids for p in params),
        )


class DecodeState:
    """Device tensors [rows] (block_tables [rows, max_pages]) plus the step outputs."""

    PARAMS = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty")

    def __init__(
        self,
        rows: int,
        max_pages: int,
        vocab_size: int,
        device: torch.device,
        feed_width: int = 0,
        route_shape: tuple[int, int] | None = None,
        share_page_size: int = 0,
    ):
        """`share_page_size`: the KV page size when shared-prefix groups are kept (module doc), 0: none."""
        self.rows, self.vocab_size, self.device = rows, vocab_size, device
        self.pin = device.type == "cuda"

        def z(*shape, dtype=torch.long) -> Tensor:
            return torch.zeros(*shape, dtype=dtype, device=device)

        self.input_ids, self.positions, self.active, self.steps = z(rows), z(rows), z(rows), z(rows)
        self.block_tables = z(rows, max_pages, dtype=torch.int32)
        self.temperature, self.top_p = z(rows, dtype=torch.float32) + 1, z(rows, dtype=torch.float32) + 1
        self.top_k, self.min_p = z(rows), z(rows, dtype=torch.float32)
        self.repetition_penalty, self.seeds = z(rows, dtype=torch.float32) + 1, z(rows)
        self.seen: Tensor | None = None
        self.allowed: Tensor | None = None  # [rows, V] bool once a request names allowed ids (module doc)
        self.out_tokens, self.out_logprobs = z(rows), z(rows, dtype=torch.float32)
        self.feed_width = feed_width  # the longest prompt a row can be fed (0: no feeding, no step overhead)
        self.feed_buf, self.feed_pos, self.feed_len = z(rows, max(feed_width, 1)), z(rows), z(rows)
        self.rope_delta = z(rows)  # multimodal RoPE: rotary position minus cache position (vision.py)
        self.out_routes = z(rows, *route_shape, dtype=ROUTES_DTYPE) if route_shape else None
        self.share_page_size = share_page_size
        self.share_keys: list[tuple[int, ...]] = [()] * rows  # host: each row's shareable pages
        self._packed: list[list[int]] | None = None  # host copy of `groups` as last written
        self.groups: Tensor | None = None  # [rows, 2 + MEMBERS] int32 (module doc)
        if share_page_size:
            self.groups = z(rows, 2 + MEMBERS, dtype=torch.int32)
            self._regroup()

    def _put(self, values: list, dtype: torch.dtype = torch.long) -> Tensor:
        """A host list on the device without a stream sync: a plain copy from pageable memory waits for
        every queued kernel (the step in flight), a non-blocking one from pinned memory does not."""
        return torch.tensor(values, dtype=dtype, pin_memory=self.pin).to(self.device, non_blocking=True)

    def per_row(self) -> list[Tensor]:
        """Every tensor indexed by row (what admission fills and compaction permutes)."""
        base = [self.input_ids, self.positions, self.active, self.steps, self.block_tables, self.seeds]
        base += [self.feed_buf, self.feed_pos, self.feed_len, self.rope_delta]
        base += [getattr(self, n) for n in self.PARAMS]
        return base + [t for t in (self.seen, self.allowed) if t is not None]

    def ensure_seen(self) -> None:
        """Allocate the [rows, V] token-presence mask repetition penalty needs (once)."""
        if self.seen is None:
            self.seen = torch.zeros(self.rows, self.vocab_size, dtype=torch.bool, device=self.device)

    def ensure_allowed(self) -> None:
        """Allocate the [rows, V] allowed-token mask of rows sampling among given ids (once)."""
        if self.allowed is None:
            self.allowed = torch.ones(self.rows, self.vocab_size, dtype=torch.bool, device=self.device)

    def sampling(self, b: int, flags: Flags) -> SamplingTensors:
        """Sampling tensors of rows [0, b) with the batch's flags."""
        return SamplingTensors(
            temperature=self.temperature[:b],
            top_k=self.top_k[:b],
            top_p=self.top_p[:b],
            min_p=self.min_p[:b],
            repetition_penalty=self.repetition_penalty[:b],
            seeds=self.seeds[:b],
            use_top_k_top_p=flags.top_k_top_p,
            use_min_p=flags.min_p,
            use_penalty=flags.penalty,
            all_greedy=flags.all_greedy,
        )

    def advance(
        self, b: int, tokens: Tensor, logprobs: Tensor, flags: Flags, step: Callable | None = None
    ) -> None:
        """After sampling rows [0, b): publish outputs, feed tokens back, step active rows forward.
        `step` is `step_rows` or the runner's compiled copy of it."""
        feed = None
        if self.feed_width:
            feed = (self.feed_pos[:b], self.feed_len[:b], self.feed_buf[:b])
        (step or step_rows)(
            tokens,
            logprobs,
            self.out_tokens[:b],
            self.out_logprobs[:b],
            self.positions[:b],
            self.input_ids[:b],
            self.steps[:b],
            self.active[:b],
            feed,
        )
        if flags.penalty:
            assert self.seen is not None  # generate() calls ensure_seen() for a penalty batch
            self.seen[:b].scatter_(1, tokens[:, None], True)

    def admit(self, seqs: list[Sequence], rows: list[int], feeds: list[list[int]] | None = None) -> None:
        """Load sequences into `rows`: freshly prefilled ones (first token sampled), or with `feeds[i]`
        non-empty, sequence i with those prompt tokens still to compute (its K/V cached up to num_cached)."""
        feeds = feeds or [[] for _ in seqs]
        idx = self._put(rows)
        width = self.block_tables.shape[1]
        table = [s.pages + [0] * (width - len(s.pages)) for s in seqs]
        self.block_tables.index_copy_(0, idx, self._put(table, torch.int32))
        longs = {
            "input_ids": [f[0] if f else s.tokens[-1] for s, f in zip(seqs, feeds, strict=True)],
            "positions": [s.num_cached for s in seqs],
            "active": [1] * len(seqs),
            "steps": [len(s.tokens) for s in seqs],
            "seeds": [s.seed & ((1 << 63) - 1) for s in seqs],
            "top_k": [s.params.top_k for s in seqs],
            "feed_pos": [1 if f else 0 for f in feeds],
            "feed_len": [len(f) for f in feeds],
            "rope_delta": [s.rope_delta for s in seqs],
        }
        for name, vals in longs.items():
            getattr(self, name).index_copy_(0, idx, self._put(vals))
        if any(feeds):
            fw = self.feed_buf.shape[1]
            self.feed_buf.index_copy_(0, idx, self._put([f + [0] * (fw - len(f)) for f in feeds]))
        for name in ("temperature", "top_p", "min_p", "repetition_penalty"):
            fvals = [float(getattr(s.params, name)) for s in seqs]
            getattr(self, name).index_copy_(0, idx, self._put(fvals, torch.float32))
        if self.seen is not None:
            hist = [s.prompt + s.tokens for s in seqs]
            width = max(len(h) for h in hist)
            padded = self._put([h + [-1] * (width - len(h)) for h in hist])
            self.seen.index_copy_(0, idx, token_presence(padded, self.vocab_size))
        if self.allowed is not None:
            mask = allowed_mask([s.params for s in seqs], self.vocab_size)
            mask = mask.pin_memory() if self.pin else mask
            self.allowed.index_copy_(0, idx, mask.to(self.device, non_blocking=True))
        if self.groups is not None:
            for r, s in zip(rows, seqs, strict=True):
                self.share_keys[r] = shareable_pages(s.pages, s.num_cached, self.share_page_size)
            self._regroup()

    def set_pages(self, rows: list[int], cols: list[int], pages: list[int]) -> None:
        """block_tables[rows[i], cols[i]] = pages[i] (pages newly taken before a step)."""
        if rows:
            self.block_tables[self._put(rows), self._put(cols)] = self._put(pages, torch.int32)

    def release(self, rows: list[int]) -> None:
        """Make rows idle: inactive, position 0, every block-table entry the trash page."""
        if rows:
            idx = self._put(rows)
            self.active.index_fill_(0, idx, 0)
            self.positions.index_fill_(0, idx, 0)
            self.block_tables.index_fill_(0, idx, 0)
            if self.groups is not None:
                for r in rows:
                    self.share_keys[r] = ()
                self._regroup()

    def _regroup(self) -> None:
        """Write the group table of the rows' keys (prefix_groups.py), when it changed."""
        assert self.groups is not None
        packed = pack_groups(find_groups(self.share_keys), self.rows)
        if packed != self._packed:
            self.groups.copy_(self._put(packed, torch.int32).view_as(self.groups))
            self._packed = packed

    def compact(self, src_rows: list[int], old_end: int) -> None:
        """Move rows src_rows[i] -> i for every per-row tensor; rows len(src)..old_end-1 become idle."""
        idx = self._put(src_rows)
        for t in self.per_row():
            t[: len(src_rows)] = t[idx]
        keys = self.share_keys
        self.share_keys = [keys[r] for r in src_rows] + keys[len(src_rows) :]
        self.release(list(range(len(src_rows), old_end)))
        if self.groups is not None:  # (the moved rows' groups, even where no row became idle)
            self._regroup()


def step_rows(
    tokens: Tensor,
    logprobs: Tensor,
    out_tokens: Tensor,
    out_logprobs: Tensor,
    positions: Tensor,
    input_ids: Tensor,
    steps: Tensor,
    active: Tensor,
    feed: tuple[Tensor, Tensor, Tensor] | None,
) -> None:
    """One step forward of b rows, in place: tokens/logprobs [b] sampled -> out_tokens/out_logprobs; each
    row's next input is its token, or a fed row's next prompt token (`feed` = feed_pos [b], feed_len [b],
    feed_buf [b, W]: module doc); positions [b] and steps [b] of active rows move on. A pure function of
    its tensors, so the runner can `torch.compile` it: a dozen small integer ops become one or two kernels
    of the captured step instead of a launch each."""
    out_tokens.copy_(tokens)
    out_logprobs.copy_(logprobs)
    positions += active
    if feed is None:
        input_ids.copy_(tokens)
        steps += active
        return
    pos, length, buf = feed
    real = pos >= length
    prompt_next = buf.gather(1, pos.clamp(max=buf.shape[1] - 1)[:, None])[:, 0]
    input_ids.copy_(torch.where(real, tokens, prompt_next))
    steps += active * real
    pos += (~real).long()


def allowed_mask(params: Seq[SamplingParams], vocab_size: int) -> Tensor:
    """-> [len(params), V] bool (host): True at each row's `allowed_token_ids`, everywhere for a row naming
    none."""
    out = torch.ones(len(params), vocab_size, dtype=torch.bool)
    for i, p in enumerate(params):
        if p.allowed_token_ids:
            out[i] = False
            out[i, list(p.allowed_token_ids)] = True
    return out


class HostOutputs:
    """Host copies of the step outputs (`out_tokens`, `out_logprobs` of rows [0, b), and an MoE model's
    `out_routes`), made without waiting: a ring of three pinned (on CUDA) buffer sets [rows], so the copy of
    a step in flight never overwrites the buffers of the step the host is still reading (the engine
    processes one step behind). Readers copy what they keep out of the routes buffer before it comes round."""

    def __init__(self, rows: int, device: torch.device, route_shape: tuple[int, int] | None = None):
        pin = device.type == "cuda"
        self.cuda = pin
        self.buffers = [
            (
                torch.empty(rows, dtype=torch.long, pin_memory=pin),
                torch.empty(rows, dtype=torch.float32, pin_memory=pin),
                torch.empty(rows, *route_shape, dtype=ROUTES_DTYPE, pin_memory=pin) if route_shape else None,
            )
            for _ in range(3)
        ]
        self.next = 0

    def copy(
        self, state: DecodeState, b: int
    ) -> tuple[Tensor, Tensor, Tensor | None, torch.cuda.Event | None]:
        """Start copying rows [0, b) of the step's outputs -> (tokens [rows], logprobs [rows], routes
        [rows, layers, k] or None, event or None: the buffers hold the step's values once the event has
        completed)."""
        toks, lps, routes = self.buffers[self.next]
        self.next = (self.next + 1) % len(self.buffers)
        toks[:b].copy_(state.out_tokens[:b], non_blocking=True)
        lps[:b].copy_(state.out_logprobs[:b], non_blocking=True)
        if routes is not None:
            assert state.out_routes is not None  # both made from the runner's route_shape (engine.py)
            routes[:b].copy_(state.out_routes[:b], non_blocking=True)
        event = None
        if self.cuda:
            event = torch.cuda.Event()
            event.record()
        return toks, lps, routes, event
