"""The decode step's kernel time by category, for the rollout benchmarks (rollout.py, tp_rollout.py,
moe_tp.py).

`profile_decode(generate, cuda)` runs torch.profiler over a 1-new-token and a (1 + steps)-new-token run of the
same workload and takes their difference over `steps`: what one decode step costs, the prefill cancelled out.
On CUDA it counts GPU kernel time (CUDA graph replays included); on CPU the operators' own host time, which
only checks the path. `categorize` sums the per-kernel table into categories by a naming rule:
`dense_category` and `tp_category` (matmuls, attention, fused elementwise; NCCL apart: a dense model's parts)
or `moe_category` (a routed MoE step's parts: grouped matmuls, routing, the sort and its copies).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

MOE_CATEGORIES = (  # (category, name fragments), first match wins: the order matters
    ("nccl", ("nccl",)),
    ("grouped_mm", ("grouped", "groupproblemshape")),
    ("router (topk/softmax)", ("topk", "softmax")),
    (
        "sort/searchsorted/index copies",
        ("sort", "searchsorted", "cumsum", "index", "scatter", "gather", "arange"),
    ),
    ("attention", ("_split_kernel", "_combine_kernel", "attention", "flash", "sdpa")),
    ("norms", ("rsqrt", "norm")),
    ("matmul (dense)", ("gemm", "cutlass", "nvjet", "xmma", "cublas", "gemv", "aten::mm", "aten::addmm")),
)


def dense_category(name: str) -> str:
    """A kernel's category in a dense model's step (bench/rollout.py's table)."""
    n = name.lower()
    if "_split_kernel" in n or "_combine_kernel" in n:
        return "attention (triton)"
    if any(k in n for k in ("gemm", "cutlass", "nvjet", "sm90_xmma", "cublas")):
        return "matmul"
    if "index" in n or "scatter" in n or "gather" in n:
        return "index/scatter"
    if n.startswith("triton"):
        return "fused elementwise (inductor)"
    return "other"


def tp_category(name: str) -> str:
    """`dense_category`, NCCL collectives apart (bench/tp_rollout.py's table)."""
    return "all-reduce/broadcast (nccl)" if "nccl" in name.lower() else dense_category(name)


def moe_category(name: str) -> str:
    """A kernel's (or CPU operator's) category in an MoE step: MOE_CATEGORIES, else elementwise or other.
    Inductor's fused kernels are named after the operators they fuse (triton_poi_fused_add_index_mul_...),
    so a fused kernel falls in the first category whose operator it holds."""
    n = name.lower()
    for category, parts in MOE_CATEGORIES:
        if any(p in n for p in parts):
            return category
    if n.startswith("triton") or any(p in n for p in ("elementwise", "silu", "mul", "add", "copy", "cat")):
        return "elementwise (silu, adds, casts)"
    return "other"


def profile_decode(
    generate: Callable[[int], Any], cuda: bool, steps: int = 32
) -> dict[str, tuple[float, float]]:
    """Per kernel (CUDA) or operator (CPU): (ms, launches) a decode step; `generate(n)` runs the workload
    with n new tokens a row and returns once it is done."""
    from torch.profiler import ProfilerActivity, profile  # deferred: only a profiling run needs it

    def kernels(n: int) -> dict[str, tuple[float, int]]:
        with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
            generate(n)
            if cuda:
                torch.cuda.synchronize()
        out: dict[str, tuple[float, int]] = {}
        for e in prof.key_averages():
            t = getattr(e, "device_time_total", 0) if cuda else e.self_cpu_time_total
            if t and e.device_type.name == ("CUDA" if cuda else "CPU"):
                out[e.key] = (t, e.count)
        return out

    a, b = kernels(1), kernels(1 + steps)
    return {
        k: ((t - a.get(k, (0, 0))[0]) / steps / 1e3, (c - a.get(k, (0, 0))[1]) / steps)
        for k, (t, c) in b.items()
    }


def categorize(
    per_kernel: dict[str, tuple[float, float]], category: Callable[[str], str], top: int = 12
) -> dict:
    """{categories: {name: ms a step}, launches: {name: kernels a step}, top: the `top` costliest kernels
    as (name, ms, launches)}."""
    cats: dict[str, float] = {}
    launches: dict[str, float] = {}
    for k, (ms, n) in per_kernel.items():
        cat = category(k)
        cats[cat] = cats.get(cat, 0.0) + ms
        launches[cat] = launches.get(cat, 0.0) + n
    worst = sorted(per_kernel.items(), key=lambda kv: -kv[1][0])[:top]
    return dict(categories=cats, launches=launches, top=[(k[:160], ms, n) for k, (ms, n) in worst])


def table(profile: dict) -> list[str]:
    """The categories as lines, costliest first, with their share and kernels a step; then the total."""
    cats, launches = profile["categories"], profile.get("launches", {})
    total = sum(cats.values()) or 1.0
    lines = [
        f"  {cat:34s} {ms:8.3f} ms/step {100 * ms / total:5.1f}%  {launches.get(cat, 0):7.1f} kernels/step"
        for cat, ms in sorted(cats.items(), key=lambda kv: -kv[1])
    ]
    lines.append(f"  {'total (kernel time)':34s} {sum(cats.values()):8.3f} ms/step")
    return lines
