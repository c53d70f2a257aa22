"""GPU check of the `cuda_ipc` transport (skipped without CUDA): a trainer process hands a replica process on
the same GPU two versions of a set of weights, bucket by bucket, through CUDA IPC handles; the replica gets
exactly the tensors of each version. The CPU contract test (tests/unit/transport) cannot run this link."""

from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp

from ascent.cluster.base import find_free_port
from ascent.transport import select
from ascent.transport.weights import Rendezvous

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def weights(version: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(version)
    return {
        "embed.weight": torch.randn(300, 70, generator=g).cuda(),
        "norm.weight": torch.randn(33, generator=g).to(torch.bfloat16).cuda(),
        "ids": (torch.arange(7) + version).cuda(),
        "transposed": torch.randn(20, 9, generator=g).cuda().t(),  # not contiguous
    }


def side(rank: int, rv: Rendezvous, results) -> None:
    device = torch.device("cuda")
    if rank == 0:
        link = select.sender_link(rv, 0, device)
        for version in (1, 2):
            link.send(weights(version).items(), version)
        return
    link = select.receiver_link(rv, 0, device)
    for version in (1, 2):
        held: dict[str, torch.Tensor] = {}
        link.receive(lambda part, held=held: held.update({n: t.clone() for n, t in part}), version)
        want = weights(version)
        exact = held.keys() == want.keys() and all(torch.equal(held[n], t) for n, t in want.items())
        results.put((version, exact))


def test_cuda_ipc_hands_each_version_over_exactly():
    rv = Rendezvous("cuda_ipc", "127.0.0.1", find_free_port(), 1, 60.0, bucket_bytes=4096)  # several buckets
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=side, args=(rank, rv, results)) for rank in (0, 1)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0]
    assert sorted(results.get(timeout=5) for _ in range(2)) == [(1, True), (2, True)]
