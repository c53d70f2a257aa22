"""Tensor parallelism for the fast engine (Megatron-style): one replica's forward spread over `size` ranks.

Each rank holds a shard of every decoder layer:
- q/k/v (and their biases) and gate/up are **column-parallel**: rank r keeps its slice of the output rows,
  so it computes its own attention heads and its slice of the MLP's intermediate features;
- o_proj and down_proj are **row-parallel**: rank r keeps the matching input columns, and the partial
  products are summed over ranks with one all-reduce each (in fp32: the residual stream is fp32; tp_comm.py
  has the other ways: NCCL in the model's dtype, a one-shot kernel over symmetric memory);
- query heads are split evenly; KV heads are split too, or replicated when there are fewer KV heads than
  ranks (rank r then keeps KV head r // (size / num_kv_heads), the one its query heads read);
- the embedding table, the norms and the LM head are **replicated**: every rank embeds its inputs itself;
  with `vocab_parallel` (opt-in) a decode step of a plain batch (temperature or greedy) is
  **vocab-parallel** (`ShardRunner`, tp_head.py): each rank runs its slice of the head's rows (a view:
  publications still replace the whole) and reduces its logits to a few numbers per row, which one
  all-gather brings together into the exact sample of the whole; a batch that needs the whole distribution (top-k/top-p, min-p, repetition penalty,
  allowed tokens) and every prefill's first token are sampled by the driver alone on the whole head, so no
  logits move;
- a mixture-of-experts layer (moe.py) keeps its router replicated, so every rank routes every token to the
  same experts, and splits **every expert** like a dense MLP: each rank holds 1/size of every expert's
  intermediate features (gate/up rows of the stacked [E, 2I, H], down columns of [E, H, I]), runs the routed
  experts on its slice and all-reduces their sum once, as a dense layer's down_proj. The routes the driver
  records for routing replay are therefore every rank's.
A rank's shard is an ordinary model of a smaller `ModelSpec` (tp_shard.py `shard_spec`: heads and intermediate size
divided, the experts' too), so weights.py, layers.py, moe.py, attention.py and the KV cache (each rank's holds
its own KV heads) run on it unchanged; `TPLayerMath` only adds the two all-reduces, and `ShardRunner` uses it.

The driver runs the scheduler and the batching loop (engine.py, batching.py) and sends every rank each
forward before running its own share (`TPGroup.command`: a decode step's batch bucket and flags; the prompts
and page tables of a prefill; graph captures, page copies, weights, sleep and wake); the other ranks serve
those commands (tp_engine.py). A decode step's inputs (token ids, positions, page tables) move from the
driver's decode state to the others' on the device, inside the step (`ShardRunner.decode`), so the step,
broadcasts and all-reduces included, is captured in a CUDA graph per bucket on every rank as on one GPU.
Weights published to the driver are sliced there and each rank receives only its shard (`shard_tensor`, a
scatter; replicated tensors a broadcast).
"""

from __future__ import annotations

import dataclasses
import datetime
import pickle
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

from ascent.models.families import ModelSpec, same_name
from ascent.rollout.fast.fp8 import linear
from ascent.rollout.fast.layers import LayerMath, _linear_parts, rms_norm
from ascent.rollout.fast.moe import MoeLayerMath, experts_path, route
from ascent.rollout.fast.runner import ModelRunner, compile_step
from ascent.rollout.fast.state import DecodeState, Flags
from ascent.rollout.fast.tp_comm import SymmetricAllReduce, check_allreduce, symmetric_blocker
from ascent.rollout.fast.tp_head import combine, local_candidates, vocab_slice
from ascent.rollout.fast.tp_shard import is_sharded, shard_tensor
from ascent.rollout.fast.vision import RowImages

HEADER = 1024  # bytes of a command's first broadcast (TPGroup.command): a decode step's fits in it


@dataclass(frozen=True)
class TPGroup:
    """One replica's tensor-parallel ranks: this process's `rank` of `size` (rank 0 drives) and `pg`, a
    standalone gloo or NCCL process group of them (`tp_group`; not torch.distributed's default group, which
    a worker may use for something else), whose collectives run on `device` (CPU for gloo)."""

    rank: int
    size: int
    pg: Any = None
    device: torch.device = torch.device("cpu")
    store: Any = None  # the group's store (symmetric memory's rendezvous goes through it)
    name: str = "ascent-tp"  # unique per replica (its store's address)
    reduce: str = "nccl"  # how `all_reduce` sums (tp_comm.py: "nccl", "nccl-dtype", "symm")
    symm: SymmetricAllReduce | None = None  # the "symm" mode's buffers, where it runs

    def with_allreduce(self, mode: str, max_numel: int) -> TPGroup:
        """This group summing the row-parallel partials by `mode` (tp_comm.py); "symm" (a collective: every
        rank votes, then sets up its symmetric buffers of `max_numel` fp32 values) or, where any rank cannot,
        "nccl" on every rank with a warning saying why."""
        check_allreduce(mode)
        if mode != "symm":
            return dataclasses.replace(self, reduce=mode)
        why = symmetric_blocker(self.device, self.store)
        if not self.min(0 if why else 1):  # one rank's reason is every rank's fallback
            warnings.warn(f"tp_allreduce='symm': {why or 'another rank cannot'}; using 'nccl'.", stacklevel=2)
            return dataclasses.replace(self, reduce="nccl")
        store = dist.PrefixStore("symm", self.store)
        symm = SymmetricAllReduce(self.name, self.rank, self.size, store, self.pg, self.device, max_numel)
        return dataclasses.replace(self, reduce="symm", symm=symm)

    def command(self, *cmd: Any) -> None:
        """Driver: send every rank the next command (a tuple of plain values and CPU tensors): one broadcast
        of HEADER bytes (the pickle's length, then as much of it as fits), a second for the rest of a longer
        one. On CUDA the bytes go up from pinned memory without waiting for the steps in flight, so a decode
        step's command does not stall the driver's host (engine.py processes one step behind)."""
        data = pickle.dumps(cmd)
        head = bytearray(HEADER)
        head[:8] = len(data).to_bytes(8, "little")
        fits = HEADER - 8
        head[8 : 8 + min(len(data), fits)] = data[:fits]
        self.broadcast(self._upload(head))
        if len(data) > fits:
            self.broadcast(self._upload(bytearray(data[fits:])))

    def receive(self) -> tuple:
        """Other ranks: wait for the driver's next command."""
        head = torch.empty(HEADER, dtype=torch.uint8, device=self.device)
        self.broadcast(head)
        raw = head.cpu().numpy().tobytes()
        n, fits = int.from_bytes(raw[:8], "little"), HEADER - 8
        data = raw[8 : 8 + min(n, fits)]
        if n > fits:
            rest = torch.empty(n - fits, dtype=torch.uint8, device=self.device)
            self.broadcast(rest)
            data += rest.cpu().numpy().tobytes()
        return pickle.loads(data)

    def _upload(self, data: bytearray) -> Tensor:
        """Host bytes -> a uint8 tensor on the group's device (pinned and non-blocking on CUDA)."""
        t = torch.frombuffer(data, dtype=torch.uint8)
        if self.device.type != "cuda":
            return t
        return t.pin_memory().to(self.device, non_blocking=True)

    def broadcast(self, t: Tensor) -> None:
        """t (contiguous) from the driver to every rank, in place."""
        self.pg.broadcast(t, 0).wait()

    def scatter(self, out: Tensor, parts: list[Tensor] | None) -> None:
        """Driver: parts[r] to rank r; every rank: its part into `out` (same shape on every rank)."""
        self.pg.scatter(out, parts if parts is not None else [], 0).wait()

    def all_reduce(self, t: Tensor) -> Tensor:
        """t summed over the ranks, as fp32: in fp32 by NCCL/gloo (in place on the fp32 copy), or in t's
        dtype ("nccl-dtype"), or by the one-shot kernel over symmetric memory ("symm", up to its size)."""
        if self.symm is not None and self.symm.fits(t):
            return self.symm(t)
        t = t.contiguous() if self.reduce == "nccl-dtype" else t.float()
        self.pg.allreduce(t).wait()
        return t.float()

    def all_gather(self, t: Tensor) -> Tensor:
        """t [n, ...] (the same shape on every rank) -> [size, n, ...]: every rank's t, in rank order."""
        t = t.contiguous()
        out = torch.empty(self.size * t.shape[0], *t.shape[1:], dtype=t.dtype, device=t.device)
        self.pg._allgather_base(out, t).wait()
        return out.view(self.size, *t.shape)

    def min(self, n: int) -> int:
        """The smallest of every rank's n (how many KV cache pages every rank can hold)."""
        t = torch.tensor([n], device=self.device)
        opts = dist.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp(dist.ReduceOp.MIN)
        self.pg.allreduce([t], opts).wait()
        return int(t.item())


def tp_group(
    rank: int, size: int, host: str, port: int, device: torch.device, timeout_s: float = 600
) -> TPGroup:
    """Join (rank 0: host) the replica's TCPStore at host:port and form its process group: NCCL when
    `device` is CUDA, else gloo. Waits up to `timeout_s` for every rank (then raises)."""
    timeout = datetime.timedelta(seconds=timeout_s)
    store = dist.PrefixStore("ascent-tp", dist.TCPStore(host, port, size, rank == 0, timeout=timeout))
    pg: Any
    if device.type == "cuda":
        from torch.distributed import ProcessGroupNCCL  # deferred: absent from CPU builds of torch

        opts = ProcessGroupNCCL.Options()
        opts._timeout = timeout
        pg = ProcessGroupNCCL(store, rank, size, opts)
    else:
        from torch.distributed import ProcessGroupGloo  # (as transport/broadcast.py imports it)

        pg, device = ProcessGroupGloo(store, rank, size, timeout), torch.device("cpu")
    return TPGroup(rank, size, pg, device, store, f"ascent-tp-{host}:{port}")


class TPLayerMath(LayerMath):
    """LayerMath of a shard (a `shard_spec`), with the row-parallel products summed over the ranks."""

    def __init__(self, spec: ModelSpec, tp: TPGroup):
        super().__init__(spec)
        self.tp = tp

    def attn_out(
        self,
        x: Tensor,
        attn: Tensor,
        o_w: Tensor,
        ln_w: Tensor,
        gate_up_w: tuple[Tensor, ...],
        down_w: Tensor,
    ) -> tuple[Tensor, Tensor | None]:
        """x [T, H] residual, attn [T, local heads * d] -> (x after o_proj (all-reduced) and its residual
        add, the SwiGLU MLP's output on this rank's intermediate slice, all-reduced (fp32): left pending, the
        next layer's compiled `attn_in` adds it, as `LayerMath.attn_out`'s; here always, since this add
        ran eagerly after the collective, its own kernel in any dtype)."""
        x, part = self.mlp(x, self.tp.all_reduce(linear(attn, o_w)), ln_w, gate_up_w, down_w)
        return x, self.tp.all_reduce(part)

    def mlp(
        self, x: Tensor, o_sum: Tensor, ln_w: Tensor, gate_up_w: tuple[Tensor, ...], down_w: Tensor
    ) -> tuple[Tensor, Tensor]:
        """x [T, H] residual, o_sum [T, H] the all-reduced o_proj output -> (x + o_sum, this rank's share of
        the SwiGLU MLP's output [T, H], to be all-reduced). No collective: `torch.compile` takes it whole."""
        x = x + o_sum
        h = rms_norm(x, ln_w, self.eps).to(down_w.dtype)
        gate, up = _linear_parts(h, gate_up_w, None).split(self.inter, dim=-1)
        return x, linear(F.silu(gate) * up, down_w)


class TPMoeLayerMath(TPLayerMath, MoeLayerMath):
    """TPLayerMath of a mixture-of-experts shard: the replicated router picks the same experts on every rank,
    each rank runs them on its slice of their intermediate features, and their weighted sum is all-reduced
    once (the dense layers of the model as `TPLayerMath`)."""

    def __init__(self, spec: ModelSpec, tp: TPGroup, moe_path: str = "dense"):
        super().__init__(spec, tp)
        self.experts = experts_path(moe_path)  # on this rank's slice of every expert, either path

    def attn_out(
        self,
        x: Tensor,
        attn: Tensor,
        o_w: Tensor,
        ln_w: Tensor,
        gate_up_w: tuple[Tensor, ...],
        down_w: Tensor,
    ) -> tuple[Tensor, Tensor | None]:
        """As `TPLayerMath.attn_out`; in an MoE layer (3-D `down_w`) through the routed experts, returning
        the complete x and nothing pending (as `attn_out_routed`)."""
        if down_w.dim() == 2:
            return TPLayerMath.attn_out(self, x, attn, o_w, ln_w, gate_up_w, down_w)
        return self.attn_out_routed(x, attn, o_w, ln_w, gate_up_w, down_w)[0], None

    def attn_out_routed(
        self,
        x: Tensor,
        attn: Tensor,
        o_w: Tensor,
        ln_w: Tensor,
        gate_up_w: tuple[Tensor, ...],
        down_w: Tensor,
    ) -> tuple[Tensor, Tensor]:
        """x [T, H], attn [T, local heads * d] -> (x after o_proj (all-reduced), the residual add and the
        experts on this rank's slice (all-reduced), the chosen expert ids [T, k], the same on every rank)."""
        x, part, ids = self.moe_mlp(x, self.tp.all_reduce(linear(attn, o_w)), ln_w, gate_up_w, down_w)
        return x + self.tp.all_reduce(part), ids

    def moe_mlp(
        self, x: Tensor, o_sum: Tensor, ln_w: Tensor, gate_up_w: tuple[Tensor, ...], down_w: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        """x [T, H] residual, o_sum [T, H] the all-reduced o_proj output -> (x + o_sum, this rank's share of
        the experts' weighted sum [T, H], to be all-reduced, the chosen expert ids [T, k]): the MoE block
        between the two collectives, which `torch.compile` takes whole as `TPLayerMath.mlp` (norm, router,
        top-k, the sort, the grouped matmuls and the combine in one graph, not ~25 eager kernels)."""
        router, gate_up = gate_up_w
        x = x + o_sum
        h = rms_norm(x, ln_w, self.eps).to(down_w.dtype)
        ids, weights = route(F.linear(h, router), self.top_k, self.norm_topk)
        return x, self.experts(h, ids, weights, gate_up, down_w), ids


class ShardRunner(ModelRunner):
    """A ModelRunner over one rank's shard (spec = `shard_spec`): its layers all-reduce (`TPLayerMath`).
    Every rank runs the same forwards; only the driver's outputs are used (hidden states, sampled tokens,
    an MoE model's routes). `vocab_parallel`: a plain decode step's LM head and sampling are split over the
    ranks by vocabulary (tp_head.py); else the driver runs them alone on the whole (replicated) head."""

    def __init__(self, *args: Any, tp: TPGroup, vocab_parallel: bool = False, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.tp = tp
        moe_path = kwargs.get("moe_path", "dense")
        self.math = (
            TPMoeLayerMath(self.spec, tp, moe_path) if self.spec.is_moe else TPLayerMath(self.spec, tp)
        )
        self.attn_out = self.math.attn_out  # (uncompiled: it holds the collectives; the MLP between is)
        self.attn_out_routed = getattr(self.math, "attn_out_routed", None)
        self.vocab = vocab_slice(len(self.w.lm_head), tp.rank, tp.size) if vocab_parallel else None
        self.candidates, self.combine = local_candidates, combine
        if kwargs.get("compile"):
            self.math.mlp = compile_step(self.math.mlp)  # type: ignore[method-assign]
            if isinstance(self.math, TPMoeLayerMath):  # the MoE block between the collectives too
                self.math.moe_mlp = compile_step(self.math.moe_mlp)  # type: ignore[method-assign]
            self.candidates, self.combine = compile_step(local_candidates), compile_step(combine)

    @torch.no_grad()
    def decode(self, st: DecodeState, b: int, flags: Flags, max_len: int | None = None) -> None:
        """Every rank: rows [0, b) of the driver's step inputs reach this rank's `st` on the device in one
        broadcast (`_share_inputs`: no host round trip, so a CUDA graph of the step holds it too), then the
        driver runs the whole step (layers, head, sampling, advance: ModelRunner.decode) and the other ranks
        the layers alone; or, vocab-parallel on a plain batch, every rank runs the layers and its slice of
        the head, and the driver advances (`vocab_parallel_sample`)."""
        split = self.vocab is not None and not (
            flags.top_k_top_p or flags.min_p or flags.penalty or flags.restricted or self.allowed is not None
        )
        sampling = self._share_inputs(st, b, split and not flags.all_greedy)
        if self.tp.rank == 0 and not split:
            super().decode(st, b, flags, max_len)
            return
        routes = st.out_routes[:b] if st.out_routes is not None and self.tp.rank == 0 else None
        groups = st.groups[:b] if st.groups is not None else None
        rows = st.input_ids[:b], st.positions[:b], st.block_tables[:b], st.active[:b]
        x = self.decode_hidden(*rows, max_len, None, routes, groups)
        if split:
            tokens, logprobs = self.vocab_parallel_sample(x, st, b, flags, sampling)
            if self.tp.rank == 0:
                st.advance(b, tokens, logprobs, flags, self.step_rows)

    def _share_inputs(self, st: DecodeState, b: int, sampling: bool) -> tuple[Tensor, Tensor, Tensor] | None:
        """Rows [0, b) of the driver's token ids, positions, active flags (then, with `sampling`, seeds,
        sampling steps and temperatures' bits), page tables (and shared-prefix groups, state.py), packed as
        int64 [b, 3 (+ 3) + pages (+ 2 + members)]: one broadcast (a latency-bound collective) instead of one
        per tensor; the other ranks unpack them into their `st`. -> the rows' (temperature [b], seeds [b],
        steps [b]) with `sampling`, else None."""
        cols = [st.input_ids, st.positions, st.active]
        if sampling:
            cols += [st.seeds, st.steps, st.temperature.view(torch.int32)]
        n, dev = len(cols), st.input_ids.device
        tables = [st.block_tables] + ([st.groups] if st.groups is not None else [])
        width = sum(t.shape[1] for t in tables)
        if self.tp.rank == 0:
            packed = torch.cat([*(c[:b, None].long() for c in cols), *(t[:b].long() for t in tables)], dim=1)
        else:
            packed = torch.empty(b, n + width, dtype=torch.long, device=dev)
        self.tp.broadcast(packed)
        if self.tp.rank != 0:
            for i, t in enumerate((st.input_ids, st.positions, st.active)):
                t[:b].copy_(packed[:, i])
            for t, part in zip(tables, packed[:, n:].split([t.shape[1] for t in tables], dim=1), strict=True):
                t[:b].copy_(part)
        if not sampling:
            return None
        return packed[:, 5].to(torch.int32).view(torch.float32), packed[:, 3], packed[:, 4]

    def vocab_parallel_sample(
        self,
        x: Tensor,
        st: DecodeState,
        b: int,
        flags: Flags,
        sampling: tuple[Tensor, Tensor, Tensor] | None,
    ) -> tuple[Tensor, Tensor]:
        """x [b, H] last hidden states -> (tokens [b], logprobs [b]) of a plain batch (no filters, penalty
        or masks): this rank's logits slice reduced to per-row candidates (tp_head.py), gathered from every
        rank (one all-gather of [b, 5] values) and combined. `sampling`: the rows' (temperature, seeds,
        steps) as the driver holds them (`_share_inputs`); None for an all-greedy batch (no noise; every
        temperature then scales by 1)."""
        assert self.vocab is not None
        start, end = self.vocab
        temperature, seeds, steps = sampling or (st.temperature[:b], st.seeds[:b], st.steps[:b])
        logits = self.logits(x, self.w.norm, self.w.lm_head[start:end])
        stats = self.candidates(logits, temperature, seeds, steps, start, flags.all_greedy)
        return self.combine(self.tp.all_gather(stats))


class DriverRunner(ShardRunner):
    """The driver's runner: sends each prefill's inputs to the other ranks, then runs its own share (a
    decode step's command is the engine's: TPEngine._decode_step)."""

    def prefill(
        self,
        suffixes: list[list[int]],
        starts: list[int],
        tables: list[list[int]],
        images: list[RowImages | None] | None = None,
    ) -> Tensor:
        assert images is None or not any(images)  # check_shardable refuses vision-language models
        self.tp.command("prefill", suffixes, starts, tables)
        return super().prefill(suffixes, starts, tables)


def scatter_shards(
    named: Iterable[tuple[str, Tensor]],
    spec: ModelSpec,
    tp: TPGroup,
    device: torch.device,
    rename: Callable[[str], str] = same_name,
) -> Iterator[tuple[str, Tensor]]:
    """Driver: full tensors (any device, dtype) -> (name, the driver's shard), each other rank receiving
    only its own shard (a scatter; replicated tensors a broadcast) through `receive_shard`."""
    for name, t in named:
        key = rename(name)
        t = t.detach().to(device)
        tp.command("weight", name, tuple(t.shape), t.dtype)
        if is_sharded(key):
            parts = [shard_tensor(key, t, spec, r, tp.size).contiguous() for r in range(tp.size)]
            out = torch.empty_like(parts[0])
            tp.scatter(out, parts)
        else:
            out = t.contiguous()
            tp.broadcast(out)
        yield name, out


def receive_shard(
    cmd: tuple,
    spec: ModelSpec,
    tp: TPGroup,
    device: torch.device,
    rename: Callable[[str], str] = same_name,
) -> tuple[str, Tensor]:
    """Another rank: its shard of the tensor that the driver's `scatter_shards` announced with `cmd`."""
    _, name, shape, dtype = cmd
    key = rename(name)
    full = torch.empty(shape, dtype=dtype, device="meta")
    out = torch.empty_like(shard_tensor(key, full, spec, tp.rank, tp.size), device=device).contiguous()
    if is_sharded(key):
        tp.scatter(out, None)
    else:
        tp.broadcast(out)
    return name, out
