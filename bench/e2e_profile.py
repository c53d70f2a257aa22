"""Where the trainer's GPU time goes: torch.profiler over chosen worker methods, kernels grouped by kind.

Used by bench/e2e.py --profile: one extra iteration runs with the trainer's `compute_logprobs` and `update`
under the profiler; the kernels are summed into categories (matrix products, flash attention, fused
optimizer, softmax/logits, reductions, elementwise, copies and casts) and compared with the wall time of
the calls (the difference is time the GPU waited for the host). Also: timing of the engine's CUDA-graph
capture, which runs again after every wake.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Iterator
from typing import Any

import torch

CATEGORIES = (  # first match wins
    ("attention", ("flash", "fmha", "attention")),
    ("gemm", ("gemm", "cutlass", "nvjet", "xmma", "cublas", "wgmma", "splitk")),
    ("optimizer", ("multi_tensor", "adam", "foreach")),
    ("softmax/logits", ("softmax", "logsumexp")),
    ("reduce", ("reduce", "norm")),
    ("copy/cast", ("copy", "cat", "index", "gather", "scatter", "fill")),
    ("elementwise", ("elementwise", "vectorized", "unrolled", "triton")),
)


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def category(kernel: str) -> str:
    name = kernel.lower()
    for cat, keys in CATEGORIES:
        if any(k in name for k in keys):
            return cat
    return "other"


@contextlib.contextmanager
def profiled_methods(obj: Any, names: tuple[str, ...], out: dict[str, Any]) -> Iterator[None]:
    """Profile each call of obj.<name> (only those calls) while the block runs; fill `out` at the end."""
    walls: dict[str, float] = {}
    kernels: dict[str, float] = {}

    def wrap(name: str, fn: Any) -> Any:
        @functools.wraps(fn)
        def inner(*args: Any, **kwargs: Any) -> Any:
            from torch.profiler import ProfilerActivity, profile

            cuda = torch.cuda.is_available()
            _sync()
            t0 = time.perf_counter()
            with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
                result = fn(*args, **kwargs)
                _sync()
            walls[name] = walls.get(name, 0.0) + time.perf_counter() - t0
            _add_kernels(prof, kernels)
            return result

        return inner

    for n in names:
        setattr(obj, n, wrap(n, getattr(obj, n)))
    try:
        yield
    finally:
        for n in names:
            delattr(obj, n)  # back to the class's method
    out.update(summarize(kernels, walls))


def _add_kernels(prof: Any, kernels: dict[str, float]) -> None:
    """Add the profile's kernel seconds (CPU op seconds without CUDA) to `kernels` by name."""
    cuda = torch.cuda.is_available()
    for e in prof.key_averages():
        t = (
            (getattr(e, "device_time_total", 0) or getattr(e, "cuda_time_total", 0))
            if cuda
            else e.self_cpu_time_total
        )
        if t and (e.device_type.name == "CUDA" or not cuda):
            kernels[e.key] = kernels.get(e.key, 0.0) + t / 1e6


def summarize(kernels: dict[str, float], walls: dict[str, float]) -> dict[str, Any]:
    """Kernel seconds by category, the top kernels, and the calls' wall seconds."""
    cats: dict[str, float] = {}
    for k, s in kernels.items():
        cats[category(k)] = cats.get(category(k), 0.0) + s
    top = sorted(kernels.items(), key=lambda kv: -kv[1])[:40]
    return {
        "wall_s": walls,
        "kernel_s": sum(kernels.values()),
        "categories_s": dict(sorted(cats.items(), key=lambda kv: -kv[1])),
        "top_kernels_s": [(k[:160], s) for k, s in top],
    }


class CaptureClock:
    """Accumulates the seconds the engine spends capturing CUDA graphs (after each wake)."""

    def __init__(self, engine: Any) -> None:
        self.seconds = 0.0
        graphs = getattr(engine, "graphs", None)
        if graphs is None:
            return
        original = graphs.capture

        def capture(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - t0

        graphs.capture = capture

    def take(self) -> float:
        seconds, self.seconds = self.seconds, 0.0
        return seconds
