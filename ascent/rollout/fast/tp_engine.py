"""The tensor-parallel fast engine: one replica over `size` processes (tensor_parallel.py has the math).

Every rank builds the same engine over its shard (`build_fast_engine(..., tensor_parallel=TPGroup(rank,
size))`). Rank 0, the driver, is the engine the rest of ascent sees: its scheduler and batching loop run
there, and each forward it runs, each page copy, weight publication, sleep and wake is first sent to the
other ranks as a command (`TPGroup.command`). The other ranks call `serve()`, which runs those commands until
the driver's `shutdown()`. Commands are sent only by the thread holding the engine's weights (the decode loop
between its step boundaries, a publisher inside `publication`: swap.py), so they never interleave.

A decode step is one command (its bucket, flags and context bound: `_decode_step`) on the same code path as
one process: every rank replays its CUDA graph of that bucket, or runs the step eagerly. Graphs are captured
on every rank by one command per `_capture`, so every rank captures the same buckets in the same order (the
collectives inside them pair up). With `compile`, what lies between the all-reduces is compiled as on one
GPU (the o_proj sum's residual add, the norm and this rank's MLP share: `TPLayerMath.mlp`; an MoE layer's
router and experts: `TPMoeLayerMath.moe_mlp`; the down_proj sum's residual add: the next layer's `attn_in`,
layers.py); the collectives run between compiled pieces. The LM head and sampling run on the driver
alone, or, with `vocab_parallel`, a plain batch's are split over the ranks by vocabulary (tensor_parallel.py,
tp_head.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from ascent.rollout.fast.engine import FastEngine
from ascent.rollout.fast.state import Flags
from ascent.rollout.fast.tensor_parallel import ShardRunner, receive_shard, scatter_shards


class TPEngine(FastEngine):
    """A FastEngine whose runner is a `ShardRunner` (the driver's: `DriverRunner`); see the module doc.
    `full_spec` is the whole model's spec (how incoming full tensors are sliced)."""

    runner: ShardRunner

    def __init__(self, runner: ShardRunner, *args: Any, full_spec: Any, **kwargs: Any):
        super().__init__(runner, *args, **kwargs)
        self.tp, self.full_spec = runner.tp, full_spec
        self.children: list[Any] = []  # the other ranks' processes, when this driver started them
        self._stopped = False
        self._orig_copy_pages = self.cache.copy_pages
        if self.tp.rank == 0:
            self.cache.copy_pages = self._copy_pages  # type: ignore[method-assign]

    # ---- driver -----------------------------------------------------------------------------------------

    def update_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> None:
        """As FastEngine's; every full tensor is sliced here and each rank receives only its shard."""
        with self.publication():
            shards = scatter_shards(named_tensors, self.full_spec, self.tp, self.device, self.weights.rename)
            self.weights.update(shards)

    def sleep(self, release_weights: bool = False) -> None:
        self.tp.command("sleep", release_weights)
        super().sleep(release_weights)

    def wake(self) -> None:
        self._check_weights()
        if self.asleep:
            self.tp.command("wake")
        super().wake()

    def _agree_pages(self, pages: int) -> int:
        """Every rank sizes its pool at wake (a collective: the driver's wake command brought them here)."""
        return self.tp.min(pages)

    def shutdown(self) -> None:
        """Driver: let the other ranks' `serve()` return (and the processes it started end). Once."""
        if self._stopped:
            return
        self._stopped = True
        self.tp.command("stop")
        for child in self.children:
            child.join(timeout=60)

    def _decode_step(self, b: int, flags: Flags, max_len: int) -> None:
        """As FastEngine's, every rank running it (the driver sends it first)."""
        if self.tp.rank == 0:
            self.tp.command("step", b, flags, max_len)
        super()._decode_step(b, flags, max_len)

    def _capture(self, flags: Flags, rows: int) -> None:
        """As FastEngine's, every rank capturing the same graphs (the driver sends it first)."""
        if self.tp.rank == 0:
            self.tp.command("capture", flags, rows)
        super()._capture(flags, rows)

    def _copy_pages(self, src: list[int], dst: list[int]) -> None:
        if src:
            self.tp.command("copy_pages", src, dst)
        self._orig_copy_pages(src, dst)

    # ---- the other ranks --------------------------------------------------------------------------------

    def serve(self) -> None:
        """Other ranks: run the driver's commands until it shuts down (raises on the driver's rank)."""
        if self.tp.rank == 0:
            raise RuntimeError("TPEngine.serve runs on the ranks other than 0; rank 0 drives the engine.")
        dev = self.device
        while True:
            cmd = self.tp.receive()
            op = cmd[0]
            if op == "stop":
                return
            if op == "step":
                self._decode_step(*cmd[1:])
            elif op == "capture":
                self._capture(*cmd[1:])
            elif op == "prefill":
                self.runner.prefill(*cmd[1:])
            elif op == "copy_pages":
                self._orig_copy_pages(*cmd[1:])
            elif op == "weight":
                shard = receive_shard(cmd, self.full_spec, self.tp, dev, self.weights.rename)
                with torch.no_grad():
                    self.weights.update([shard])
            elif op == "sleep":
                FastEngine.sleep(self, cmd[1])
            elif op == "wake":
                FastEngine.wake(self)
            else:
                raise RuntimeError(f"tensor-parallel rank {self.tp.rank}: unknown command {op!r}")
