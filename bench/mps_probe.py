"""Two processes on one GPU, a compute-bound matmul loop and a bandwidth-bound copy loop: each alone, then
both at once. Run once as is (time slices) and once under an MPS daemon (CUDA_MPS_PIPE_DIRECTORY set) to see
whether the two overlap. Prints seconds per loop.

    python3 bench/mps_probe.py plain
    nvidia-cuda-mps-control -d && python3 bench/mps_probe.py mps; echo quit | nvidia-cuda-mps-control
"""

from __future__ import annotations

import multiprocessing as mp
import sys
import time
from collections.abc import Callable
from typing import Any

REPEATS = {"mm": 400, "cp": 2000}


def _loop(kind: str) -> Callable[[], Any]:
    import torch

    if kind == "mm":
        a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        b = torch.randn_like(a)
        return lambda: a @ b
    src = torch.empty(2**30, device="cuda", dtype=torch.uint8)
    dst = torch.empty_like(src)
    return lambda: dst.copy_(src)


def work(kind: str, queue: Any, start: Any) -> None:
    import torch

    step = _loop(kind)
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    start.wait()
    t0 = time.perf_counter()
    for _ in range(REPEATS[kind]):
        step()
    torch.cuda.synchronize()
    queue.put((kind, time.perf_counter() - t0))


def run(kinds: list[str]) -> dict[str, float]:
    ctx = mp.get_context("spawn")
    queue, start = ctx.Queue(), ctx.Barrier(len(kinds))
    procs = [ctx.Process(target=work, args=(k, queue, start)) for k in kinds]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    return dict(queue.get() for _ in kinds)


if __name__ == "__main__":
    tag = sys.argv[1] if len(sys.argv) > 1 else "run"
    print(tag, "alone:", run(["mm"]), run(["cp"]), "together:", run(["mm", "cp"]), flush=True)
