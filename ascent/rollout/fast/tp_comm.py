"""How a tensor-parallel replica sums its row-parallel partial products (`TPGroup.all_reduce`'s modes).

A decode step of a 7B model on two GPUs makes 56 all-reduces of [rows, hidden] fp32 (1.8 MB at 128 rows),
each ~33 us through NCCL: latency, not bandwidth. The modes (`build_fast_engine(tp_allreduce=...)`):
- "nccl" (default off CUDA, and the fallback): NCCL in fp32. The residual stream is fp32 (layers.py), so the
  o_proj/down_proj partials (model dtype) are cast up first and their sum rounds once, in fp32, as one
  process's fp32 residual add; the equality tests against one process rely on that.
- "nccl-dtype": NCCL in the partials' own dtype (bf16 for a bf16 model): half the bytes, but the sum rounds
  to bf16 before it joins the fp32 residual, so logprobs move in the last bits and greedy tokens may flip at
  near-ties.
- "symm" (default on CUDA): fp32 one-shot all-reduce over symmetric memory (`SymmetricAllReduce`): one kernel
  copies this rank's partial into its symmetric buffer, waits for the peers at a barrier and reads their
  buffers over NVLink/P2P. No multicast (`TORCH_SYMM_MEM_DISABLE_MULTICAST=1` unless set otherwise; no
  multimem ops). Tensors up to the decode step's size only; larger ones (prefills) take NCCL. CUDA only: a CPU
  (gloo) replica, or a torch without the ops, falls back to "nccl" with a warning. On 2x H200 (torch 2.11) it
  made a 7B TP=2 step 1.18x shorter (6.34 -> 5.37 ms, bench/tp_rollout.py).
One "symm" replica per driving process: torch numbers the store exchanges of symmetric memory's rendezvous
with a counter per process, so a second replica driven from the same process, whose other ranks are fresh
processes (counters at 0), would wait in `rendezvous` forever (measured: the second "symm" replica of one
process hung there). Every rank therefore votes before the rendezvous (`symmetric_blocker`, one MIN
all-reduce): if the driver already set one up, or any rank cannot, the whole replica takes "nccl" with a
warning saying why.
Every mode is captured in the decode step's CUDA graphs (no host sync).
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import Tensor

ALLREDUCE = ("nccl", "nccl-dtype", "symm")
_SETUPS = [0]  # symmetric-memory all-reduces this process has set up (see the module's docstring)


def check_allreduce(mode: str) -> None:
    """Refuse an unknown mode, naming the choices."""
    if mode not in ALLREDUCE:
        raise ValueError(f"tp_allreduce={mode!r}: use one of {list(ALLREDUCE)}.")


def symmetric_unavailable(device: torch.device) -> str | None:
    """Why the "symm" mode cannot run on `device` (None: it can)."""
    if device.type != "cuda":
        return f"symmetric memory needs CUDA ranks (NCCL); this replica runs on {device}"
    try:
        import torch.distributed._symmetric_memory  # noqa: F401  (deferred: registers the symm_mem ops)
        from torch._C._distributed_c10d import _SymmetricMemory  # noqa: F401  (not in every build)
    except ImportError:
        return "this torch build has no symmetric memory"
    if not hasattr(torch.ops.symm_mem, "one_shot_all_reduce"):
        return f"torch {torch.__version__} has no symm_mem.one_shot_all_reduce"
    return None


def symmetric_blocker(device: torch.device, store: Any) -> str | None:
    """Why this rank cannot join a "symm" replica (None: it can): the device or build, a group without a
    store, or symmetric memory set up in this process before (its rendezvous counter is past the fresh
    ranks' ones)."""
    why = symmetric_unavailable(device)
    if why is None and store is None:
        why = "the group has no store to rendezvous through (built without tp_group)"
    if why is None and _SETUPS[0]:
        why = (
            "this process already drives a replica over symmetric memory, and torch counts its rendezvous "
            "per process, so a new replica's fresh ranks would wait forever; one 'symm' replica per process"
        )
    return why


class SymmetricAllReduce:
    """fp32 one-shot all-reduce of tensors of up to `max_numel` elements over two symmetric buffers, used in
    turn: a rank writes a buffer again only two all-reduces later, after the barrier of the one between,
    which its peers reach only once they have finished reading it. (A step makes an even number of them,
    two per layer, so a replayed graph keeps alternating.)"""

    def __init__(
        self, name: str, rank: int, size: int, store: Any, pg: Any, device: torch.device, max_numel: int
    ) -> None:
        os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")  # NVLink multicast stays off
        from torch.distributed import _symmetric_memory as symm_mem  # deferred: CUDA builds

        self.group = register_group(name, rank, size, store, pg, device)  # (kept: a weak registry's)
        self.bufs = [symm_mem.empty(max_numel, dtype=torch.float32, device=device) for _ in range(2)]
        for buf in self.bufs:
            symm_mem.rendezvous(buf, name)  # type: ignore[arg-type]  # (a collective, on every rank)
        self.name, self.max_numel, self.turn = name, max_numel, 0
        _SETUPS[0] += 1
        self.copy_reduce = getattr(torch.ops.symm_mem, "one_shot_all_reduce_copy", None)

    def fits(self, t: Tensor) -> bool:
        return t.numel() <= self.max_numel

    def __call__(self, t: Tensor) -> Tensor:
        """t (any float dtype) -> its sum over the ranks, fp32, a new tensor."""
        flat = t.float().contiguous().view(-1)
        buf = self.bufs[self.turn][: flat.numel()]
        self.turn ^= 1
        if self.copy_reduce is not None:  # the copy into the symmetric buffer inside the kernel
            out = self.copy_reduce(buf, flat, "sum", self.name)
        else:
            buf.copy_(flat)
            out = torch.ops.symm_mem.one_shot_all_reduce(buf, "sum", self.name)
        return out.view(t.shape)


def register_group(name: str, rank: int, size: int, store: Any, pg: Any, device: torch.device) -> Any:
    """Make the group known to symmetric memory under `name`: its rank, size and store (`set_group_info`),
    and a c10d ProcessGroup over the NCCL backend `pg` in c10d's registry (where a torch that resolves the
    group by name in C++ finds it, with the same store) -> that ProcessGroup: the registry holds it weakly,
    so the caller keeps it."""
    from torch._C._distributed_c10d import (  # deferred: distributed builds only
        ProcessGroup,
        _register_process_group,
        _SymmetricMemory,
    )

    group = ProcessGroup(store, rank, size)
    kind = ProcessGroup.BackendType.NCCL if device.type == "cuda" else ProcessGroup.BackendType.GLOO
    group._set_default_backend(kind)
    group._register_backend(device, kind, pg)
    group._set_group_name(name)  # type: ignore[arg-type]  # (a str: c10d's GroupName)
    _register_process_group(name, group)  # type: ignore[arg-type]
    if hasattr(_SymmetricMemory, "set_group_info"):
        _SymmetricMemory.set_group_info(name, rank, size, store)
    return group
