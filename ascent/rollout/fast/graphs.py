"""CUDA graphs of the decode step, one per (batch-size bucket, sampling flags).

A step over b active rows runs the graph of the smallest bucket >= b; rows past b in that bucket are idle.
Graphs read and write only persistent tensors (DecodeState, KV cache, weights), so a replay needs no
input copies. Capture happens while every row is idle (at the start of `generate`), because warm-up and
capture execute the step for real. A recapture after sleep warms up only its first bucket (the steps are
compiled and tuned by then). Larger buckets are captured first and all share one memory pool, and one side
stream: cuBLAS keeps a workspace per stream it ran on, so a fresh stream per graph would pile them up.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

import torch

K = TypeVar("K", bound=Hashable)


def default_buckets(max_rows: int) -> list[int]:
    """2, 4, 8, 16, 32, then steps of 16 to 64, of 32 beyond, ending at max_rows."""
    out, b = [], 2
    while b < max_rows:
        out.append(b)
        b = b * 2 if b < 32 else b + (16 if b < 64 else 32)
    return sorted(set(out + [max_rows]))


def pick_bucket(buckets: list[int], n: int) -> int:
    """Smallest bucket holding n rows."""
    for b in buckets:
        if b >= n:
            return b
    raise ValueError(f"{n} rows exceed the largest bucket {buckets[-1]}")


class GraphRunner(Generic[K]):
    """Captures `step(b, key)` per bucket b and replays it (K: the graph key type, e.g. sampling flags)."""

    def __init__(self, step: Callable[[int, K], None], buckets: list[int]):
        self.step, self.buckets = step, buckets
        self.graphs: dict[tuple[int, K], torch.cuda.CUDAGraph] = {}
        self.pool: torch.cuda._POOL_HANDLE | None = None  # shared by every graph once the first is captured
        self.stream: torch.cuda.Stream | None = None  # warm-up and capture stream, shared by every graph
        self.warmed: set[tuple[int, K]] = set()  # graphs captured before: their step is compiled and tuned

    def capture(self, key: K, up_to: int) -> None:
        """Capture the graphs of `key` for every bucket needed by up to `up_to` rows (rows must be idle)."""
        top = pick_bucket(self.buckets, up_to)
        first = True
        for b in sorted((b for b in self.buckets if b <= top), reverse=True):
            if (b, key) in self.graphs:
                continue
            side = self.stream = self.stream or torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            # a step seen before (a recapture after sleep) is compiled and tuned already: one warm-up run
            # per call re-creates what sleep freed (cuBLAS workspace), the other buckets capture directly
            warmups = 2 if (b, key) not in self.warmed else int(first)
            with torch.cuda.stream(side):
                for _ in range(warmups):
                    self.step(b, key)
            first = False
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool, stream=side):
                self.step(b, key)
            if self.pool is None:
                self.pool = graph.pool()
            self.graphs[(b, key)] = graph
            self.warmed.add((b, key))

    def replay(self, b: int, key: K) -> None:
        self.graphs[(b, key)].replay()

    def clear(self) -> None:
        """Drop every graph and its memory pool (sleep, or the cache moved)."""
        self.graphs.clear()
        self.pool = None


def clear_cublas_workspaces() -> None:
    """Free cuBLAS's per-stream workspaces (tens of MiB per stream that ran a matmul; rebuilt on next use)."""
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        clear()
